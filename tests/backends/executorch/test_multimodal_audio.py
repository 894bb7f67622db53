"""An audio-text LLM's ExecuTorch folder holds the program ExecuTorch's own `MultimodalRunner` loads
(`multimodal.pte`, its `audio_encoder` fed by `make_audio_input`, issue 52): the docs' snippet, run as
written in a fresh process that imports no hfexport, gives eager `generate`'s greedy tokens (decoded)
on the processor's output for a clip padded to the feature extractor's chunk, on the CLI's export of
`tiny:qwen2_audio` and on a drawn variation of the preset (other sizes, another clip and prompt);
hfexport's own driver of the runner gives the same token ids; a clip the program does not serve is
refused naming the remedy; the export job's runner check fails on another model's tokens; the folder's
manifest lists the program, and a program it does not list is refused.

The clips are generated (tones, noise); the tiny chunk is 1 s at 16 kHz.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("executorch")

from hfexport.backends.executorch.multimodal import SEQ2SEQ_WHY, multimodal_refusal  # noqa: E402
from hfexport.backends.executorch.multimodal_runner import run_multimodal_runner  # noqa: E402
from hfexport.presets import PRESETS, build_preset, qwen2_audio_tokens, tiny_processor  # noqa: E402

from ...generation.exports import cli_generation_exports  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "runtimes" / "executorch.md"
NEW_TOKENS = 16
RATE = 16000
#: what the docs' snippet reads and asks, replaced by the test's own where it draws them
SNIPPET_FOLDER, SNIPPET_CLIP, SNIPPET_PROMPT = '"out/qwen2-audio-et"', '"clip.wav"', '"What do you hear?"'
_DRAW = np.random.default_rng(5252)
#: the drawn variation: text (hidden, layers, heads, kv heads), audio (d_model, layers, heads), clip, prompt
DRAWN = {"text": [(32, 1, 2, 1), (48, 2, 4, 2), (64, 3, 8, 4)][int(_DRAW.integers(3))],
         "audio": [(16, 1, 2), (48, 2, 4), (64, 3, 8)][int(_DRAW.integers(3))],
         "seconds": round(float(_DRAW.uniform(0.2, 1.0)), 3), "hz": int(_DRAW.integers(200, 2000)),
         "prompt": str(_DRAW.choice(["Describe this clip.", "what is it", "Transcribe the audio, please."]))}


def _clip(seconds: float, hz: float, seed: int) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    noise = np.random.default_rng(seed).standard_normal(len(t))
    return (0.4 * np.sin(2 * np.pi * hz * t) + 0.1 * noise).astype(np.float32)


def _processor_inputs(processor, samples: np.ndarray, prompt: str) -> dict:
    """The processor's output for `samples` padded with silence to the chunk, in one user turn."""
    samples = np.pad(samples, (0, processor.feature_extractor.n_samples - len(samples)))
    messages = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": prompt}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return processor(text=[text], audio=[samples], sampling_rate=RATE, return_tensors="pt")


def _eager(model, inputs: dict) -> list[int]:
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def _snippet(folder: Path, clip: Path, prompt: str) -> list[str]:
    """The docs' audio snippet, as written but for its folder, clip and question, in a fresh
    process (checked to import no hfexport): the runner's text pieces."""
    found = re.findall(r"<!-- snippet: executorch-audio -->\n```python\n(.*?)```\n<!-- /snippet -->", PAGE.read_text(),
                       re.S)
    assert len(found) == 1, found
    block = found[0]
    for old in (SNIPPET_FOLDER, SNIPPET_CLIP, SNIPPET_PROMPT, str(NEW_TOKENS)):
        assert old in block, old
    code = (block.replace(SNIPPET_FOLDER, repr(str(folder))).replace(SNIPPET_CLIP, repr(str(clip)))
            .replace(SNIPPET_PROMPT, repr(prompt)))
    code += ("\nimport json, sys\nassert not any(m.startswith('hfexport') for m in sys.modules)\n"
             "print('RESULT ' + json.dumps(pieces))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=clip.parent)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def _wav(path: Path, samples: np.ndarray) -> Path:
    import soundfile

    soundfile.write(path, samples, RATE, format="WAV")
    return path


@pytest.fixture(scope="module")
def cli_export(shared_folder):
    """`hfexport export tiny:qwen2_audio -f executorch --generate -o OUT` in a new process, shared with
    tests/generation/test_audio_llm.py (`cli_generation_exports`); its model and processor."""
    folder = cli_generation_exports(shared_folder, "qwen2_audio", "audio-llm")("executorch")
    return folder, build_preset("qwen2_audio")[0], tiny_processor("qwen2_audio")


@pytest.fixture(scope="module")
def drawn_export(tmp_path_factory):
    """The drawn variation exported by the export job (`export_to_folder`, what the CLI runs) with
    `--task generation-components` (what the flagless export's report names: task inference gives an
    audio-text LLM one graph of its forward, as every image-text model) and its weights in `.ptd`
    files, with its runner check."""
    from hfexport import AutoExportConfig
    from hfexport.job.export import GenerationOptions, export_to_folder
    from hfexport.loading import LoadedModel

    hidden, layers, heads, kv_heads = DRAWN["text"]
    d_model, audio_layers, audio_heads = DRAWN["audio"]
    preset = PRESETS["qwen2_audio"].config
    text = dict(preset["text_config"], hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, intermediate_size=2 * hidden)
    audio = dict(preset["audio_config"], d_model=d_model, encoder_layers=audio_layers,
                 encoder_attention_heads=audio_heads, encoder_ffn_dim=2 * d_model)
    model, inputs = build_preset("qwen2_audio", 3, text_config=text, audio_config=audio)
    processor = tiny_processor("qwen2_audio")
    folder = tmp_path_factory.mktemp("qwen2-audio-drawn") / "export"
    loaded = LoadedModel(model, inputs, "qwen2_audio", processor.tokenizer, processor=processor)
    config = AutoExportConfig.from_dict({"export_format": "executorch", "external_weights": True})
    result = export_to_folder(loaded, config, folder, generation=GenerationOptions(task="generation-components"))
    return folder, model, processor, result


def _entry(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())["runtime_package"]


@pytest.mark.slow  # reads the shared CLI export (~2 min once) and runs MultimodalRunner (~3 s a clip)
def test_the_docs_snippet_gives_eagers_tokens_on_the_cli_export(cli_export, tmp_path):
    """A tone and noise (different answers), each shorter than the chunk and padded to it as the
    snippet pads it: the runner's pieces are eager's tokens decoded; hfexport's driver gives their ids."""
    folder, model, processor = cli_export
    entry = _entry(folder)
    assert entry["runner"] == "MultimodalRunner" and entry["ready"], entry
    assert {"multimodal.pte", "tokenizer.json"} <= set(entry["files"]) and entry["settings"]["audio"]["rows"] == 8
    assert entry["settings"]["methods"] == ["text_decoder", "audio_encoder", "token_embedding"]
    report = json.loads((folder / "report.json").read_text())["runner"]
    assert report["checked"] and report["passed"] and "MultimodalRunner" in report["runner"], report
    heard = []
    noise = (0.3 * np.random.default_rng(1).standard_normal(RATE // 2)).astype(np.float32)
    for name, samples in (("tone", _clip(0.7, 440, 0)), ("noise", noise)):
        inputs = _processor_inputs(processor, samples, "What do you hear?")
        eager = _eager(model, inputs)
        pieces = _snippet(folder, _wav(tmp_path / f"{name}.wav", samples), "What do you hear?")
        assert pieces == [processor.tokenizer.decode([token]) for token in eager], name
        assert run_multimodal_runner(folder, inputs["input_ids"], inputs["input_features"], NEW_TOKENS,
                                     frame_mask=inputs["feature_attention_mask"]) == eager, name
        heard.append(eager)
    assert heard[0] != heard[1], "the clip must change the answer"


@pytest.mark.slow  # exports the drawn variation (~2 min) and runs MultimodalRunner
def test_a_drawn_variation_gives_eagers_tokens(drawn_export, tmp_path):
    folder, model, processor, result = drawn_export
    assert result.report["task"]["name"] == "generation-components", result.report["task"]
    assert result.report["runner"]["checked"] and result.report["runner"]["passed"], result.report["runner"]
    entry = _entry(folder)
    assert entry["ready"] and entry["settings"]["data"] == "multimodal.ptd" and "multimodal.ptd" in entry["files"]
    samples = _clip(DRAWN["seconds"], DRAWN["hz"], 7)
    eager = _eager(model, _processor_inputs(processor, samples, DRAWN["prompt"]))
    pieces = _snippet(folder, _wav(tmp_path / "drawn.wav", samples), DRAWN["prompt"])
    assert pieces == [processor.tokenizer.decode([token]) for token in eager], DRAWN


@pytest.mark.slow  # reads the shared CLI export; the refusals come before any runner starts
def test_a_clip_the_program_does_not_serve_is_refused_with_the_remedy(cli_export):
    from hfexport.errors import PrepareError

    folder, _, processor = cli_export
    messages = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "hi"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    short = processor(text=[text], audio=[_clip(0.6, 440, 2)], sampling_rate=RATE, return_tensors="pt")
    full = _processor_inputs(processor, _clip(0.6, 440, 2), "hi")
    remedy = "pad the clip with silence to the chunk (1 s)"
    heard = int(short["feature_attention_mask"].sum())
    tokens = qwen2_audio_tokens(heard)
    assert heard < 32 and tokens < 8
    # a clip shorter than the chunk, unpadded: its mask has padding, its prompt fewer audio tokens
    with pytest.raises(PrepareError, match=f"the clip fills {heard} of the 32 frames") as error:
        run_multimodal_runner(folder, short["input_ids"], short["input_features"], 4,
                              frame_mask=short["feature_attention_mask"])
    assert remedy in str(error.value) and "hfexport generate --audio" in str(error.value)
    with pytest.raises(PrepareError, match=f"the prompt has {tokens} audio tokens and the program's audio_encoder "
                       "gives 8 rows"):
        run_multimodal_runner(folder, short["input_ids"], short["input_features"], 4)
    with pytest.raises(PrepareError, match=r"takes input_features of shape \[1, 8, 32\].*these are \[1, 8, 16\]"):
        run_multimodal_runner(folder, full["input_ids"], full["input_features"][..., :16], 4)
    with pytest.raises(ValueError, match="one run of the audio token 120"):
        run_multimodal_runner(folder, torch.cat([full["input_ids"], full["input_ids"]], 1), full["input_features"], 4)


@pytest.mark.slow  # reads the shared CLI export and runs MultimodalRunner once
def test_the_runner_check_refuses_another_models_tokens(cli_export):
    """The export job's check on the CLI's folder, against a model that is not the one exported
    (another seed): the runner's tokens differ from its eager tokens, and the check refuses."""
    from hfexport.errors import ValidationError
    from hfexport.job.runner_check import runner_check
    from hfexport.auto import AutoHfExporter

    folder, model, processor = cli_export
    package = AutoHfExporter.from_format("executorch").runtime_package("automatic-speech-recognition")
    _, prompt = build_preset("qwen2_audio")
    passed = runner_check(package, model, prompt, model.generation_config, processor=processor)(folder)["runner"]
    assert passed["checked"] and passed["passed"] and passed["against"] == "eager generate()", passed
    other = build_preset("qwen2_audio", 1)[0]
    with pytest.raises(ValidationError, match="MultimodalRunner .* generated .* where eager generate"):
        runner_check(package, other, prompt, other.generation_config, processor=processor)(folder)


@pytest.mark.slow  # copies the shared CLI export
def test_the_manifest_lists_the_program_and_refuses_one_it_does_not(cli_export, tmp_path):
    from hfexport.errors import ExportFolderError
    from hfexport.folder.manifest import read_manifest

    folder = shutil.copytree(cli_export[0], tmp_path / "copy")
    manifest = read_manifest(folder)  # every listed file checked
    assert "multimodal.pte" in manifest["files"] and "multimodal" in manifest["components"]
    inputs = _processor_inputs(cli_export[2], _clip(0.5, 440, 0), "hi")
    (folder / "multimodal.pte").write_bytes(b"not the export's program")
    with pytest.raises(ExportFolderError, match="multimodal.pte"):
        run_multimodal_runner(folder, inputs["input_ids"], inputs["input_features"], 2)
    raw = json.loads((folder / "manifest.json").read_text())
    del raw["files"]["multimodal.pte"]
    (folder / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ExportFolderError, match="names 'multimodal.pte' for .* without listing it under 'files'"):
        read_manifest(folder)


# -- the fast tier: what gets the program, without exporting ------------------------------------------


def test_which_speech_models_get_the_program_and_why_not():
    from hfexport import ExecutorchConfig

    qwen2_audio, _ = build_preset("qwen2_audio")
    whisper, _ = build_preset("whisper")
    plain = ExecutorchConfig(dynamic=True)
    assert multimodal_refusal(qwen2_audio.config, plain) is None
    assert multimodal_refusal(whisper.config, plain) == SEQ2SEQ_WHY
    assert "Seq2SeqRunner" in SEQ2SEQ_WHY and "hfexport generate --audio" in SEQ2SEQ_WHY
    assert "audio_encoder and token_embedding methods are not quantized" in multimodal_refusal(
        qwen2_audio.config, plain.replace(quantizer=object()))
    assert "--no-llm-runner" in multimodal_refusal(qwen2_audio.config, ExecutorchConfig(dynamic=True, llm_runner=False))


def test_the_audio_method_is_the_tower_and_projector_on_a_full_chunk():
    """`audio_encoder` on a clip filling the chunk gives the rows eager `Qwen2AudioModel` writes over
    the audio tokens (the tower called with the processor's all-ones mask, then the projector)."""
    from hfexport.backends.executorch.multimodal import audio_encoder_method
    from hfexport.generation.decompose import decompose_for_generation

    model, sample = build_preset("qwen2_audio")
    method = audio_encoder_method(decompose_for_generation(model, sample, runner_components=True))
    assert method.name == "audio_encoder" and list(method.sample.shape) == [1, 8, 32]
    features = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(3))
    seen = []
    handle = model.model.multi_modal_projector.register_forward_hook(lambda _m, _a, out: seen.append(out))
    ids = torch.cat([torch.tensor([[1, 121]]), torch.full((1, 8), 120), torch.tensor([[122, 7]])], dim=1)
    try:
        with torch.no_grad():
            model(input_ids=ids, input_features=features, feature_attention_mask=torch.ones(1, 32, dtype=torch.int32))
            got = method.module(features)
    finally:
        handle.remove()
    torch.testing.assert_close(got, seen[0], atol=0, rtol=0)
