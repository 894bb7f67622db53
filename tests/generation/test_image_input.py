"""Generation from an image FILE (issue 42): `hfexport generate DIR --image PNG --prompt TEXT` in a
fresh process, and `GenerationRunner.generate_from_image`, give eager `model.generate(**processor(
images=..., text=...), do_sample=False)`'s tokens on every backend, the processor being the one
saved in the export; and every way it cannot run exits 2 naming the remedy.

The exports are the shared ones (`saved_generation`, `tests/generation/exports.py`), each saved with
its tiny processor (`tiny_processor`, with a chat template): LLaVA's resizes every image to one size,
Qwen2-VL's keeps the image's aspect, so the drawn sizes give different patch grids and prompt lengths.
Qwen2-VL's is the processor class without its video processor, as hfexport builds and loads it where
torchvision is not installed (`tokenizer_files.processor_class`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from hfexport import GenerationRunner
from hfexport.cli.main import main
from hfexport.generation.image_input import image_prompt_inputs, prompt_text
from tests.harness import require_backend

FORMATS = ["dynamo", "onnx", "openvino", "executorch"]
IMAGE_CASES = ["llava", "qwen2_vl"]
#: the components `GenerationRunner` runs for an image prompt
DRIVEN = {"text_embeddings", "image_encoder", "multi_modal_projector", "language_model", "lm_head", "decode"}
NEW_TOKENS = 6
#: (height, width) of the drawn images, drawn once: LLaVA's processor resizes both to its tower's
#: 16x16; Qwen2-VL's to two different patch grids (so two prompt lengths besides the two texts')
IMAGE_SIZES = [tuple(int(v) for v in np.random.default_rng(42).integers(8, 64, 2)) for _ in range(2)]
PROMPTS = ["Describe this image.", "What is in the picture, in a few words?"]


def _png(path, size: tuple[int, int], seed: int):
    """A random RGB image of `size` written as a PNG at `path`."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def _eager_tokens(saved, image_path, prompt: str) -> list[int]:
    """Eager `generate`'s greedy new tokens on what the test's own processor makes of the file."""
    from PIL import Image

    with Image.open(image_path) as image:
        inputs = saved.processor(images=[image.convert("RGB")], text=[prompt_text(saved.processor, prompt)],
                                 return_tensors="pt")
    with torch.no_grad():
        out = saved.model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def _generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hfexport", "generate", *args], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("case", IMAGE_CASES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_generate_from_an_image_file_equals_generate(saved_generation, fmt, case, tmp_path):
    """The user's path: a PNG and a text prompt, the processor saved in the folder, `hfexport
    generate` in a new process; then the other drawn image and prompt through the runner's API."""
    require_backend(fmt)
    saved = saved_generation(fmt, case)
    # the folder holds what the runner needs beyond export_for_generation's documented components
    assert "text_embeddings" in json.loads((saved.directory / "manifest.json").read_text())["components"]
    pngs = [_png(tmp_path / f"image-{index}.png", size, seed=index) for index, size in enumerate(IMAGE_SIZES)]
    done = _generate(str(saved.directory), "--image", str(pngs[0]), "--prompt", PROMPTS[0], "--max-new-tokens",
                     str(NEW_TOKENS), "--min-new-tokens", str(NEW_TOKENS), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed["tokens"] == _eager_tokens(saved, pngs[0], PROMPTS[0])
    assert printed["text"] == saved.processor.tokenizer.decode(printed["tokens"], skip_special_tokens=True)
    runner = GenerationRunner.load(saved.directory)
    assert runner.generate_from_image(pngs[1], PROMPTS[1], max_new_tokens=NEW_TOKENS,
                                      min_new_tokens=NEW_TOKENS).tokens == _eager_tokens(saved, pngs[1], PROMPTS[1])
    # only what the runner drives was opened, not a vendor runner's models beside them in the folder
    # (MultimodalRunner's program, VLMPipeline's), which hold the language model's weights again
    assert set(runner.runners._open) <= DRIVEN, sorted(set(runner.runners._open) - DRIVEN)


@pytest.mark.slow
def test_the_cli_export_of_a_tiny_image_text_preset_generates_from_an_image(tmp_path):
    """Issue 42's path word for word: `hfexport export tiny:qwen2_vl -f dynamo --generate -o OUT`, then
    `hfexport generate OUT --image cat.png --prompt "Describe this image."`, each in a new process:
    the preset carries its processor (`presets.tiny_processor`), and the tokens are eager's on the
    preset's model (the same seed). The other formats: the shared exports above."""
    from hfexport.presets import build_preset, tiny_processor

    out = tmp_path / "qwen2-vl"
    done = subprocess.run([sys.executable, "-m", "hfexport", "export", "tiny:qwen2_vl", "-f", "dynamo", "--generate",
                           "-o", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    png = _png(tmp_path / "cat.png", IMAGE_SIZES[1], seed=5)
    done = _generate(str(out), "--image", str(png), "--prompt", "Describe this image.", "--max-new-tokens",
                     str(NEW_TOKENS), "--min-new-tokens", str(NEW_TOKENS), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    model, _ = build_preset("qwen2_vl")
    saved = types.SimpleNamespace(model=model, processor=tiny_processor("qwen2_vl"))
    assert json.loads(done.stdout.strip().splitlines()[-1])["tokens"] == _eager_tokens(saved, png, "Describe this image.")


@pytest.mark.slow
@pytest.mark.parametrize("case", IMAGE_CASES)
def test_the_onnx_folder_says_why_onnxruntime_genai_does_not_run_it(saved_generation, case):
    """onnxruntime-genai 0.18's multimodal processors serve other architectures: the manifest says
    so, and which, instead of a text decoder's remedy."""
    require_backend("onnx")
    entry = json.loads((saved_generation("onnx", case).directory / "manifest.json").read_text())["runtime_package"]
    assert entry["runner"] == "onnxruntime-genai" and entry["ready"] is False and entry["files"] == [], entry
    assert "qwen2_5_vl" in entry["why"] and "hfexport generate --image" in entry["why"]


@pytest.mark.slow
def test_generate_from_image_takes_a_pil_image_and_a_path(saved_generation, tmp_path):
    from PIL import Image

    saved = saved_generation("dynamo", "llava")
    runner = GenerationRunner.load(saved.directory)
    assert {"processor_config.json", "chat_template.jinja", "tokenizer.json"} <= set(runner.export.manifest["files"])
    png = _png(tmp_path / "image.png", IMAGE_SIZES[1], seed=7)
    expected = _eager_tokens(saved, png, PROMPTS[1])
    with Image.open(png) as image:
        from_image = runner.generate_from_image(image, PROMPTS[1], max_new_tokens=NEW_TOKENS,
                                                min_new_tokens=NEW_TOKENS).tokens
    assert from_image == expected
    assert runner.generate_from_image(png, PROMPTS[1], max_new_tokens=NEW_TOKENS,
                                      min_new_tokens=NEW_TOKENS).tokens == expected
    # the saved processor is the one the export was given: same ids for the same image and text
    ours = image_prompt_inputs(runner.processor(), png, PROMPTS[1])
    theirs = image_prompt_inputs(saved.processor, png, PROMPTS[1])
    assert torch.equal(ours["input_ids"], theirs["input_ids"])
    assert torch.equal(ours["pixel_values"], theirs["pixel_values"])


@pytest.mark.slow
def test_image_on_an_export_without_a_processor_exits_2_naming_image_inputs(saved_generation, tmp_path, capsys,
                                                                             monkeypatch):
    """As an export of a model folder that held no processor (or one transformers could not load)."""
    from hfexport.folder.generation_export import GenerationExport

    saved = saved_generation("dynamo", "qwen2_vl")  # before the patch: a shared export is made unpatched
    monkeypatch.setattr(GenerationExport, "has_processor", property(lambda self: False))
    png = _png(tmp_path / "image.png", IMAGE_SIZES[0], seed=0)
    assert main(["generate", str(saved.directory), "--image", str(png), "--prompt", "Describe this image."]) == 2
    err = capsys.readouterr().err
    assert "holds no processor" in err and "--image-inputs FILE.npz" in err


@pytest.mark.slow
def test_a_processor_this_install_cannot_build_exits_2_naming_what_it_needs(saved_generation, tmp_path, capsys,
                                                                            monkeypatch):
    """As a processor whose sub-processor needs a package this install lacks (transformers raises ImportError)."""
    from hfexport.folder.generation_export import GenerationExport

    def cannot(self):
        raise ImportError("\nCLIPImageProcessor requires the PIL library but it was not found in your environment.")

    saved = saved_generation("dynamo", "llava")  # before the patch: a shared export is made unpatched
    monkeypatch.setattr(GenerationExport, "load_processor", cannot)
    png = _png(tmp_path / "image.png", IMAGE_SIZES[0], seed=0)
    assert main(["generate", str(saved.directory), "--image", str(png), "--prompt", "Describe this image."]) == 2
    err = capsys.readouterr().err
    assert "requires the PIL library" in err and "--image-inputs FILE.npz" in err


@pytest.mark.slow
def test_image_on_a_text_only_export_exits_2(saved_generation, tmp_path, capsys):
    saved = saved_generation("dynamo", "llama")
    png = _png(tmp_path / "image.png", IMAGE_SIZES[0], seed=0)
    assert main(["generate", str(saved.directory), "--image", str(png), "--prompt", "hello"]) == 2
    assert "is a text-only one: drop --image" in capsys.readouterr().err


# -- the fast tier: loading a processor, refusals before any export is opened, the prompt's text ------


@pytest.mark.parametrize("case, layout", [("llava", "processor"), ("qwen2_vl", "processor"),
                                          ("qwen2_vl", "image processor and tokenizer")])
def test_a_model_folder_with_a_processor_is_loaded_with_it(tmp_path, case, layout):
    """What `hfexport export FOLDER` loads from a model folder holding a processor, so the export saves
    it (`LoadedModel.processor`): written by the processor's `save_pretrained`, or as a hub repo of
    Qwen2-VL holds it (the image processor's `preprocessor_config.json` naming the processor class,
    the tokenizer's files, the chat template). It gives the same inputs as the processor written; a
    folder without one loads none. Without torchvision, Qwen2-VL's is its class without the video
    processor (`tokenizer_files.processor_class`)."""
    import json

    from transformers.utils import is_torchvision_available

    from hfexport.loading import load_model
    from hfexport.presets import build_preset
    from tests.generation.exports import tiny_processor

    folder = tmp_path / case
    model, _ = build_preset(case)
    model.save_pretrained(folder)
    processor = tiny_processor(case)
    if layout == "processor":
        processor.save_pretrained(folder)
    else:
        processor.image_processor.save_pretrained(folder)
        settings = json.loads((folder / "preprocessor_config.json").read_text())
        (folder / "preprocessor_config.json").write_text(json.dumps({**settings,
                                                                     "processor_class": type(processor).__name__}))
        processor.tokenizer.save_pretrained(folder)
        (folder / "chat_template.jinja").write_text(processor.chat_template)
    loaded = load_model(str(folder))
    assert type(loaded.processor).__name__ == type(processor).__name__ and loaded.processor.chat_template
    if case == "qwen2_vl":
        assert hasattr(loaded.processor, "video_processor") == is_torchvision_available()
    assert loaded.tokenizer is not None
    image = np.random.default_rng(3).integers(0, 256, (*IMAGE_SIZES[0], 3), dtype=np.uint8)
    from PIL import Image

    ours = image_prompt_inputs(loaded.processor, Image.fromarray(image), PROMPTS[0])
    theirs = image_prompt_inputs(processor, Image.fromarray(image), PROMPTS[0])
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[name], theirs[name]) for name in ours)
    llama, _ = build_preset("llama")
    llama.save_pretrained(tmp_path / "llama")
    assert load_model(str(tmp_path / "llama")).processor is None


@pytest.mark.parametrize("case", IMAGE_CASES)
def test_an_image_text_model_folders_sample_prompt_shows_an_image(tmp_path, case):
    """`hfexport export FOLDER` of an image-text model traces the image path: its sample inputs are
    its processor's on a random image and the prompt (with the chat template), or without a
    processor the preset's for its architecture; text-only inputs would export a model that never
    sees an image (`--generate`: no image encoder)."""
    from hfexport.loading import load_model
    from hfexport.presets import build_preset
    from tests.generation.exports import tiny_processor

    model, _ = build_preset(case)
    model.save_pretrained(tmp_path / "bare")
    model.save_pretrained(tmp_path / "with-processor")
    processor = tiny_processor(case)
    processor.save_pretrained(tmp_path / "with-processor")
    loaded = load_model(str(tmp_path / "with-processor"), prompt=PROMPTS[1])
    assert {"input_ids", "attention_mask", "pixel_values"} <= loaded.inputs.keys()
    ids = loaded.inputs["input_ids"]
    assert int((ids == model.config.image_token_id).sum()) > 0
    assert processor.tokenizer.decode(ids[0]).count(PROMPTS[1]) == 1
    bare = load_model(str(tmp_path / "bare"))
    assert {"input_ids", "pixel_values"} <= bare.inputs.keys() and bare.processor is None


def test_an_image_text_model_of_no_preset_without_a_processor_is_refused(monkeypatch):
    """No processor and no preset of its architecture: no sample with an image can be made, so it
    is refused, naming the processor files."""
    from hfexport import presets
    from hfexport.errors import PrepareError
    from hfexport.loading import image_text_inputs

    model, _ = presets.build_preset("llava")
    monkeypatch.setattr(presets, "PRESETS", {k: v for k, v in presets.PRESETS.items() if k != "llava"})
    with pytest.raises(PrepareError, match="processor_config.json"):
        image_text_inputs(model, None)
    text_only, _ = presets.build_preset("llama")
    assert image_text_inputs(text_only, None) is None


@pytest.mark.parametrize("options, message", [
    (["--prompt-ids", "1,2,3"], "--image goes with --prompt TEXT"),
    (["--chat", "hello"], "--image goes with --prompt TEXT"),
])
def test_image_without_a_text_prompt_exits_2(tmp_path, capsys, options, message):
    assert main(["generate", str(tmp_path / "none"), "--image", str(tmp_path / "x.png"), *options]) == 2
    assert message in capsys.readouterr().err


def test_image_and_image_inputs_are_exclusive(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["generate", str(tmp_path), "--prompt", "hi", "--image", "x.png", "--image-inputs", "x.npz"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_image_without_pillow_exits_2_naming_the_extra(tmp_path, capsys, monkeypatch):
    import hfexport.cli.generate as generate

    monkeypatch.setattr(generate, "is_importable", lambda name: name != "pillow")
    assert main(["generate", str(tmp_path / "none"), "--image", "x.png", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert 'pip install "hfexport[vision]"' in err and "--image-inputs FILE.npz" in err


def test_open_image_without_pillow_names_the_extra(monkeypatch):
    from hfexport.generation.image_input import open_image

    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match=r'pip install "hfexport\[vision\]"'):
        open_image("x.png")


class _Processor:
    """What `prompt_text` reads of a processor: its image token and chat template."""

    image_token = "<image>"

    def __init__(self, chat_template=None):
        self.chat_template = chat_template

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize
        [message] = messages
        return f"{message['role']}|{message['content'][0]['type']}|{message['content'][1]['text']}|assistant"


def test_prompt_text_applies_the_chat_template_around_the_image_where_there_is_one():
    assert prompt_text(_Processor("{{ x }}"), "Describe.") == "user|image|Describe.|assistant"
    assert prompt_text(_Processor(), "Describe.") == "<image>Describe."  # no template: the image, then the text
    assert prompt_text(_Processor("{{ x }}"), "A <image> B") == "A <image> B"  # placed by the caller: as given
