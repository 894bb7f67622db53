"""Generation from audio with an audio-text LLM (issue 52): `hfexport export tiny:qwen2_audio -f F --generate`
then `hfexport generate OUT --audio clip.wav [--prompt TEXT]`, each in a fresh process, give eager
`model.generate(**processor(text=..., audio=...), do_sample=False)`'s greedy tokens on every format, the
processor being the one saved in the export; and every way it cannot run exits 2 naming the remedy.

The clips are generated: a tone and noise of the same length, which must give different tokens (so
the comparison holds the audio path: the preset's weights are drawn at std 0.1, at which the tiny
model's answer depends on the clip), and one drawn variation (clip length, sampling rate, prompt).
The test formats its prompt with the processor's own chat template, independently of
`audio_input.audio_prompt_text`.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from hfexport import GenerationRunner
from hfexport.cli.main import main
from hfexport.generation.audio_input import DEFAULT_AUDIO_PROMPT
from hfexport.presets import build_preset, tiny_processor

from .exports import cli_generation_exports

FORMATS = ["dynamo", "onnx", "openvino", "executorch"]
NEW_TOKENS = 10
RATE = 16000
_DRAW = np.random.default_rng(520)
#: the drawn variation: (seconds, sampling rate, prompt), drawn once; the tiny chunk is 1 s
DRAWN = (round(float(_DRAW.uniform(0.2, 0.95)), 3), int(_DRAW.choice([8000, 22050, 44100])),
         str(_DRAW.choice(["What do you hear?", "Describe this clip in a few words, please.", "hi"])))


def _tone(seconds: float = 0.6, rate: int = RATE, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _noise(seconds: float = 0.6, rate: int = RATE, seed: int = 0) -> np.ndarray:
    return (0.3 * np.random.default_rng(seed).standard_normal(int(seconds * rate))).astype(np.float32)


def _wav(path, samples: np.ndarray, rate: int = RATE):
    import soundfile

    soundfile.write(path, samples, rate, format="WAV")
    return path


@pytest.fixture(scope="module")
def qwen2_audio():
    """The preset's model (the weights `hfexport export tiny:qwen2_audio` exports: the same seed) and processor."""
    model, _ = build_preset("qwen2_audio")
    return model, tiny_processor("qwen2_audio")


def _processor_inputs(processor, samples: np.ndarray, prompt: str, rate: int = RATE) -> dict:
    """The processor's output for `samples` (resampled to its rate with scipy where `rate` differs) and
    one user turn (the clip, then `prompt`) in its chat template."""
    target = processor.feature_extractor.sampling_rate
    if rate != target:
        import math

        from scipy.signal import resample_poly

        common = math.gcd(rate, target)
        samples = resample_poly(samples, target // common, rate // common).astype(np.float32)
    messages = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": prompt}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return processor(text=[text], audio=[samples], sampling_rate=target, return_tensors="pt")


def _eager(qwen2_audio, samples: np.ndarray, prompt: str = DEFAULT_AUDIO_PROMPT,
           rate: int = RATE) -> tuple[list[int], list[torch.Tensor]]:
    """Eager `generate`'s greedy new tokens (no early stop) and each step's logits."""
    model, processor = qwen2_audio
    inputs = _processor_inputs(processor, samples, prompt, rate)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                             return_dict_in_generate=True, output_logits=True)
    return out.sequences[0, inputs["input_ids"].shape[1]:].tolist(), [step.float() for step in out.logits]


def _hfexport(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hfexport", *args], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def audio_llm_export(shared_folder):
    """`audio_llm_export(fmt)`: `hfexport export tiny:qwen2_audio -f fmt --generate -o OUT` in a new
    process, made once per test run (`shared_folder`)."""
    return cli_generation_exports(shared_folder, "qwen2_audio", "audio-llm")


def _generated(*args: str) -> dict:
    done = _hfexport("generate", *args, "--max-new-tokens", str(NEW_TOKENS), "--min-new-tokens", str(NEW_TOKENS),
                     "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_generate_from_an_audio_file_equals_generate(audio_llm_export, qwen2_audio, fmt, tmp_path):
    """The user's path: a tone and noise as WAV files, the default prompt, `hfexport generate --audio` in a
    new process; then the drawn clip and prompt through the runner's API, its logits step by step."""
    folder = audio_llm_export(fmt)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert {"processor_config.json", "tokenizer.json", "chat_template.jinja"} <= set(manifest["files"])
    # ExecuTorch's folder also holds MultimodalRunner's program (tests/backends/executorch/test_multimodal_audio.py)
    assert {"audio_encoder", "multi_modal_projector", "text_embeddings", "language_model", "lm_head",
            "decode", *(["multimodal"] if fmt == "executorch" else [])} == set(manifest["components"])
    assert [i["name"] for i in manifest["components"]["audio_encoder"]["inputs"]] == ["input_features",
                                                                                      "feature_attention_mask"]
    heard = {}
    for name, samples in (("tone", _tone()), ("noise", _noise())):
        printed = _generated(str(folder), "--audio", str(_wav(tmp_path / f"{name}.wav", samples)))
        tokens, _ = _eager(qwen2_audio, samples)
        assert printed["format"] == fmt and printed["tokens"] == tokens, name
        assert printed["text"] == qwen2_audio[1].tokenizer.decode(tokens, skip_special_tokens=True)
        heard[name] = tokens
    assert heard["tone"] != heard["noise"]  # the audio matters

    seconds, rate, prompt = DRAWN
    samples = _noise(seconds, rate, seed=3) + _tone(seconds, rate, hz=880)
    result = GenerationRunner.load(folder).generate_from_audio(samples, NEW_TOKENS, prompt=prompt, sampling_rate=rate,
                                                               min_new_tokens=NEW_TOKENS, output_logits=True)
    tokens, logits = _eager(qwen2_audio, samples, prompt, rate)
    assert result.tokens == tokens, DRAWN
    for got, expected in zip(result.logits, logits, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_exported_audio_encoder_masks_every_clip_length(audio_llm_export, qwen2_audio, fmt):
    """The audio encoder at every count of frames heard, 1 to the whole chunk, against the eager tower
    behind the same front (OpenVINO 2026.4.1 rounded an int64 `(n + 1) // 2` half to even: a mask built
    with it was one position too long for 8 of the 32 counts; the front uses no division). No clip has
    0 frames (an empty file is refused): with every position masked attention has no key to read, and
    ONNX Runtime's answer is not eager's."""
    from hfexport.generation.decompose import decompose_for_generation

    runner = GenerationRunner.load(audio_llm_export(fmt), engine="hfexport")
    front = decompose_for_generation(qwen2_audio[0], build_preset("qwen2_audio")[1],
                                     runner_components=True)["audio_encoder"].module
    features = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(11))
    for heard in range(1, 33):
        mask = (torch.arange(32) < heard).int()[None]  # the processor's dtype, which the export takes
        got = runner.runners["audio_encoder"].run_named({"input_features": features,
                                                         "feature_attention_mask": mask})["last_hidden_state"]
        with torch.no_grad():
            want = front(input_features=features, feature_attention_mask=mask).last_hidden_state
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=f"{heard} frames heard")


@pytest.mark.slow
def test_a_prompt_goes_with_the_clip(audio_llm_export, qwen2_audio, tmp_path):
    """`--audio` with `--prompt`: the question is the user's, the chat template the processor's."""
    clip = _wav(tmp_path / "tone.wav", _tone(0.4, hz=660))
    printed = _generated(str(audio_llm_export("dynamo")), "--audio", str(clip), "--prompt", DRAWN[2])
    assert printed["tokens"] == _eager(qwen2_audio, _tone(0.4, hz=660), DRAWN[2])[0]


@pytest.mark.slow
def test_audio_inputs_take_the_processors_arrays(audio_llm_export, qwen2_audio, tmp_path):
    """`--audio-inputs FILE.npz`: the processor's whole output (its input_ids too), or its arrays with
    `--prompt-ids`; no soundfile or saved processor needed."""
    folder = str(audio_llm_export("dynamo"))
    samples = _noise(0.8, seed=5)
    inputs = _processor_inputs(qwen2_audio[1], samples, "What do you hear?")
    want = _eager(qwen2_audio, samples, "What do you hear?")[0]
    np.savez(tmp_path / "all.npz", **{name: value.numpy() for name, value in inputs.items()})
    assert _generated(folder, "--audio-inputs", str(tmp_path / "all.npz"))["tokens"] == want
    np.savez(tmp_path / "audio.npz", input_features=inputs["input_features"].numpy(),
             feature_attention_mask=inputs["feature_attention_mask"].numpy())
    ids = ",".join(map(str, inputs["input_ids"][0].tolist()))
    assert _generated(folder, "--audio-inputs", str(tmp_path / "audio.npz"), "--prompt-ids", ids)["tokens"] == want


# -- refusals on an export: exit 2, naming the remedy ---------------------------------------------------


@pytest.mark.slow
def test_a_prompt_whose_audio_tokens_do_not_match_the_clip_exits_2(audio_llm_export, qwen2_audio, tmp_path, capsys):
    """As eager refuses it ("Audio features and audio tokens do not match"): one audio token short."""
    inputs = _processor_inputs(qwen2_audio[1], _tone(0.5), "hi")
    ids = inputs["input_ids"][0].tolist()
    ids.remove(qwen2_audio[0].config.audio_token_id)
    np.savez(tmp_path / "audio.npz", input_features=inputs["input_features"].numpy(),
             feature_attention_mask=inputs["feature_attention_mask"].numpy())
    assert main(["generate", str(audio_llm_export("dynamo")), "--audio-inputs", str(tmp_path / "audio.npz"),
                 "--prompt-ids", ",".join(map(str, ids))]) == 2
    err = capsys.readouterr().err
    assert f"the prompt has {ids.count(120)} audio tokens but the clip gives {ids.count(120) + 1} rows" in err


@pytest.mark.slow
def test_audio_inputs_without_a_prompt_exit_2(audio_llm_export, tmp_path, capsys):
    np.savez(tmp_path / "audio.npz", input_features=np.zeros((1, 8, 32), dtype=np.float32))
    assert main(["generate", str(audio_llm_export("dynamo")), "--audio-inputs", str(tmp_path / "audio.npz")]) == 2
    assert "holds no input_ids: pass the prompt's ids" in capsys.readouterr().err


@pytest.mark.slow
def test_audio_longer_than_the_chunk_exits_2(audio_llm_export, tmp_path, capsys):
    clip = _wav(tmp_path / "long.wav", _tone(1.5))
    assert main(["generate", str(audio_llm_export("dynamo")), "--audio", str(clip), "--prompt", "hi"]) == 2
    assert "is 1.50 s long" in capsys.readouterr().err


@pytest.mark.slow
def test_audio_on_a_text_only_export_exits_2(saved_generation, tmp_path, capsys):
    pytest.importorskip("soundfile")
    clip = _wav(tmp_path / "tone.wav", _tone())
    assert main(["generate", str(saved_generation("dynamo", "llama").directory), "--audio", str(clip),
                 "--prompt", "hi"]) == 2
    assert "is not one: drop --audio" in capsys.readouterr().err


# -- the fast tier: the preset, the decomposition, refusals before any export is opened ----------------


def test_the_presets_answer_depends_on_the_clip(qwen2_audio):
    """At std 0.1 a tone and noise give different tokens; at transformers' default 0.02 the tiny model
    answers both alike, which is why the preset draws its weights wider."""
    assert _eager(qwen2_audio, _tone())[0] != _eager(qwen2_audio, _noise())[0]
    narrow = build_preset("qwen2_audio", initializer_range=0.02,
                          audio_config=dict(d_model=32, encoder_layers=2, encoder_attention_heads=4,
                                            encoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16,
                                            init_std=0.02),
                          text_config=dict(vocab_size=128, hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                           max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
                                           pad_token_id=0, initializer_range=0.02))[0]
    narrow_model = (narrow, qwen2_audio[1])
    assert _eager(narrow_model, _tone())[0] == _eager(narrow_model, _noise())[0]


@pytest.mark.parametrize("heard", [int(n) for n in np.random.default_rng(7).integers(1, 32, 3)] + [32])
def test_the_audio_encoder_takes_the_processors_mask(qwen2_audio, heard):
    """The exported audio encoder is the tower behind a front taking `feature_attention_mask`: for a
    drawn number of frames heard (and a clip filling the chunk), its rows are those the tower gives
    inside eager `model(...)` (which builds the tower's mask itself), and the decode takes no audio."""
    from hfexport.generation.audio_tower import AudioTowerFront
    from hfexport.generation.decompose import decompose_for_generation
    from hfexport.presets import qwen2_audio_tokens

    model, _ = qwen2_audio
    _, sample = build_preset("qwen2_audio")
    components = decompose_for_generation(model, sample, runner_components=True)
    front, kwargs = components["audio_encoder"]
    assert isinstance(front, AudioTowerFront) and list(kwargs) == ["input_features", "feature_attention_mask"]
    assert "feature_attention_mask" not in components["decode"].kwargs
    features = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(heard))
    mask = (torch.arange(32) < heard).int()[None]
    ids = torch.cat([torch.tensor([[1, 121]]), torch.full((1, qwen2_audio_tokens(heard)), 120),
                     torch.tensor([[122, 7]])], dim=1)
    seen = []
    handle = front.tower.register_forward_hook(lambda _m, _a, out: seen.append(out.last_hidden_state))
    try:
        with torch.no_grad():
            model(input_ids=ids, input_features=features, feature_attention_mask=mask)
            got = front(input_features=features, feature_attention_mask=mask).last_hidden_state
    finally:
        handle.remove()
    torch.testing.assert_close(got, seen[0], atol=0, rtol=0)


def test_a_capture_clip_filling_the_chunk_is_refused_for_a_folder(qwen2_audio):
    """It shows no masking to reproduce: an export folder's decomposition refuses it with the remedy;
    the seed's call (`runner_components=False`) keeps the tower as `generate` called it."""
    from hfexport.errors import PrepareError
    from hfexport.generation.decompose import decompose_for_generation
    from hfexport.presets import qwen2_audio_tokens

    model, _ = qwen2_audio
    ids = torch.cat([torch.tensor([[1, 121]]), torch.full((1, qwen2_audio_tokens(32)), 120),
                     torch.tensor([[122, 7]])], dim=1)
    full = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "input_features": torch.randn(1, 8, 32),
            "feature_attention_mask": torch.ones(1, 32, dtype=torch.int32)}
    with pytest.raises(PrepareError, match="fills the feature extractor's chunk") as error:
        decompose_for_generation(model, full, runner_components=True)
    assert "shorter than the chunk" in str(error.value)
    assert decompose_for_generation(model, full)["audio_encoder"].module is model.get_encoder(modality="audio")


@pytest.mark.parametrize("args", [["--audio", "clip.wav", "--prompt-ids", "1,2"],
                                  ["--audio", "clip.wav", "--chat", "hi"],
                                  ["--audio-inputs", "a.npz", "--prompt", "hi"]])
def test_audio_and_the_wrong_prompt_option_exit_2(tmp_path, capsys, args):
    """Refused before the export is opened (the folder need not exist): `--audio` takes `--prompt`,
    `--audio-inputs` takes `--prompt-ids`."""
    assert main(["generate", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert f"goes without {args[2]}: drop {args[2]}" in err
