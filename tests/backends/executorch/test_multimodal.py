"""The ExecuTorch generation export of LLaVA holds the program ExecuTorch's own `MultimodalRunner`
loads (`multimodal.pte`): the runner, in a fresh process, given a processor's `input_ids` and
`pixel_values`, generates the token ids of eager `generate` on the same processor output; an
image-text model it does not serve says why in the manifest."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

pytest.importorskip("executorch")

from hfexport.backends.executorch.multimodal import multimodal_refusal  # noqa: E402
from hfexport.backends.executorch.multimodal_runner import run_multimodal_runner, split_prompt  # noqa: E402
from hfexport.presets import build_preset  # noqa: E402

NEW_TOKENS = 8
#: text around the image (before and after it, after only), as a chat template and a bare prompt write it
PROMPTS = ["USER: <image>\nthe quick brown fox ASSISTANT:", "<image>\nonce upon a time there was a model, hello world"]
DRAW = random.Random(7)
#: image contents and sizes drawn reproducibly (the processor resizes and crops to the tower's 16x16)
IMAGES = [(DRAW.randrange(1000), DRAW.randrange(12, 40), DRAW.randrange(12, 40)) for _ in range(2)]


def _image(seed: int, height: int, width: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


@pytest.mark.slow  # reads the shared LLaVA ExecuTorch export and runs MultimodalRunner (~3 s a case)
def test_multimodal_runner_generates_eagers_tokens(saved_generation):
    """Two drawn images × two prompts: `MultimodalRunner`'s greedy token ids are eager's on the
    same processor output (the image as the processor's float `pixel_values`)."""
    saved = saved_generation("executorch", "llava")
    entry = json.loads((saved.directory / "manifest.json").read_text())["runtime_package"]
    assert entry["runner"] == "MultimodalRunner" and entry["ready"] is True, entry
    assert entry["settings"]["program"] == "multimodal.pte" and {"multimodal.pte", "tokenizer.json"} <= set(entry["files"])
    assert all((saved.directory / file).is_file() for file in entry["files"])
    got, eager = [], []
    for prompt in PROMPTS:
        for image in IMAGES:
            inputs = saved.processor(images=_image(*image), text=prompt, return_tensors="pt")
            with torch.no_grad():
                out = saved.model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
            eager.append(out[0, inputs["input_ids"].shape[1]:].tolist())
            got.append(run_multimodal_runner(saved.directory, inputs["input_ids"], inputs["pixel_values"], NEW_TOKENS))
    assert len({tuple(tokens) for tokens in eager}) == len(eager), "the cases must give different tokens"
    assert got == eager


@pytest.mark.slow  # reads the shared Qwen2-VL ExecuTorch export
def test_an_image_text_model_the_runner_does_not_serve_says_why(saved_generation):
    qwen = json.loads((saved_generation("executorch", "qwen2_vl").directory / "manifest.json").read_text())
    entry = qwen["runtime_package"]
    assert entry["runner"] == "MultimodalRunner" and entry["ready"] is False and "Qwen2-Audio (audio) only" in entry["why"]
    assert "multimodal" not in qwen["components"]


def test_the_programs_methods_in_eager_give_generates_tokens():
    """Eager `MultimodalProgram` driven as `MultimodalRunner` drives it (the text before the image,
    the image's features, the text after, each prefilled at the running position, then one token
    at a time through `token_embedding` and `text_decoder`) gives `generate`'s greedy tokens."""
    from hfexport.backends.executorch.multimodal import MultimodalProgram, image_encoder_method

    model, inputs = build_preset("llava")
    ids = inputs["input_ids"][:1]
    with torch.no_grad():
        want = model.generate(**{k: v[:1] for k, v in inputs.items()}, max_new_tokens=6, min_new_tokens=6,
                              do_sample=False)[0, ids.shape[1]:].tolist()
        program = MultimodalProgram(model, image_encoder_method(model, inputs["pixel_values"]), 64)
        methods = {name: module for name, (module, _, _) in program.methods().items()}
        position, logits = 0, None
        for kind, value in split_prompt(ids, model.config.image_token_index):
            piece = (methods["vision_encoder"](inputs["pixel_values"][:1]) if kind == "image"
                     else methods["token_embedding"](torch.tensor([value])))
            logits = program(piece, torch.tensor([position]))["logits"]
            position += piece.shape[1]
        tokens = [int(logits[0, -1].argmax())]
        for _ in range(5):
            step = program(methods["token_embedding"](torch.tensor([[tokens[-1]]])), torch.tensor([position]))
            tokens.append(int(step["logits"][0, -1].argmax()))
            position += 1
    assert tokens == want


def test_the_refusals_name_what_to_change():
    """Without exporting: another architecture, `llm_runner=False`, a quantized export and
    several feature layers each say why."""
    from hfexport import ExecutorchConfig

    llava, _ = build_preset("llava")
    qwen, _ = build_preset("qwen2_vl")
    plain = ExecutorchConfig(dynamic=True)
    assert multimodal_refusal(llava.config, plain) is None
    assert "LLaVA (images) and Qwen2-Audio (audio) only" in multimodal_refusal(qwen.config, plain)
    assert "--no-llm-runner" in multimodal_refusal(llava.config, ExecutorchConfig(dynamic=True, llm_runner=False))
    assert "without quantization" in multimodal_refusal(llava.config, plain.replace(quantizer=object()))
    llava.config.vision_feature_layer = [-2, -1]
    assert "vision_feature_layer is a list" in multimodal_refusal(llava.config, plain)


def test_the_prompt_is_split_around_its_one_image_as_generate_hf_splits_it():
    assert split_prompt(torch.tensor([[1, 5, 9, 9, 9, 7]]), 9) == [("tokens", [1, 5]), ("image", None), ("tokens", [7])]
    assert split_prompt([9, 9, 4], 9) == [("image", None), ("tokens", [4])]
    with pytest.raises(ValueError, match="one run of the image token 9"):
        split_prompt([1, 9, 2, 9], 9)
    with pytest.raises(ValueError, match="one run of the image token 9"):
        split_prompt([1, 2], 9)
    with pytest.raises(ValueError, match="one sequence"):
        split_prompt(torch.ones(2, 3, dtype=torch.long), 9)


def test_a_folder_that_is_no_multimodal_runner_folder_is_refused_with_its_why(tmp_path):
    from hfexport.errors import ExportFolderError, RuntimeLoadError
    from hfexport.folder.manifest import runtime_package_entry, write_manifest

    def package(program: str, files: list[str]) -> dict:
        settings = {"program": program, "data": None, "image_token_id": 120}
        return {"format": "executorch", "components": {}, **runtime_package_entry(
            "MultimodalRunner", files=files, settings=settings)}

    write_manifest(tmp_path, {"format": "executorch", "components": {},
                              **runtime_package_entry("MultimodalRunner", why="LLaVA only")})
    with pytest.raises(RuntimeLoadError, match="not a MultimodalRunner folder: LLaVA only"):
        run_multimodal_runner(tmp_path, [1, 120, 2], torch.zeros(1, 3, 16, 16), 2)
    # a folder from elsewhere whose manifest points the runner outside it is refused before anything runs
    write_manifest(tmp_path, package("../other.pte", ["../other.pte"]))
    with pytest.raises(ExportFolderError, match="'../other.pte' for its runtime package without listing it"):
        run_multimodal_runner(tmp_path, [1, 120, 2], torch.zeros(1, 3, 16, 16), 2)
    write_manifest(tmp_path, package("../other.pte", []))
    with pytest.raises(ExportFolderError, match="'../other.pte' for its runtime package without listing it"):
        run_multimodal_runner(tmp_path, [1, 120, 2], torch.zeros(1, 3, 16, 16), 2)
    # nor a program its manifest does not list (so did not check), put there after it was written
    write_manifest(tmp_path, package("multimodal.pte", ["multimodal.pte"]))
    (tmp_path / "multimodal.pte").write_bytes(b"not the export's")
    with pytest.raises(ExportFolderError, match="'multimodal.pte' for its runtime package without listing it"):
        run_multimodal_runner(tmp_path, [1, 120, 2], torch.zeros(1, 3, 16, 16), 2)
