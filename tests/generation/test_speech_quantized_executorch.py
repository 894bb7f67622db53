"""Quantized ExecuTorch exports of Whisper (issue 52): `hfexport export tiny:whisper -f executorch
--quantize int8-dynamic|int8-dynamic-int4-weights -o OUT` converts (the encoder's frames stay fixed
as in the fp32 program: `tests/backends/executorch/test_quantized_capture.py`), passes the speech
accuracy gate and writes the folder; `hfexport generate OUT --audio clip.wav` in a fresh process
gives the tokens of hfexport's runner on the folder, each the token eager fp32 picks after the same
tokens, on at least the gate's floor. The 8da4w case is a drawn Whisper of other sizes than the
preset's (saved with the preset's processor and exported from its folder): one ExecuTorch export of
each scheme (95 and 196 s on a 2-core machine).

How the tokens are compared: a random 32-wide Whisper's logits are nearly flat (on the drawn clips
eager's best two tokens lie 0.005-0.08 apart, the logits' spread 0.55), so a quantized program
flips near ties and, free-running, goes on from another token. Each printed token is therefore
judged against eager's greedy pick after the export's own tokens before it (eager's suppress
lists applied; the helper reproduces eager `generate()`'s tokens from its own, checked each time).
Position by position against eager's free-running tokens, int8-dynamic agreed on 0.83-1.0 of 12
tokens over six drawn clips, and is held to its floor that way too; 8da4w on 0.0-0.5: its first step
flips eager's top token on four of the six (torchao's own 8da4w in eager, every linear int4, does
the same on the same clip: eager's 21 at 1.085, 8da4w's 33/38/21 at 1.080/1.078/1.062), while its
tokens are eager's pick after its own on 0.83-0.92.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hfexport.generation.accuracy import quantized_criteria
from hfexport.presets import build_preset, tiny_processor
from tests.harness import require_backend, whisper_variation

NEW_TOKENS = 12
SCHEMES = ("int8-dynamic", "int8-dynamic-int4-weights")
#: the scheme whose folder is exported from the drawn Whisper
DRAWN = "int8-dynamic-int4-weights"
_DRAW = random.Random(5253)
#: the clip of the fresh-process checks: seconds under the preset's 1 s chunk, a tone's Hz
CLIP = (round(_DRAW.uniform(0.3, 0.9), 3), _DRAW.randint(150, 3000))
#: a Whisper of other sizes than the preset's, drawn once (the preset's processor: its 8 mel bins)
VARIATION = whisper_variation(_DRAW, mel_bins=False)


def _clip(path: Path, seconds: float, hz: int, rate: int = 16000) -> Path:
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(7).standard_normal(t.shape)
    soundfile.write(path, (0.5 * np.sin(2 * np.pi * hz * t) + 0.05 * noise).astype(np.float32), rate)
    return path


def _features(processor, clip: Path) -> torch.Tensor:
    import soundfile

    samples, rate = soundfile.read(clip, dtype="float32")
    return processor.feature_extractor(samples, sampling_rate=rate, return_tensors="pt")["input_features"]


def _eager(model, features: torch.Tensor) -> tuple[list[int], list[int]]:
    """Eager `generate()`'s prompt (start, language, task tokens) and its new tokens (as
    `harness.eager_transcription`, which gives the new tokens only)."""
    with torch.no_grad():
        out = model.generate(input_features=features, max_new_tokens=NEW_TOKENS, do_sample=False,
                             return_dict_in_generate=True, output_logits=True)
    start = out.sequences.shape[1] - len(out.logits)
    return out.sequences[0, :start].tolist(), out.sequences[0, start:].tolist()


def _eager_picks(model, features: torch.Tensor, prompt: list[int], tokens: list[int]) -> list[int]:
    """Eager's greedy token at each step after `prompt + tokens[:step]`: one forward, the generation
    config's suppress lists applied (`begin_suppress_tokens` at the first step), as `generate()` does."""
    ids = torch.tensor([prompt + tokens[:-1]])
    with torch.no_grad():
        logits = model(input_features=features, decoder_input_ids=ids).logits[0, len(prompt) - 1:].clone()
    config = model.generation_config
    logits[:, list(config.suppress_tokens or [])] = -float("inf")
    logits[0, list(config.begin_suppress_tokens or [])] = -float("inf")
    return logits.argmax(-1).tolist()


def _agreements(model, processor, clip: Path, tokens: list[int]) -> tuple[float, float]:
    """`(each token eager's pick after the ones before it, position by position against eager's free run)`."""
    features = _features(processor, clip)
    prompt, eager = _eager(model, features)
    assert _eager_picks(model, features, prompt, eager) == eager  # the helper is eager generate()'s rule
    on_own = sum(a == b for a, b in zip(tokens, _eager_picks(model, features, prompt, tokens))) / len(tokens)
    return on_own, sum(a == b for a, b in zip(tokens, eager)) / len(eager)


def _hfexport(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hfexport", *args], capture_output=True, text=True, timeout=900)


def _eager_model(scheme: str):
    """The fp32 model `scheme`'s folder was exported from: the preset, or for 8da4w the drawn Whisper."""
    return build_preset("whisper", 3, **VARIATION)[0] if scheme == DRAWN else build_preset("whisper")[0]


@pytest.fixture(scope="module", params=SCHEMES)
def package(request, shared_folder) -> tuple[str, Path, str]:
    """`hfexport export MODEL -f executorch --quantize SCHEME -o OUT` in a new process, made once:
    the scheme, the folder and what the command printed. MODEL: `tiny:whisper`, or for 8da4w a folder
    holding the drawn Whisper (`VARIATION`) and the preset's processor."""
    require_backend("executorch")
    pytest.importorskip("torchao")
    pytest.importorskip("soundfile")
    scheme = request.param

    def write(folder: Path) -> None:
        source = "tiny:whisper"
        if scheme == DRAWN:
            source = str(folder / "drawn-whisper")
            _eager_model(scheme).save_pretrained(source)
            tiny_processor("whisper").save_pretrained(source)
        done = _hfexport("export", source, "-f", "executorch", "--quantize", scheme, "-o", str(folder / "export"))
        assert done.returncode == 0, done.stderr[-3000:]
        (folder / "stdout.txt").write_text(done.stdout)

    folder = shared_folder(f"whisper-executorch-{scheme}", write)
    return scheme, folder / "export", (folder / "stdout.txt").read_text()


@pytest.mark.slow
def test_the_quantized_export_converts_and_passes_the_speech_gate(package):
    scheme, folder, printed = package
    manifest = json.loads((folder / "manifest.json").read_text())
    assert list(manifest["components"]) == ["encoder", "prefill", "decode"]
    (encoder_input,) = manifest["components"]["encoder"]["inputs"]
    assert encoder_input["shape"][1:] == [8, 32], encoder_input  # the frames fixed, as the fp32 program has them
    report = json.loads((folder / "report.json").read_text())
    accuracy = report["accuracy"]
    floor = quantized_criteria(scheme).min_agreement
    assert accuracy["passed"] and accuracy["clips"] == 2 and accuracy["min_agreement"] == floor, accuracy
    assert accuracy["agreement"] >= floor, accuracy  # measured 0.98 (int8-dynamic), 0.97 (8da4w) of 60 steps
    assert "over 2 clips" in printed and "result: PASSED" in printed
    assert report["quantize"] == scheme
    for name in ("encoder", "prefill", "decode"):
        quantization = report["components"][name]["record"]["quantization"]
        assert quantization["delegated_quantized_matmuls"] > 0, (name, quantization)


@pytest.mark.slow
def test_hfexport_generate_audio_in_a_fresh_process_agrees_with_eager(package, tmp_path):
    from hfexport import GenerationRunner

    scheme, folder, _ = package
    clip = _clip(tmp_path / "clip.wav", *CLIP)
    done = _hfexport("generate", str(folder), "--audio", str(clip), "--max-new-tokens", str(NEW_TOKENS), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    tokens = json.loads(done.stdout.strip().splitlines()[-1])["tokens"]
    runner = GenerationRunner.load(folder, engine="hfexport")
    assert tokens == list(runner.generate_from_audio(str(clip), max_new_tokens=NEW_TOKENS).tokens)
    on_own, positional = _agreements(_eager_model(scheme), tiny_processor("whisper"), clip, tokens)
    floor = quantized_criteria(scheme).min_agreement
    assert on_own >= floor, (scheme, tokens, on_own, positional)
    if scheme == "int8-dynamic":  # 8da4w flips near ties and goes on from another token (module docstring)
        assert positional >= floor, (tokens, positional)
