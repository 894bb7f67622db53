"""onnxruntime-genai's Whisper folder (issue 52): `hfexport export FOLDER -f onnx -o OUT` of a Whisper
with no task flag writes og's encoder and decoder, `genai_config.json` and `audio_processor_config.json`
beside the components, checked by og's `Generator` against eager `generate()`; in a fresh process that
knows nothing of hfexport, og's processor and `Generator` give `generate()`'s greedy tokens on a drawn
tone (on a clip og's processor featurizes as transformers does, against eager on the feature
extractor's features; on any clip, against eager on og's own features); the same on a drawn Whisper
of other sizes, multilingual (the language detected from og's first logits); a crafted folder is
refused when hfexport opens it. `tiny:whisper`, whose encoder takes 32 frames, stays its components,
the manifest naming og's fixed 3000 (tests/generation/test_audio.py exports it).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from hfexport.cli.main import main
from hfexport.presets import build_preset, tiny_processor
from tests.backends.onnx.whisper_exports import (ONSET, eager, features, og_whisper, og_whisper_export, saved,
                                                 tone)
from tests.harness import require_backend, whisper_variation

NEW_TOKENS = 12
_DRAW = random.Random(5252)
#: the drawn tone of the fresh-process checks: (seconds, Hz)
TONE = (round(_DRAW.uniform(0.4, 20.0), 2), _DRAW.randint(150, 3000))
#: a Whisper of other sizes than the preset's, drawn once: width and heads, layers, mel bins
VARIATION = whisper_variation(_DRAW)

#: what a user runs: only onnxruntime_genai and numpy; og's processor featurizes the clip and encodes the
#: decoder prompt, the features are saved for the test's eager run
_OG = textwrap.dedent("""
    import json, sys
    import numpy as np
    import onnxruntime_genai as og

    folder, clip, prompt, new_tokens, saved = sys.argv[1:6]
    model = og.Model(folder)
    processor = model.create_multimodal_processor()
    inputs = processor(prompt, audios=og.Audios.open(clip))
    np.save(saved, inputs["audio_features"].as_numpy())
    detect = len(sys.argv) > 6  # a multilingual Whisper's: the language, then the rest of the prompt
    languages, rest = (json.loads(sys.argv[6]), json.loads(sys.argv[7])) if detect else ([], [])
    start = inputs["input_ids"].as_numpy().shape[1] + (1 + len(rest) if detect else 0)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=start + int(new_tokens))
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    if detect:  # the highest of the first logits over the config's language tokens, as generate() detects it
        logits = generator.get_logits().reshape(-1)
        language = languages[int(np.argmax(logits[languages]))]
        generator.append_tokens(np.array([[language, *rest]], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    print(json.dumps({"tokens": [int(t) for t in generator.get_sequence(0)[start:]]}))
""")


def _og(folder: Path, clip: Path, saved_features: Path, *detect: str) -> list[int]:
    """og's greedy new tokens on the clip in a fresh process, the prompt the manifest records."""
    prompt = json.loads((folder / "manifest.json").read_text())["runtime_package"]["settings"]["decoder_prompt"]
    done = subprocess.run([sys.executable, "-c", _OG, str(folder), str(clip), prompt, str(NEW_TOKENS),
                           str(saved_features), *detect], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["tokens"]


def _hfexport(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hfexport", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def package(shared_folder) -> Path:
    require_backend("onnx")
    pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("soundfile")
    return og_whisper_export(shared_folder)


@pytest.fixture(scope="module")
def whisper():
    return og_whisper()


# -- the flagless export ----------------------------------------------------------------------------

@pytest.mark.slow
def test_the_flagless_export_is_an_og_whisper_folder_checked_by_its_runner(package):
    manifest = json.loads((package / "manifest.json").read_text())
    report = json.loads((package / "report.json").read_text())
    assert report["task"]["name"] == "automatic-speech-recognition"
    assert list(manifest["components"]) == ["encoder", "prefill", "decode", "og_encoder", "og_decoder"]
    entry = manifest["runtime_package"]
    assert entry["runner"] == "onnxruntime-genai" and entry["ready"], entry
    assert entry["files"] == ["audio_processor_config.json", "genai_config.json", "og_decoder.onnx", "og_encoder.onnx"]
    assert entry["settings"] == {"model_type": "whisper", "decoder_prompt": "<|startoftranscript|><|notimestamps|>",
                                 "detect_language": False}
    runner = report["runner"]
    assert runner["checked"] and runner["tokens_equal"] and "onnxruntime-genai 0.18" in runner["runner"], runner
    assert runner["against"] == "eager generate()" and runner["features_max_abs_diff"] > 0  # og's own features
    config = json.loads((package / "genai_config.json").read_text())["model"]
    assert config["type"] == "whisper" and config["encoder"]["filename"] == "og_encoder.onnx"
    assert config["decoder"]["inputs"]["cross_past_key_names"] == "input.cache.cross_attention.%d.keys"


@pytest.mark.slow
def test_og_in_a_fresh_process_gives_eagers_tokens_on_the_feature_extractors_features(package, whisper, tmp_path):
    """A clip og's processor featurizes as transformers' extractor does (it starts with n_fft / 2
    silent samples and is 30 s long): og's features are the extractor's, og's tokens `generate()`'s."""
    clip = tone(tmp_path / "tone.wav", *TONE, onset=ONSET, padded=True)
    got = _og(package, clip, tmp_path / "features.npy")
    own = features(whisper[1], clip)
    np.testing.assert_allclose(np.load(tmp_path / "features.npy"), own, atol=5e-5, rtol=0)
    assert got == eager(whisper[0], own, NEW_TOKENS)


@pytest.mark.slow
def test_og_on_any_clip_gives_eagers_tokens_on_its_own_features(package, whisper, tmp_path):
    """On a clip as it comes, og's processor differs from the extractor in the first two frames (its
    STFT pads with zeros where transformers reflects the clip) and the two after the clip's end (it
    pads the spectrum, transformers the samples): og's tokens are `generate()`'s on og's features."""
    seconds, hz = TONE
    clip = tone(tmp_path / "tone.wav", seconds, hz, seed=1)
    got = _og(package, clip, tmp_path / "features.npy")
    theirs, own = np.load(tmp_path / "features.npy"), features(whisper[1], clip)
    apart = np.nonzero(np.abs(theirs - own).max(axis=(0, 1)) > 1e-4)[0].tolist()
    end = int(seconds * 16000) // 160
    assert set(apart) <= {0, 1, end, end + 1} and {0, 1} <= set(apart), apart
    assert got == eager(whisper[0], theirs, NEW_TOKENS)


@pytest.mark.slow
def test_hfexport_generate_audio_on_the_folder_gives_eagers_tokens(package, whisper, tmp_path):
    clip = tone(tmp_path / "tone.wav", *TONE, seed=2)
    done = _hfexport("generate", str(package), "--audio", str(clip), "--max-new-tokens", str(NEW_TOKENS), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed["tokens"] == eager(whisper[0], features(whisper[1], clip), NEW_TOKENS)
    assert printed["engine"] == "hfexport" and "onnxruntime-genai's Whisper package" in printed["engine_reason"]


@pytest.mark.slow
def test_a_quantized_export_is_an_og_folder_checked_against_hfexports_runner(package, whisper, tmp_path):
    """`--quantize int8-dynamic`: og's graphs quantized with the components, the accuracy gate passed,
    og's tokens held to hfexport's runner on the same folder given og's own features; and in a fresh
    process og's tokens are `generate --audio-inputs` of those features on the folder."""
    out = tmp_path / "int8"
    done = _hfexport("export", str(package.parent / "model"), "-f", "onnx", "--quantize", "int8-dynamic", "-o", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    runner = json.loads((out / "report.json").read_text())["runner"]
    assert runner["checked"] and runner["passed"] and runner["against"] == "hfexport's runner on the same folder"
    assert "features_max_abs_diff" in runner, runner
    clip = tone(tmp_path / "tone.wav", *TONE, seed=4)
    got = _og(out, clip, tmp_path / "features.npy")
    np.savez(tmp_path / "inputs.npz", input_features=np.load(tmp_path / "features.npy"))
    done = _hfexport("generate", str(out), "--audio-inputs", str(tmp_path / "inputs.npz"), "--max-new-tokens",
                     str(NEW_TOKENS), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    ours = json.loads(done.stdout.strip().splitlines()[-1])["tokens"]
    assert sum(a == b for a, b in zip(got, ours)) >= 0.7 * NEW_TOKENS, (got, ours)


@pytest.mark.slow
def test_a_drawn_multilingual_whisper_is_an_og_folder_with_eagers_tokens(tmp_path):
    """Other sizes and mel bins than the fixture's, multilingual (og is given the start token, the
    language is the highest of og's first logits over `lang_to_id`, as `generate()` detects it), and
    suppress lists that hold the tokens the model would write first, through the Python API."""
    from hfexport import OnnxConfig
    from hfexport.job import GenerationOptions, export_to_folder
    from hfexport.loading import LoadedModel

    require_backend("onnx")
    pytest.importorskip("onnxruntime_genai")
    model, processor = og_whisper(3, **VARIATION)
    generation = model.generation_config
    generation.lang_to_id, generation.task_to_id = {"<|en|>": 120, "<|fr|>": 121, "<|de|>": 122}, {"translate": 123,
                                                                                                  "transcribe": 124}
    generation.is_multilingual, generation.forced_decoder_ids = True, [[1, None], [2, 124]]
    clip = tone(tmp_path / "tone.wav", *TONE, onset=ONSET, padded=True, seed=3)
    own = features(processor, clip)
    free = eager(model, own, 2, _unsuppressed(generation))  # what the model writes with no suppress list
    languages = set(generation.lang_to_id.values())  # detection reads raw logits, as generate() does
    generation.suppress_tokens = [*generation.suppress_tokens, *{free[1]} - languages]
    generation.begin_suppress_tokens = [*generation.begin_suppress_tokens, *{free[0]} - languages]
    inputs = {"input_features": torch.as_tensor(own)}
    result = export_to_folder(LoadedModel(model, inputs, "drawn whisper", processor.tokenizer, processor=processor),
                              OnnxConfig(dynamic=True), tmp_path / "out", generation=GenerationOptions(task="auto"))
    entry = result.manifest["runtime_package"]
    assert entry["ready"] and entry["settings"]["detect_language"], entry
    assert entry["settings"]["decoder_prompt"] == "<|startoftranscript|>"
    assert result.report["runner"]["tokens_equal"], (VARIATION, result.report["runner"])
    tokens = eager(model, own, NEW_TOKENS)
    assert tokens[:2] != free, "the suppress lists changed nothing"
    got = _og(tmp_path / "out", clip, tmp_path / "features.npy", json.dumps([120, 121, 122]), json.dumps([124, 127]))
    assert got == tokens, VARIATION


def _unsuppressed(generation):
    import copy

    config = copy.deepcopy(generation)
    config.suppress_tokens, config.begin_suppress_tokens = None, None
    return config


# -- a folder crafted around the files og opens by name -----------------------------------------------

def _rehash(folder: Path) -> None:
    """`manifest.json`'s `files` rewritten to what its listed files hold now (as anyone who can write them can)."""
    import hashlib

    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"] = {name: {"bytes": (folder / name).stat().st_size,
                                "sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest()}
                         for name in manifest["files"]}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))


@pytest.mark.slow
@pytest.mark.parametrize("craft", ["unlisted file it reads", "custom ops, rehashed", "another encoder, rehashed",
                                   "another hop, rehashed", "processor config swapped"])
def test_a_crafted_og_whisper_folder_is_refused_on_opening(package, tmp_path, capsys, craft):
    folder = Path(shutil.copytree(package, tmp_path / "copy"))
    config, audio = folder / "genai_config.json", folder / "audio_processor_config.json"
    if craft == "unlisted file it reads":  # og's tokenizer reads its module config by that name, unchecked
        (folder / "tokenizer_module.json").write_text(json.dumps({"tiktoken_file": "/etc/passwd"}))
        expected = "tokenizer_module.json is not a file manifest.json lists, and onnxruntime-genai opens it"
    elif craft.startswith("custom ops"):
        content = json.loads(config.read_text())
        content["model"]["encoder"]["session_options"]["custom_ops_library"] = "/tmp/evil.so"
        config.write_text(json.dumps(content))
        expected = "has the key 'model.encoder.session_options.custom_ops_library'"
    elif craft.startswith("another encoder"):
        content = json.loads(config.read_text())
        content["model"]["encoder"]["filename"] = "/tmp/other.onnx"
        config.write_text(json.dumps(content))
        expected = "names the encoder '/tmp/other.onnx', which manifest.json does not list"
    elif craft.startswith("another hop"):
        content = json.loads(audio.read_text())
        content["feature_extraction"]["sequence"][1]["operation"]["attrs"]["hop_length"] = 1.5
        audio.write_text(json.dumps(content))
        expected = "gives STFTNorm the attributes"
    else:
        audio.write_text(json.dumps({"feature_extraction": {"sequence": []}}))
        expected = "audio_processor_config.json"
    if "rehashed" in craft:
        _rehash(folder)
    capsys.readouterr()
    code = main(["verify", str(folder)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err and "Traceback" not in "\n".join(err), err
    assert expected in err[0]


# -- without exporting ---------------------------------------------------------------------------------

def test_og_refuses_a_whisper_whose_encoder_takes_other_than_3000_frames():
    """og 0.18's Whisper feeds every encoder 3000 frames (whisper.h `num_frames_{3000}`): `tiny:whisper`'s
    takes 32, so its folder keeps the components and the manifest quotes og's source; 1500 positions pass."""
    from hfexport import OnnxConfig
    from hfexport.backends.onnx.whisper import og_whisper_refusal

    model, _ = build_preset("whisper")
    why = og_whisper_refusal(model.config, model.generation_config, OnnxConfig(dynamic=True))
    assert "`int num_frames_{3000}`" in why and "ValidateWhisperAudioFeaturesShape" in why and "= 32" in why
    model, _ = og_whisper()
    assert og_whisper_refusal(model.config, model.generation_config, OnnxConfig(dynamic=True)) is None
    assert "a static export" in og_whisper_refusal(model.config, model.generation_config, OnnxConfig())
    model.generation_config.return_timestamps = True
    assert "timestamps" in og_whisper_refusal(model.config, model.generation_config, OnnxConfig(dynamic=True))


def test_ogs_graphs_give_generates_tokens_in_eager():
    """og's encoder (the cross-attention keys and values) and decoder (the prompt on an empty past,
    then one token at a time, scores suppressed as `generate()` suppresses them), run greedily as og
    runs them, give `generate()`'s tokens; with suppress lists that hold what the model would write."""
    from transformers import DynamicCache, EncoderDecoderCache

    from hfexport.backends.onnx.whisper import OgWhisperDecoder, OgWhisperEncoder

    model, inputs = build_preset("whisper")
    generation = model.generation_config
    features = inputs["input_features"]
    free = eager(model, features, 2, _unsuppressed(generation))
    generation.suppress_tokens = [*generation.suppress_tokens, free[1]]
    generation.begin_suppress_tokens = [*generation.begin_suppress_tokens, free[0]]
    expected = eager(model, features, NEW_TOKENS)
    assert expected[:2] != free
    encoder = OgWhisperEncoder(model)
    decoder = OgWhisperDecoder(model, generation.suppress_tokens, generation.begin_suppress_tokens, 2)
    tokens, ids = [], torch.tensor([[1, 127]])
    with torch.no_grad():
        cross = encoder(features)["cache"]
        cache = EncoderDecoderCache(DynamicCache(), cross)
        for _ in range(NEW_TOKENS):
            out = decoder(ids, cache)
            assert torch.isinf(out["logits"][..., generation.suppress_tokens]).all()
            tokens.append(int(out["logits"][0, -1].argmax()))
            cache, ids = EncoderDecoderCache(out["cache"], cross), torch.tensor([[tokens[-1]]])
    assert tokens == expected


def test_ogs_feature_extractor_is_the_models(tmp_path):
    """`audio_processor_config.json` gives og's STFT and log-mel the extractor's FFT, hop, mel bins
    and chunk; a config holding anything else is refused; an extractor og cannot match is named."""
    from transformers import WhisperFeatureExtractor

    from hfexport.backends.onnx.whisper import og_extractor_refusal
    from hfexport.backends.onnx.whisper_folder import audio_processor_config, check_audio_processor_config
    from hfexport.errors import ExportFolderError

    model, processor = og_whisper()
    content = audio_processor_config(processor.feature_extractor)
    stft, logmel = (step["operation"]["attrs"] for step in content["feature_extraction"]["sequence"][1:])
    assert stft == {"n_fft": 400, "frame_length": 400, "hop_length": 160}
    assert logmel == {"chunk_size": 30, "hop_length": 160, "n_fft": 400, "n_mel": 80}
    check_audio_processor_config(content, tmp_path / "a.json")
    content["feature_extraction"]["sequence"][0]["operation"]["attrs"] = {"target_sample_rate": 8000}
    with pytest.raises(ExportFolderError, match="gives AudioDecoder the attributes"):
        check_audio_processor_config(content, tmp_path / "a.json")
    assert og_extractor_refusal(model.config, processor.feature_extractor) is None
    short = WhisperFeatureExtractor(feature_size=80, hop_length=500, chunk_length=1, n_fft=1000)  # tiny:whisper's
    assert "32 frames of 1 s chunks" in og_extractor_refusal(model.config, short)
    assert "8 mel bins" in og_extractor_refusal(model.config, tiny_processor("whisper").feature_extractor)
    assert "dithers" in og_extractor_refusal(model.config, WhisperFeatureExtractor(feature_size=80, dither=0.1))
    assert "8000 Hz" in og_extractor_refusal(model.config, WhisperFeatureExtractor(feature_size=80, sampling_rate=8000))


def test_the_runner_check_gives_eager_the_features_the_runner_made(tmp_path):
    """A speech runner that makes its own features and hands them back is held to eager `generate()`
    on those features (og's processor differs from the extractor at the clip's ends), the distance
    from the extractor's reported; the same tokens without its features refuse the export."""
    from hfexport.errors import ValidationError
    from hfexport.folder.package import RunnerTokens
    from hfexport.job.runner_check import runner_check

    model, inputs = build_preset("whisper")
    made = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(7)).numpy()
    answer = eager(model, made, 16)
    given = [made]

    class SpeechPackage:
        task = "automatic-speech-recognition"

        def run(self, folder, request):
            return RunnerTokens(tuple(answer[:request.max_new_tokens]), "a speech runner", features=given[0])

    check = runner_check(SpeechPackage(), model, inputs, model.generation_config, processor=tiny_processor("whisper"))
    entry = check(tmp_path)["runner"]
    assert entry["tokens_equal"] and entry["features_max_abs_diff"] > 1
    given[0] = None
    with pytest.raises(ValidationError, match="a speech runner generated"):
        check(tmp_path)
