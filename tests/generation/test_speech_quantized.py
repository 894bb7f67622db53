"""Quantized speech exports (issue 52): a quantized Whisper export is held by the export job's
accuracy gate on two clips made offline, the sample clip and a held-out one
(`generation.accuracy.greedy_agreement`: their teacher-forced steps pooled, the export's own
free-running transcripts' token error rate reported), written when it passes and refused, nothing
written, when it does not; OpenVINO GenAI's `WhisperPipeline` opens the quantized flagless folder
and agrees with hfexport's runner on it (the runner check), and `hfexport generate --audio` in a
fresh process gives the tokens hfexport's runner gives and agrees with eager `generate()`.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hfexport.cli.main import main
from hfexport.generation.accuracy import INT4_CRITERIA, INT8_CRITERIA, edit_distance
from hfexport.presets import build_preset, tiny_processor
from tests.harness import eager_transcription, require_backend, whisper_variation

NEW_TOKENS = 12
_DRAW = random.Random(5252)
#: a Whisper of other sizes than the preset's, drawn once
VARIATION = whisper_variation(_DRAW, mel_bins=False)
#: the drawn clip of the fresh-process check: seconds under the preset's 1 s chunk, a tone's Hz
CLIP = (round(_DRAW.uniform(0.3, 0.9), 3), _DRAW.randint(150, 3000))


def _clip(path: Path, seconds: float, hz: int, rate: int = 16000) -> Path:
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(7).standard_normal(t.shape)
    soundfile.write(path, (0.5 * np.sin(2 * np.pi * hz * t) + 0.05 * noise).astype(np.float32), rate)
    return path


def _export(capsys, *args: str) -> tuple[int, str]:
    code = main(["export", *args])
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def openvino_int8(shared_folder) -> tuple[Path, str]:
    """`hfexport export tiny:whisper -f openvino --quantize int8-weights -o OUT` (no task flag: WhisperPipeline's
    folder), made once; the folder and what the command printed."""
    require_backend("openvino")
    pytest.importorskip("openvino_genai")
    pytest.importorskip("soundfile")

    def write(folder: Path) -> None:
        done = subprocess.run([sys.executable, "-m", "hfexport", "export", "tiny:whisper", "-f", "openvino",
                               "--quantize", "int8-weights", "-o", str(folder / "export")],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        (folder / "stdout.txt").write_text(done.stdout)

    folder = shared_folder("whisper-openvino-int8-weights", write)
    return folder / "export", (folder / "stdout.txt").read_text()


@pytest.mark.slow
def test_a_quantized_whisper_passes_the_speech_gate_and_whisper_pipeline_agrees(openvino_int8):
    folder, printed = openvino_int8
    report = json.loads((folder / "report.json").read_text())
    accuracy = report["accuracy"]
    positions = 30  # the preset's 32 decoder positions after its 2-token English prompt, on each clip
    assert accuracy["clips"] == 2 and accuracy["tokens"] == 2 * positions, accuracy
    assert accuracy["passed"] and accuracy["min_agreement"] == INT8_CRITERIA.min_agreement
    assert accuracy["agreement"] >= 0.9 and accuracy["mean_cosine"] >= 0.999, accuracy  # measured 0.98, 0.9999
    assert 0 <= accuracy["token_error_rate"] <= 0.2, accuracy  # measured 0.0-0.17 (int4: 0.17)
    assert "over 2 clips" in printed and "token error rate" in printed
    runner = report["runner"]  # WhisperPipeline on the quantized folder, against hfexport's runner on it
    assert runner["checked"] and "WhisperPipeline" in runner["runner"], runner
    assert runner["against"] == "hfexport's runner on the same folder" and runner["agreement"] >= 0.7, runner
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["runtime_package"]["ready"], manifest["runtime_package"]
    assert report["quantize"] == "int8-weights"
    for name in ("encoder", "prefill", "decode", "whisper_decoder"):  # every graph's weights, the encoder's too
        assert report["components"][name]["record"]["quantization"]["low_precision_constants"] > 0, name


@pytest.mark.slow
def test_hfexport_generate_audio_on_the_quantized_folder_in_a_fresh_process(openvino_int8, tmp_path):
    """The tokens a user gets are hfexport's runner's on the folder, and they agree with eager fp32's."""
    from hfexport import GenerationRunner

    folder, _ = openvino_int8
    clip = _clip(tmp_path / "clip.wav", *CLIP)
    done = subprocess.run([sys.executable, "-m", "hfexport", "generate", str(folder), "--audio", str(clip),
                           "--max-new-tokens", str(NEW_TOKENS), "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    runner = GenerationRunner.load(folder, engine="hfexport")
    assert printed["tokens"] == list(runner.generate_from_audio(str(clip), max_new_tokens=NEW_TOKENS).tokens)
    model, _ = build_preset("whisper")
    eager = eager_transcription(model, tiny_processor("whisper"), clip, NEW_TOKENS)
    agree = sum(a == b for a, b in zip(printed["tokens"], eager)) / len(eager)
    assert agree >= INT8_CRITERIA.min_agreement, (printed["tokens"], eager)


@pytest.mark.slow
def test_the_gate_without_a_feature_extractor_compares_the_sample_features(openvino_int8):
    """An export whose model came without a processor has no clip to make: the gate compares on its
    sample's features alone (one clip's steps)."""
    from hfexport.generation.accuracy import greedy_agreement

    folder, _ = openvino_int8
    model, inputs = build_preset("whisper")
    found = greedy_agreement(folder, model, inputs, verify=False)
    both = greedy_agreement(folder, model, inputs, verify=False, extractor=tiny_processor("whisper").feature_extractor)
    assert found.clips == 1 and found.tokens == 30 and both.clips == 2 and both.tokens == 60
    assert found.agreement >= INT8_CRITERIA.min_agreement and found.token_error_rate is not None


@pytest.mark.slow
def test_a_drawn_whisper_quantized_for_onnx_passes_the_gate_through_the_cli(tmp_path, capsys):
    """Other sizes than the preset's, from a model folder with its processor, through the CLI, in
    ONNX's scheme furthest from fp32."""
    require_backend("onnx")
    model, _ = build_preset("whisper", 3, **VARIATION)
    model.save_pretrained(tmp_path / "model")
    tiny_processor("whisper").save_pretrained(tmp_path / "model")
    code, printed = _export(capsys, str(tmp_path / "model"), "-f", "onnx", "--quantize", "int4-weights",
                            "-o", str(tmp_path / "out"))
    assert code == 0, printed
    accuracy = json.loads((tmp_path / "out" / "report.json").read_text())["accuracy"]
    floor = INT4_CRITERIA.min_agreement
    assert accuracy["clips"] == 2 and accuracy["passed"] and accuracy["agreement"] >= floor, (VARIATION, accuracy)


@pytest.fixture(scope="module")
def broken_quantizer():
    """`bench/quant_criteria.py`'s ONNX Runtime int4 quantizer with spoiled scales."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from quant_criteria import broken_quantizer

    return broken_quantizer


@pytest.mark.slow
def test_a_broken_int4_quantizer_is_refused_on_speech_and_nothing_is_written(broken_quantizer, tmp_path):
    """Each block's scale taken from its neighbour: the gate refuses it on the clips' steps."""
    from hfexport import OnnxConfig
    from hfexport.errors import ValidationError
    from hfexport.job import GenerationOptions, export_to_folder
    from hfexport.loading import LoadedModel

    require_backend("onnx")
    model, inputs = build_preset("whisper")
    inputs = {name: value for name, value in inputs.items() if not name.startswith("decoder_")}
    processor = tiny_processor("whisper")
    loaded = LoadedModel(model, inputs, "tiny whisper", processor.tokenizer, processor=processor)
    with pytest.raises(ValidationError, match="agree with fp32 eager") as caught:
        export_to_folder(loaded, OnnxConfig(dynamic=True), tmp_path / "q", generation=GenerationOptions(task="auto"),
                         quantize=broken_quantizer("wrong-group"))
    assert caught.value.accuracy.clips == 2 and caught.value.accuracy.agreement < INT4_CRITERIA.min_agreement
    assert not list(tmp_path.iterdir())


def test_the_held_out_clip_is_another_clip_than_the_sample():
    from hfexport.generation.audio_input import held_out_clip, sample_clip

    extractor = tiny_processor("whisper").feature_extractor
    sample, held_out = sample_clip(extractor), held_out_clip(extractor)
    assert held_out.dtype == np.float32 and len(held_out) != len(sample)
    assert len(held_out) <= extractor.n_samples and np.abs(held_out).max() < 1
    assert np.array_equal(held_out, held_out_clip(extractor))  # made the same each time


@pytest.mark.parametrize(("want", "got", "distance"), [
    ([], [], 0), ([1, 2, 3], [1, 2, 3], 0), ([1, 2, 3], [], 3), ([], [4, 5], 2), ([1, 2, 3], [1, 3], 1),
    ([1, 2, 3], [1, 9, 3], 1), ([1, 2, 3], [3, 2, 1], 2), (list("kitten"), list("sitting"), 3),
])
def test_edit_distance(want, got, distance):
    assert edit_distance(want, got) == distance == edit_distance(got, want)
