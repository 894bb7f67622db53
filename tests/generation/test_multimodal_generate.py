"""Generation from an image (issue 42): greedy tokens from an exported image-text folder equal
eager `generate(do_sample=False)` on every backend, at prompts and images the export never saw.

Each (format, model) is exported once per session (`saved_generation`, `tests/generation/exports.py`).
Qwen2-VL is checked at two image grids (4 and 12 image tokens, M-RoPE positions from
`get_rope_index`) and two prompt lengths; LLaVA (fixed image size) at one and two images and two
prompt lengths.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from hfexport import GenerationRunner
from hfexport.errors import ExportError
from hfexport.presets import qwen2_vl_image
from tests.harness import require_backend

FORMATS = ["dynamo", "onnx", "openvino", "executorch"]
NEW_TOKENS = 6


def qwen2_vl_prompt(config, grid: tuple[int, int, int], text: list[int], seed: int) -> dict[str, torch.Tensor]:
    """A processor-like Qwen2-VL prompt: `text`, vision start, one image token per merged block, vision end, 7."""
    image = qwen2_vl_image(config, [grid], seed=seed)
    tokens = grid[0] * grid[1] * grid[2] // config.vision_config.spatial_merge_size ** 2
    ids = torch.tensor([[*text, config.vision_start_token_id, *[config.image_token_id] * tokens,
                         config.vision_end_token_id, 7]])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), **image,
            "mm_token_type_ids": (ids == config.image_token_id).int()}


def llava_prompt(config, images: int, text: list[int], seed: int) -> dict[str, torch.Tensor]:
    """A processor-like LLaVA prompt: `text`, then per image its patch tokens, then 9."""
    vision = config.vision_config
    patches = (vision.image_size // vision.patch_size) ** 2
    ids = torch.tensor([[*text, *[config.image_token_index] * (patches * images), 9]])
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randn(images, vision.num_channels, vision.image_size, vision.image_size, generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels}


#: case -> (model, how to build the prompt from the config)
PROMPTS = {
    "qwen2_vl-4x4-short": ("qwen2_vl", lambda c: qwen2_vl_prompt(c, (1, 4, 4), [1, 5], seed=11)),
    "qwen2_vl-6x8-long": ("qwen2_vl", lambda c: qwen2_vl_prompt(c, (1, 6, 8), [1, 5, 17, 42, 3, 8, 30], seed=12)),
    "llava-1-image-short": ("llava", lambda c: llava_prompt(c, 1, [1, 5], seed=13)),
    "llava-2-images-long": ("llava", lambda c: llava_prompt(c, 2, [1, 5, 17, 42, 3, 8, 30], seed=14)),
}


def _image_inputs(prompt: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in prompt.items() if k in ("pixel_values", "image_grid_thw")}


def _eager_tokens(model, prompt: dict[str, torch.Tensor]) -> list[int]:
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, prompt["input_ids"].shape[1]:].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", list(PROMPTS))
def test_greedy_tokens_from_an_image_equal_generate(saved_generation, fmt, case):
    require_backend(fmt)
    name, make = PROMPTS[case]
    saved = saved_generation(fmt, name)
    prompt = make(saved.model.config)
    runner = GenerationRunner.load(saved.directory)
    result = runner.generate(prompt["input_ids"], max_new_tokens=NEW_TOKENS, eos_token_id=None,
                             **_image_inputs(prompt))
    assert result.tokens == _eager_tokens(saved.model, prompt)


@pytest.mark.slow
def test_hfexport_generate_with_image_inputs_in_a_fresh_process(saved_generation, tmp_path):
    """The user's path: the processor's arrays in an .npz, `hfexport generate` in its own process."""
    require_backend("onnx")
    saved = saved_generation("onnx", "qwen2_vl")
    prompt = PROMPTS["qwen2_vl-6x8-long"][1](saved.model.config)
    arrays = tmp_path / "image.npz"
    np.savez(arrays, **{k: v.numpy() for k, v in _image_inputs(prompt).items()})
    ids = ",".join(str(t) for t in prompt["input_ids"][0].tolist())
    done = subprocess.run([sys.executable, "-m", "hfexport", "generate", str(saved.directory), "--prompt-ids", ids,
                           "--image-inputs", str(arrays), "--max-new-tokens", str(NEW_TOKENS), "--min-new-tokens",
                           str(NEW_TOKENS), "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["tokens"] == _eager_tokens(saved.model, prompt)


@pytest.mark.slow
def test_image_tokens_that_do_not_match_the_image_are_refused(saved_generation):
    saved = saved_generation("dynamo", "qwen2_vl")
    prompt = PROMPTS["qwen2_vl-4x4-short"][1](saved.model.config)
    runner = GenerationRunner.load(saved.directory)
    with pytest.raises(ExportError, match="4 image tokens but the image gives 12 feature rows"):
        runner.generate(prompt["input_ids"], max_new_tokens=2,
                        **_image_inputs(PROMPTS["qwen2_vl-6x8-long"][1](saved.model.config)))
