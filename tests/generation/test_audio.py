"""Generation from an audio file (issue 52, first slice): `hfexport export tiny:whisper -f F --generate`
then `hfexport generate OUT --audio clip.wav`, each in a fresh process, give eager
`model.generate(input_features=...)`'s greedy tokens on the features the same feature extractor makes
of the same clip (mixed to mono, resampled), on every format; and every way it cannot run exits 2
naming the remedy.

The clips are a tone with noise, drawn once: a mono 16 kHz WAV and a stereo 44.1 kHz FLAC of two
lengths under the tiny preset's 1 s chunk. The preset's generation config is an English-only
Whisper's (`<|notimestamps|>` in the decoder prompt, suppressed symbols and a suppressed first space
and end token), and the fast tier checks that the suppression changes the tokens of these clips, so
the comparison holds it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from hfexport import GenerationRunner
from hfexport.cli.main import main
from hfexport.errors import PrepareError
from hfexport.presets import build_preset, tiny_processor
from tests.harness import require_backend

from .exports import SPEECH_PACKAGE, cli_generation_exports

FORMATS = ["dynamo", "onnx", "openvino", "executorch"]
NEW_TOKENS = 12
_DRAW = np.random.default_rng(52)
#: (seconds, sampling rate, channels, tone in Hz, file format), drawn once
CLIPS = [(round(float(_DRAW.uniform(0.25, 0.6)), 3), 16000, 1, round(float(_DRAW.uniform(200, 2000))), "WAV"),
         (round(float(_DRAW.uniform(0.6, 0.95)), 3), 44100, 2, round(float(_DRAW.uniform(200, 2000))), "FLAC")]


def _write_clip(path, seconds: float, rate: int, channels: int, tone: float, fmt: str, seed: int = 0):
    """A tone with noise of `seconds` at `rate` Hz, its second channel quieter, written by soundfile."""
    import soundfile

    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    left = 0.5 * np.sin(2 * np.pi * tone * t) + 0.05 * rng.standard_normal(t.shape)
    right = 0.2 * np.sin(2 * np.pi * 1.5 * tone * t) + 0.05 * rng.standard_normal(t.shape)
    soundfile.write(path, np.stack([left, right], axis=1)[:, :channels].astype(np.float32), rate, format=fmt)
    return path


def _features(processor, path) -> torch.Tensor:
    """What the test makes of a clip, independently of `audio_input`: soundfile, the mean of the
    channels, scipy's `resample_poly` to the extractor's rate, the extractor."""
    import soundfile
    from scipy.signal import resample_poly

    samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
    mono = samples.mean(axis=1)
    target = processor.feature_extractor.sampling_rate
    if rate != target:
        common = math.gcd(rate, target)
        mono = resample_poly(mono, target // common, rate // common)
    return processor.feature_extractor(mono.astype(np.float32), sampling_rate=target,
                                       return_tensors="pt")["input_features"]


@pytest.fixture(scope="module")
def whisper():
    """The preset's model (the weights `hfexport export tiny:whisper` exports: the same seed) and processor."""
    model, _ = build_preset("whisper")
    return model, tiny_processor("whisper")


def _eager(whisper, features: torch.Tensor, **options) -> tuple[list[int], list[torch.Tensor]]:
    """Eager `generate`'s greedy new tokens on `features` (the decoder prompt left out) and each step's logits."""
    model, _ = whisper
    with torch.no_grad():
        out = model.generate(input_features=features, max_new_tokens=NEW_TOKENS, do_sample=False,
                             return_dict_in_generate=True, output_logits=True, **options)
    return out.sequences[0, -len(out.logits):].tolist(), [step.float() for step in out.logits]


def _hfexport(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hfexport", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def speech_export(shared_folder):
    """`speech_export(fmt)`: `hfexport export tiny:whisper -f fmt -o OUT` in a new process, the flagless
    export (the speech package: the components `--generate` writes, and on OpenVINO the models
    WhisperPipeline opens beside them), made once per test run and read by
    tests/backends/openvino/test_whisper.py too (`shared_folder`)."""
    return cli_generation_exports(shared_folder, "whisper", SPEECH_PACKAGE, generate=False)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_generate_from_an_audio_file_equals_generate(speech_export, whisper, fmt, tmp_path):
    """The user's path: a WAV, the feature extractor and tokenizer saved in the folder, `hfexport
    generate --audio` in a new process; then the stereo 44.1 kHz FLAC through the runner's API, its
    logits step by step."""
    folder = speech_export(fmt)
    processor = whisper[1]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert {"processor_config.json", "tokenizer.json", "generation_config.json"} <= set(manifest["files"])
    # OpenVINO's speech folder also holds the decoder WhisperPipeline opens (tests/backends/openvino/test_whisper.py)
    assert list(manifest["components"]) == ["encoder", "prefill", "decode",
                                            *(["whisper_decoder"] if fmt == "openvino" else [])]
    wav = _write_clip(tmp_path / "tone.wav", *CLIPS[0])
    done = _hfexport("generate", str(folder), "--audio", str(wav), "--max-new-tokens", str(NEW_TOKENS), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    tokens, _ = _eager(whisper, _features(processor, wav))
    assert printed["format"] == fmt and printed["tokens"] == tokens
    assert printed["text"] == processor.tokenizer.decode(tokens, skip_special_tokens=True)

    flac = _write_clip(tmp_path / "stereo.flac", *CLIPS[1], seed=1)
    result = GenerationRunner.load(folder).generate_from_audio(flac, max_new_tokens=NEW_TOKENS, output_logits=True)
    tokens, logits = _eager(whisper, _features(processor, flac))
    assert result.tokens == tokens
    for got, expected in zip(result.logits, logits, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "runner"), [("onnx", "onnxruntime-genai"), ("executorch", "MultimodalRunner")])
def test_the_flagless_export_is_the_components_where_the_runtimes_runner_cannot_open_it(speech_export, whisper, fmt,
                                                                                      runner, tmp_path):
    """No task flag (`speech_export`): `--task auto` picks `automatic-speech-recognition`, which writes
    the components (OpenVINO's WhisperPipeline folder: tests/backends/openvino/test_whisper.py;
    onnxruntime-genai's Whisper folder of an encoder of og's 3000 frames:
    tests/backends/onnx/test_whisper.py); the manifest says why the runtime's runner does not open
    them (og: `tiny:whisper`'s encoder takes 32 frames; ExecuTorch's: executorch 1.4.1's Python
    package has no runner for an encoder-decoder's speech), and `hfexport generate --audio` gives
    eager's tokens on another clip than the other tests'."""
    folder = speech_export(fmt)
    manifest = json.loads((folder / "manifest.json").read_text())
    report = json.loads((folder / "report.json").read_text())
    assert report["task"]["name"] == "automatic-speech-recognition"
    assert list(manifest["components"]) == ["encoder", "prefill", "decode"]
    entry = manifest["runtime_package"]
    assert entry["runner"] == runner and not entry["ready"] and entry["why"] == report["runner"]["why"], entry
    if fmt == "onnx":  # og 0.18's src/models/whisper.h: `int num_frames_{3000}`
        assert "`int num_frames_{3000}`" in entry["why"] and "= 32" in entry["why"], entry
    if fmt == "executorch":
        assert "Seq2SeqRunner" in entry["why"] and "C++ only" in entry["why"], entry
    wav = _write_clip(tmp_path / "tone.wav", *CLIPS[0], seed=4)
    done = _hfexport("generate", str(folder), "--audio", str(wav), "--max-new-tokens", str(NEW_TOKENS), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["tokens"] == _eager(whisper, _features(whisper[1], wav))[0]


@pytest.mark.slow
def test_generate_on_a_speech_model_writes_the_flagless_exports_components(speech_export, tmp_path):
    """`--generate` keeps its meaning on a speech model: the generation components, the programs the
    flagless export writes (the same names, inputs and outputs), here on the format the other tests
    read the flagless folder of."""
    flagless = json.loads((speech_export("dynamo") / "manifest.json").read_text())["components"]
    done = _hfexport("export", "tiny:whisper", "-f", "dynamo", "--generate", "-o", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-3000:]
    components = json.loads((tmp_path / "out" / "manifest.json").read_text())["components"]
    assert list(components) == list(flagless) == ["encoder", "prefill", "decode"]
    for name, component in components.items():
        assert component["inputs"] == flagless[name]["inputs"], name
        assert component["outputs"] == flagless[name]["outputs"], name


@pytest.mark.slow
def test_the_transcript_is_printed(speech_export, whisper, tmp_path):
    folder = speech_export("dynamo")
    wav = _write_clip(tmp_path / "tone.wav", *CLIPS[0])
    done = _hfexport("generate", str(folder), "--audio", str(wav), "--max-new-tokens", str(NEW_TOKENS), "--ids")
    assert done.returncode == 0, done.stderr[-2000:]
    tokens, _ = _eager(whisper, _features(whisper[1], wav))
    lines = done.stdout.splitlines()
    assert lines[0] == "text:   " + whisper[1].tokenizer.decode(tokens, skip_special_tokens=True)
    assert lines[1] == "tokens: " + ",".join(map(str, tokens))


@pytest.mark.slow
def test_audio_inputs_take_the_feature_extractors_arrays(speech_export, whisper, tmp_path):
    """`--audio-inputs FILE.npz`: the arrays the feature extractor made, no soundfile needed."""
    folder = speech_export("dynamo")
    features = _features(whisper[1], _write_clip(tmp_path / "stereo.flac", *CLIPS[1], seed=2))
    np.savez(tmp_path / "features.npz", input_features=features.numpy())
    done = _hfexport("generate", str(folder), "--audio-inputs", str(tmp_path / "features.npz"), "--max-new-tokens",
                     str(NEW_TOKENS), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["tokens"] == _eager(whisper, features)[0]


@pytest.mark.slow
def test_a_multilingual_config_detects_the_language_as_generate_does(tmp_path):
    """A multilingual Whisper's config names no language (`forced_decoder_ids` [[1, None], [2, transcribe]]):
    `generate` picks it from the decoder's first logits. The export's capture names one (else the
    detection's own forward would be taken for the prefill), and the runner detects it as `generate`
    does; the tiny model picks the middle one of three here, so neither the first nor the last."""
    from hfexport import AutoExportConfig
    from hfexport.job.export import export_to_folder
    from hfexport.loading import LoadedModel

    model, inputs = build_preset("whisper")
    processor = tiny_processor("whisper")
    generation = model.generation_config
    generation.lang_to_id, generation.task_to_id = {"<|en|>": 120, "<|fr|>": 121, "<|de|>": 122}, {"translate": 123,
                                                                                                  "transcribe": 124}
    generation.is_multilingual, generation.forced_decoder_ids = True, [[1, None], [2, 124]]
    inputs = {name: value for name, value in inputs.items() if not name.startswith("decoder_")}
    export_to_folder(LoadedModel(model, inputs, "tiny:whisper", processor.tokenizer, processor=processor),
                     AutoExportConfig.from_dict({"export_format": "dynamo", "dynamic": True}), tmp_path / "out",
                     generate=True)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [i["name"] for i in manifest["components"]["prefill"]["inputs"]][0] == "decoder_input_ids"
    assert any(i["name"].startswith("cache.") for i in manifest["components"]["decode"]["inputs"])
    samples = 0.3 * np.random.default_rng(3).standard_normal(9000).astype(np.float32)
    features = processor.feature_extractor(samples, sampling_rate=16000, return_tensors="pt")["input_features"]
    with torch.no_grad():
        out = model.generate(input_features=features, max_new_tokens=8, do_sample=False, return_dict_in_generate=True,
                             output_logits=True)
    prompt, tokens = out.sequences[0, :-len(out.logits)].tolist(), out.sequences[0, -len(out.logits):].tolist()
    assert prompt == [1, 121, 124, 127]  # start, the detected language, transcribe, no timestamps
    assert GenerationRunner.load(tmp_path / "out").generate_from_audio(samples, max_new_tokens=8).tokens == tokens


# -- refusals on an export: exit 2, naming the remedy ---------------------------------------------------


@pytest.mark.slow
def test_a_missing_or_unreadable_file_exits_2(speech_export, tmp_path, capsys):
    folder = str(speech_export("dynamo"))
    assert main(["generate", folder, "--audio", str(tmp_path / "nowhere.wav")]) == 2
    assert "no audio file" in capsys.readouterr().err
    (tmp_path / "noise.wav").write_bytes(b"RIFF, but not really a wave file" * 10)
    assert main(["generate", folder, "--audio", str(tmp_path / "noise.wav")]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "What to do: pass a WAV or FLAC file" in err


@pytest.mark.slow
def test_audio_longer_than_the_chunk_exits_2_saying_why(speech_export, tmp_path, capsys):
    """The tiny feature extractor's chunk is 1 s (a real Whisper's 30 s): 1.5 s is refused, not cut."""
    clip = _write_clip(tmp_path / "long.wav", 1.5, 16000, 1, 440, "WAV")
    assert main(["generate", str(speech_export("dynamo")), "--audio", str(clip)]) == 2
    err = capsys.readouterr().err
    assert "is 1.50 s long" in err and "at most 1.00 s" in err and "cut it into clips of at most 1.00 s" in err


@pytest.mark.slow
def test_more_tokens_than_the_decoder_has_positions_exits_2(speech_export, tmp_path, capsys):
    """As `generate` refuses it: the prompt's 2 tokens and 31 new ones pass the tiny decoder's 32 positions."""
    clip = _write_clip(tmp_path / "tone.wav", *CLIPS[0])
    assert main(["generate", str(speech_export("dynamo")), "--audio", str(clip), "--max-new-tokens", "31"]) == 2
    assert "ask for at most 30 new tokens" in capsys.readouterr().err


@pytest.mark.slow
def test_features_of_another_shape_exit_2(speech_export, tmp_path, capsys):
    np.savez(tmp_path / "features.npz", input_features=np.zeros((1, 8, 20), dtype=np.float32))
    assert main(["generate", str(speech_export("dynamo")), "--audio-inputs", str(tmp_path / "features.npz")]) == 2
    err = capsys.readouterr().err
    assert "takes input_features of shape" in err and "[1, 8, 20]" in err


@pytest.mark.slow
def test_a_prompt_on_a_speech_export_exits_2_naming_audio(speech_export, capsys):
    assert main(["generate", str(speech_export("dynamo")), "--prompt-ids", "1,2,3"]) == 2
    assert "is a speech export" in capsys.readouterr().err


@pytest.mark.slow
def test_a_prompt_with_audio_on_whisper_exits_2(speech_export, tmp_path, capsys):
    """Whisper takes the clip alone (an audio-text LLM takes `--prompt` too: test_audio_llm.py)."""
    clip = _write_clip(tmp_path / "tone.wav", *CLIPS[0])
    assert main(["generate", str(speech_export("dynamo")), "--audio", str(clip), "--prompt", "hi"]) == 2
    assert "goes without --prompt: drop --prompt" in capsys.readouterr().err
    with pytest.raises(PrepareError, match="it takes the clip alone"):
        GenerationRunner.load(speech_export("dynamo")).generate_from_audio(clip, prompt="hi")


@pytest.mark.slow
def test_audio_on_a_text_only_export_exits_2(saved_generation, tmp_path, capsys):
    pytest.importorskip("soundfile")
    clip = _write_clip(tmp_path / "tone.wav", *CLIPS[0])
    assert main(["generate", str(saved_generation("dynamo", "llama").directory), "--audio", str(clip)]) == 2
    assert "is not one: drop --audio" in capsys.readouterr().err


@pytest.mark.slow
def test_audio_on_an_export_without_a_feature_extractor_exits_2(speech_export, tmp_path, capsys, monkeypatch):
    """As an export of a model folder that held no processor."""
    from hfexport.folder.generation_export import GenerationExport

    folder = str(speech_export("dynamo"))  # before the patch: a shared export is made unpatched
    monkeypatch.setattr(GenerationExport, "has_processor", property(lambda self: False))
    assert main(["generate", folder, "--audio", str(_write_clip(tmp_path / "tone.wav", *CLIPS[0]))]) == 2
    err = capsys.readouterr().err
    assert "holds no feature extractor" in err and "--audio-inputs FILE.npz" in err


# -- the fast tier: the clip's features, the suppression, refusals before any export is opened ----------


def test_audio_features_are_the_feature_extractors_on_the_mixed_resampled_clip(whisper, tmp_path):
    from hfexport.generation.audio_input import audio_features

    pytest.importorskip("soundfile")
    for index, clip in enumerate(CLIPS):
        path = _write_clip(tmp_path / f"clip-{index}.{clip[-1].lower()}", *clip, seed=index)
        torch.testing.assert_close(audio_features(whisper[1], path)["input_features"], _features(whisper[1], path))
    # samples given as an array: the same mixing and resampling as a file's
    import soundfile

    samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
    torch.testing.assert_close(audio_features(whisper[1], samples, rate)["input_features"], _features(whisper[1], path))


def test_the_presets_suppressed_tokens_change_what_these_clips_generate(whisper, tmp_path):
    """The comparisons above hold the suppression: without it, eager writes other tokens on the clips."""
    pytest.importorskip("soundfile")
    changed = []
    for index, clip in enumerate(CLIPS):
        features = _features(whisper[1], _write_clip(tmp_path / f"clip-{index}.{clip[-1].lower()}", *clip, seed=index))
        unsuppressed = _eager(whisper, features, suppress_tokens=None, begin_suppress_tokens=None)[0]
        changed.append(_eager(whisper, features)[0] != unsuppressed)
    assert all(changed), changed


def test_a_clip_longer_than_the_chunk_is_refused_not_cut(whisper):
    from hfexport.errors import PrepareError
    from hfexport.generation.audio_input import audio_features

    with pytest.raises(PrepareError, match=r"is 1\.25 s long; the model's feature extractor takes at most 1\.00 s"):
        audio_features(whisper[1], np.zeros(20000, dtype=np.float32))


@pytest.mark.parametrize("other", [["--chat", "hello"], ["--prompt-ids", "1,2"]])
def test_audio_goes_without_a_prompt(tmp_path, capsys, other):
    """Refused before the export is opened (the folder need not exist); `--prompt`, which an audio-text
    export takes with `--audio`, once the export is opened (`test_a_prompt_with_audio_on_whisper_exits_2`)."""
    assert main(["generate", str(tmp_path), "--audio", "clip.wav", *other]) == 2
    err = capsys.readouterr().err
    assert f"goes without {other[0]}: drop {other[0]}" in err


def test_audio_without_soundfile_exits_2_naming_the_pip_line(tmp_path, capsys, monkeypatch):
    from hfexport import _versions

    monkeypatch.setattr("hfexport.cli.generate.is_importable", lambda name: name != "soundfile")
    assert _versions.EXTRAS["audio"] == ("soundfile", "scipy")
    assert main(["generate", str(tmp_path), "--audio", "clip.wav"]) == 2
    err = capsys.readouterr().err
    assert 'needs soundfile to read and resample the clip' in err and 'pip install "hfexport[audio]"' in err
    assert "--audio-inputs FILE.npz" in err


def test_generate_without_any_input_exits_2(tmp_path, capsys):
    assert main(["generate", str(tmp_path)]) == 2
    assert "--prompt-ids 1,2,3, --prompt TEXT or --chat MESSAGE, or with a speech export --audio FILE" in \
        capsys.readouterr().err


@pytest.mark.slow
def test_chat_on_a_speech_export_says_to_transcribe_with_audio(speech_export, capsys, monkeypatch):
    """`hfexport chat` on a Whisper export names `generate --audio`, not `--prompt` (which a speech export
    refuses too); exit 1, as its other refusals (no tokenizer, no chat template)."""
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    folder = speech_export("dynamo")
    assert main(["chat", str(folder)]) == 1
    err = capsys.readouterr().err
    assert f"{folder} is a speech export: it transcribes audio" in err and f"generate {folder} --audio FILE" in err
    assert "--prompt" not in err
