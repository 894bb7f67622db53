"""OpenVINO GenAI's `WhisperPipeline` folder (issue 52): `hfexport export tiny:whisper -f openvino -o OUT`
with no task flag writes the models `WhisperPipeline` opens beside the components, and in a fresh
process that knows nothing of hfexport `WhisperPipeline(OUT, "CPU").generate(raw_speech)` gives eager
`model.generate(input_features=...)`'s greedy tokens on a tone drawn here (the features of eager made
by the same feature extractor from the same samples), as does `hfexport generate OUT --audio
tone.wav`; the same on a drawn Whisper of other sizes and 80 or 128 mel bins; and a folder crafted
around what `WhisperPipeline` opens by name is refused when hfexport opens it.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from hfexport.cli.main import main
from hfexport.presets import build_preset, tiny_processor
from tests.generation.exports import SPEECH_PACKAGE, cli_generation_exports
from tests.harness import eager_transcription, require_backend, whisper_variation

NEW_TOKENS = 12
_DRAW = random.Random(52)
#: the drawn tone of the fresh-process checks: (seconds under the preset's 1 s chunk, Hz)
TONE = (round(_DRAW.uniform(0.3, 0.9), 3), _DRAW.randint(150, 3000))
#: a Whisper of other sizes than the preset's, drawn once: width and heads, layers, mel bins
VARIATION = whisper_variation(_DRAW)

#: what a user runs: only openvino_genai and soundfile, the folder's recorded precisions, the tokens its
#: streamer is handed
_PIPELINE = textwrap.dedent("""
    import json, sys
    import openvino_genai, soundfile

    folder, clip, new_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    properties = json.load(open(folder + "/manifest.json"))["runtime_package"]["settings"]["properties"]
    pipe = openvino_genai.WhisperPipeline(folder, "CPU", **properties)
    tokens = []

    class Tokens(openvino_genai.StreamerBase):
        def write(self, token):
            tokens.extend([token] if isinstance(token, int) else token)
            return openvino_genai.StreamingStatus.RUNNING

        def end(self):
            pass

    samples, _ = soundfile.read(clip, dtype="float32")
    result = pipe.generate(samples, max_new_tokens=new_tokens, streamer=Tokens())
    print(json.dumps({"tokens": tokens, "text": result.texts[0]}))
""")


def _tone(path: Path, seconds: float, hz: int, rate: int = 16000, seed: int = 0) -> Path:
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).standard_normal(t.shape)
    soundfile.write(path, (0.5 * np.sin(2 * np.pi * hz * t) + 0.05 * noise).astype(np.float32), rate)
    return path


def _eager(model, processor, clip: Path) -> list[int]:
    return eager_transcription(model, processor, clip, NEW_TOKENS)


def _whisper_pipeline(folder: Path, clip: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", _PIPELINE, str(folder), str(clip), str(NEW_TOKENS)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _hfexport(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hfexport", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def package(shared_folder) -> Path:
    """`hfexport export tiny:whisper -f openvino -o OUT` in a new process, no task flag, made once per
    test run (the folder tests/generation/test_audio.py reads too)."""
    require_backend("openvino")
    pytest.importorskip("openvino_genai")
    return cli_generation_exports(shared_folder, "whisper", SPEECH_PACKAGE, generate=False)("openvino")


@pytest.fixture(scope="module")
def preset():
    model, _ = build_preset("whisper")
    return model, tiny_processor("whisper")


@pytest.mark.slow
def test_the_flagless_export_is_a_whisper_pipeline_folder_checked_by_its_runner(package):
    manifest = json.loads((package / "manifest.json").read_text())
    report = json.loads((package / "report.json").read_text())
    assert report["task"]["name"] == "automatic-speech-recognition"
    assert list(manifest["components"]) == ["encoder", "prefill", "decode", "whisper_decoder"]
    entry = manifest["runtime_package"]
    assert entry["runner"] == "WhisperPipeline" and entry["ready"], entry
    assert set(entry["files"]) == {f"openvino_{name}.{suffix}" for name in
                                   ("encoder_model", "decoder_model", "tokenizer", "detokenizer")
                                   for suffix in ("xml", "bin")} | {"preprocessor_config.json"}
    assert manifest["components"]["encoder"]["files"][0] == "openvino_encoder_model.xml"
    assert report["runner"]["checked"] and report["runner"]["tokens_equal"], report["runner"]
    assert "WhisperPipeline" in report["runner"]["runner"] and report["runner"]["against"] == "eager generate()"


@pytest.mark.slow
def test_whisper_pipeline_in_a_fresh_process_gives_eagers_tokens(package, preset, tmp_path):
    clip = _tone(tmp_path / "tone.wav", *TONE)
    got = _whisper_pipeline(package, clip)
    tokens = _eager(*preset, clip)
    assert got["tokens"] == tokens
    assert got["text"] == preset[1].tokenizer.decode(tokens, skip_special_tokens=True)


@pytest.mark.slow
def test_the_docs_snippet_runs_as_written_on_the_folder(package, preset, tmp_path):
    """docs/runtimes/openvino.md's WhisperPipeline snippet, in a fresh process, only the folder and
    the clip replaced: it prints eager's transcript."""
    import re

    page = (Path(__file__).resolve().parents[3] / "docs" / "runtimes" / "openvino.md").read_text()
    (snippet,) = re.findall(r"<!-- whisper-pipeline -->\n```python\n(.*?)```\n<!-- /whisper-pipeline -->", page, re.S)
    clip = _tone(tmp_path / "clip.wav", *TONE, seed=3)
    code = snippet.replace('"out/whisper-ov"', repr(str(package))).replace('"clip.wav"', repr(str(clip)))
    code = code.replace("max_new_tokens=32", f"max_new_tokens={NEW_TOKENS}")
    assert code.count(str(package)) == 1 and code.count(str(clip)) == 1 and f"={NEW_TOKENS}" in code
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    tokens = _eager(*preset, clip)
    assert done.stdout.rstrip("\n") == preset[1].tokenizer.decode(tokens, skip_special_tokens=True)


@pytest.mark.slow
def test_hfexport_generate_audio_on_the_folder_gives_eagers_tokens(package, preset, tmp_path):
    clip = _tone(tmp_path / "tone.wav", *TONE, seed=1)
    done = _hfexport("generate", str(package), "--audio", str(clip), "--max-new-tokens", str(NEW_TOKENS), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed["tokens"] == _eager(*preset, clip)
    assert printed["engine"] == "hfexport" and "WhisperPipeline's package" in printed["engine_reason"]


@pytest.mark.slow
def test_a_drawn_whisper_is_a_whisper_pipeline_folder_with_eagers_tokens(tmp_path):
    """Other sizes and mel bins than the preset's, multilingual (the language detected from the
    decoder's first logits, by WhisperPipeline as by `generate()`), exported through the Python API
    with its processor."""
    from transformers import WhisperFeatureExtractor, WhisperProcessor

    from hfexport import OpenVINOConfig
    from hfexport.job import GenerationOptions, export_to_folder
    from hfexport.loading import LoadedModel

    require_backend("openvino")
    pytest.importorskip("openvino_genai")
    model, inputs = build_preset("whisper", 3, **VARIATION)
    generation = model.generation_config  # a multilingual Whisper's: [[1, None], [2, <|transcribe|>]]
    generation.lang_to_id, generation.task_to_id = {"<|en|>": 120, "<|fr|>": 121, "<|de|>": 122}, {"translate": 123,
                                                                                                  "transcribe": 124}
    generation.is_multilingual, generation.forced_decoder_ids = True, [[1, None], [2, 124]]
    tokenizer = tiny_processor("whisper").tokenizer
    extractor = WhisperFeatureExtractor(feature_size=VARIATION["num_mel_bins"], sampling_rate=16000, hop_length=500,
                                        chunk_length=1, n_fft=1000)
    processor = WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer)
    inputs = {name: value for name, value in inputs.items() if not name.startswith("decoder_")}
    result = export_to_folder(LoadedModel(model, inputs, "drawn whisper", tokenizer, processor=processor),
                              OpenVINOConfig(dynamic=True), tmp_path / "out", generation=GenerationOptions(task="auto"))
    assert result.manifest["runtime_package"]["ready"], result.manifest["runtime_package"]
    assert result.report["runner"]["tokens_equal"], (VARIATION, result.report["runner"])
    clip = _tone(tmp_path / "tone.wav", *TONE, seed=2)
    assert _whisper_pipeline(tmp_path / "out", clip)["tokens"] == _eager(model, processor, clip), VARIATION


# -- a folder crafted around the files WhisperPipeline opens by name -----------------------------------

def _rehash(folder: Path) -> None:
    """`manifest.json`'s `files` rewritten to what its listed files hold now (as anyone who can write them can)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"] = {name: {"bytes": (folder / name).stat().st_size,
                                "sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest()}
                         for name in manifest["files"]}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))


def _refused(capsys, folder: Path) -> str:
    """The one line `hfexport verify` prints refusing `folder` (exit status 2)."""
    capsys.readouterr()
    code = main(["verify", str(folder)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err and "Traceback" not in "\n".join(err), err
    return err[0]


@pytest.mark.slow
@pytest.mark.parametrize("craft", ["unlisted file it reads", "tokenizers swapped, rehashed", "tokenizer swapped",
                                   "an entry naming another file"])
def test_a_crafted_whisper_pipeline_folder_is_refused_on_opening(package, tmp_path, capsys, craft):
    folder = Path(shutil.copytree(package, tmp_path / "copy"))
    tokenizer, detokenizer = folder / "openvino_tokenizer.xml", folder / "openvino_detokenizer.xml"
    if craft == "unlisted file it reads":  # WhisperPipeline's tokenizer reads a chat template from it, unchecked
        (folder / "chat_template.json").write_text(json.dumps({"chat_template": "{{ 'evil' }}"}))
        expected = "chat_template.json is not a file manifest.json lists, and WhisperPipeline opens it"
    elif craft.startswith("tokenizers swapped"):
        tokenizer_ir, detokenizer_ir = tokenizer.read_bytes(), detokenizer.read_bytes()
        tokenizer.write_bytes(detokenizer_ir)
        detokenizer.write_bytes(tokenizer_ir)
        _rehash(folder)
        expected = "openvino_tokenizer.xml takes ['i64'] where openvino-tokenizers' tokenizer takes string or u8"
    elif craft == "tokenizer swapped":
        tokenizer.write_bytes(detokenizer.read_bytes())
        expected = "openvino_tokenizer.xml"
    else:
        manifest = json.loads((folder / "manifest.json").read_text())
        shutil.copyfile(folder / "decode.bin", folder / "weights.bin")
        manifest["runtime_package"]["files"].append("weights.bin")
        manifest["files"]["weights.bin"] = {}
        (folder / "manifest.json").write_text(json.dumps(manifest))
        _rehash(folder)
        expected = "names ['weights.bin'] for WhisperPipeline"
    assert expected in _refused(capsys, folder)


# -- why a folder gets no WhisperPipeline models, without exporting ------------------------------------

@pytest.mark.parametrize(("change", "words"), [
    ({"language": "<|fr|>"}, "it reads no language, task nor forced_decoder_ids"),
    ({"forced_decoder_ids": [[1, 121], [2, 123]]}, "starts the decoder with [1, <detected language>, 124, 127]"),
    ({"return_timestamps": True}, "asks for timestamps"),
    ({"no_timestamps_token_id": None}, "starts the decoder with [1, 50363]"),
    ({"forced_decoder_ids": None}, "where generate() starts with [1, <detected language>, 127]"),  # no task named
])
def test_a_generation_config_whisper_pipeline_would_read_otherwise_is_refused(change, words):
    """Where `generate()` builds another decoder prompt than WhisperPipeline from the same
    `generation_config.json`, the folder keeps its components and the manifest says why."""
    from hfexport import OpenVINOConfig
    from hfexport.backends.openvino.whisper import whisper_refusal

    model, _ = build_preset("whisper")
    generation = model.generation_config
    assert whisper_refusal(model.config, generation, OpenVINOConfig(dynamic=True)) is None
    if {"language", "forced_decoder_ids"} & set(change):  # a multilingual Whisper's config
        generation.lang_to_id, generation.task_to_id = {"<|en|>": 120, "<|fr|>": 121}, {"translate": 123,
                                                                                         "transcribe": 124}
        generation.is_multilingual = True
    for key, value in change.items():
        setattr(generation, key, value)
    assert words in whisper_refusal(model.config, generation, OpenVINOConfig(dynamic=True))
    assert "stateful" in whisper_refusal(model.config, model.generation_config, OpenVINOConfig(stateful=False))


def test_the_runner_check_of_a_speech_folder_can_fail(tmp_path):
    """The job's check hands the speech runner the sample clip and compares its tokens with eager
    `generate()` on the feature extractor's features of the same samples: other tokens refuse the
    export, naming both; eager's pass."""
    from hfexport.errors import ValidationError
    from hfexport.folder.package import RunnerTokens
    from hfexport.job.runner_check import RUNNER_TOKENS, runner_check

    model, inputs = build_preset("whisper")
    answers = [None]

    class SpeechPackage:
        task = "automatic-speech-recognition"

        def run(self, folder, request):
            assert request.prompt_ids == () and request.audio.dtype == np.float32 and request.audio.ndim == 1
            assert request.max_new_tokens == RUNNER_TOKENS and request.eos_token_ids == (2,)
            return RunnerTokens(answers[0] or (3,) * request.max_new_tokens, "a speech runner")

    check = runner_check(SpeechPackage(), model, inputs, model.generation_config, processor=tiny_processor("whisper"))
    with pytest.raises(ValidationError, match=r"a speech runner generated \[3, 3,.*where eager generate\(\) generated "
                                              r".*\(the sample clip\)") as refused:
        check(tmp_path)
    answers[0] = tuple(refused.value.runner["expected"])
    entry = check(tmp_path)["runner"]
    assert entry["tokens_equal"] and entry["passed"] and entry["tokens"] == RUNNER_TOKENS
