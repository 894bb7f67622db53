"""The OpenVINO generation exports of LLaVA and Qwen2-VL are OpenVINO GenAI `VLMPipeline` folders:
the pipeline, in a fresh process, given text and an image, generates the token ids of eager
`generate` on the same prompt (LLaVA: `<image>` once per image feature, then "\\n", as `VLMPipeline`
writes it; Qwen2-VL: the processor's expansion of `<|vision_start|><|image_pad|><|vision_end|>`)
and the image processor's pixels; an image-text model it does not serve says why in the manifest."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("openvino")
pytest.importorskip("openvino_genai")
pytest.importorskip("openvino_tokenizers")

from hfexport.backends.openvino.vlm import IMAGE_TAG, QWEN2_VL_IMAGE_TAG  # noqa: E402
from hfexport.presets import build_preset  # noqa: E402

NEW_TOKENS = 8
IMAGE_SIZE = 16  # the tiny LLaVA's tower: 16x16 pixels, 4x4 patches -> 16 image features
#: prompts of two lengths; image contents drawn reproducibly
PROMPTS = ["the quick brown fox", "once upon a time there was a model, hello world, this is a tiny tokenizer"]
DRAW = random.Random(42)
IMAGE_SEEDS = DRAW.sample(range(1000), 2)
#: Qwen2-VL image sizes `(height, width)`, two different patch grids: multiples of 8 (patch 4 x merge 2)
#: within the tiny processor's 64..1024 pixels, which neither transformers' processor nor
#: VLMPipeline resizes (other sizes go through two different bicubic resizes: see docs/runtimes/openvino.md)
QWEN_SIZES = DRAW.sample([(8 * h, 8 * w) for h in range(1, 5) for w in range(1, 5) if h != w], 2)

#: `VLMPipeline` on the folder, greedy, with the precisions the manifest records: token ids per case
_VLM_PIPELINE = """
import json, sys
import numpy as np
import openvino as ov
import openvino_genai as ov_genai
folder, cases, new, backend = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
entry = json.load(open(folder + "/manifest.json"))["runtime_package"]
pipe = ov_genai.VLMPipeline(folder, "CPU", ATTENTION_BACKEND=backend, **entry["settings"]["properties"])

class Ids(ov_genai.StreamerBase):
    def __init__(self):
        super().__init__()
        self.ids = []
    def write(self, token):
        self.ids += token if isinstance(token, list) else [token]
        return ov_genai.StreamingStatus.RUNNING
    def end(self):
        pass

out = []
for prompt, image in cases:
    config = ov_genai.GenerationConfig()
    config.max_new_tokens = config.min_new_tokens = new
    config.do_sample = False
    config.apply_chat_template = False
    ids = Ids()
    pipe.generate(prompt, images=[ov.Tensor(np.array(image, np.uint8)[None])], generation_config=config, streamer=ids)
    out.append([int(t) for t in ids.ids])
print("RESULT " + json.dumps(out))
"""


def _image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def llava_folder(saved_generation):
    """The shared tiny LLaVA OpenVINO export (`tests.generation.exports`), which the export job made
    with its processor (a CLIP image processor at the tower's 16x16, the offline BPE tokenizer with
    `<image>` as the image token): the processor the folder carries is what makes it a
    `VLMPipeline` folder (no model folder to copy `preprocessor_config.json` from)."""
    saved = saved_generation("openvino", "llava")
    manifest = json.loads((saved.directory / "manifest.json").read_text())
    return saved.directory, manifest, saved.model, saved.processor.tokenizer, saved.processor.image_processor


def _prompt(tokenizer, processor, prompt: str, image: np.ndarray) -> dict[str, torch.Tensor]:
    """The processor's output for `prompt` after one image, laid out as `VLMPipeline` 2026.4.1's
    LLaVA lays it out: `<image>` once per image feature (16), then "\\n"."""
    ids = tokenizer(IMAGE_TAG * 16 + "\n" + prompt, return_tensors="pt").input_ids
    pixels = processor(images=image, return_tensors="pt").pixel_values
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pixels}


@pytest.mark.slow  # reads the shared LLaVA OpenVINO export and runs VLMPipeline
@pytest.mark.parametrize("backend", ["PA", "SDPA"])
def test_vlm_pipeline_generates_eagers_tokens(llava_folder, backend):
    """Two image contents × two prompt lengths, on both attention backends: `VLMPipeline`'s
    greedy token ids are eager's."""
    folder, manifest, model, tokenizer, processor = llava_folder
    entry = manifest["runtime_package"]
    assert entry["runner"] == "VLMPipeline" and entry["ready"] is True, entry
    assert set(entry["settings"]["models"].values()) <= set(entry["files"]) <= set(manifest["files"])
    cases = [(prompt, seed) for prompt in PROMPTS for seed in IMAGE_SEEDS]
    got = _run_vlm_pipeline(folder, [(prompt, _image(seed)) for prompt, seed in cases], backend)
    eager = []
    for prompt, seed in cases:
        inputs = _prompt(tokenizer, processor, prompt, _image(seed))
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        eager.append(out[0, inputs["input_ids"].shape[1]:].tolist())
    assert len({tuple(tokens) for tokens in eager}) > 1, "the cases must not all give the same tokens"
    assert got == eager


def _run_vlm_pipeline(folder, cases: list[tuple[str, np.ndarray]], backend: str) -> list[list[int]]:
    """`VLMPipeline`'s greedy token ids on `folder` for each `(prompt, image)`, in a fresh process."""
    done = subprocess.run([sys.executable, "-c", _VLM_PIPELINE, str(folder),
                           json.dumps([[prompt, image.tolist()] for prompt, image in cases]), str(NEW_TOKENS), backend],
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-2000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.slow  # reads the shared Qwen2-VL OpenVINO export and runs VLMPipeline
@pytest.mark.parametrize("backend", ["PA", "SDPA"])
def test_qwen2_vl_vlm_pipeline_generates_eagers_tokens(saved_generation, backend):
    """Two drawn image sizes (different patch grids) × two prompt lengths, on both attention
    backends: `VLMPipeline`'s greedy token ids are eager `generate`'s on the processor's output
    for the same prompt and image (its split tower, M-RoPE positions and rope delta included)."""
    saved = saved_generation("openvino", "qwen2_vl")
    entry = json.loads((saved.directory / "manifest.json").read_text())["runtime_package"]
    assert entry["runner"] == "VLMPipeline" and entry["ready"] is True, entry
    # exported as the CLI exports it, validated: the merger at whole images, as the report says
    merger = json.loads((saved.directory / "report.json").read_text())["components"]["vision_embeddings_merger"]
    assert merger["validation"]["passed"] and "resize_qwen2_vl_merger" in merger["validation"]["note"], merger
    assert entry["settings"]["models"]["vision_embeddings_merger"] == "openvino_vision_embeddings_merger_model.xml"
    assert all((saved.directory / file).is_file() for file in entry["files"])
    cases = [(QWEN2_VL_IMAGE_TAG + prompt, np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8))
             for prompt in PROMPTS for size, seed in zip(QWEN_SIZES, IMAGE_SEEDS)]
    got = _run_vlm_pipeline(saved.directory, cases, backend)
    eager, grids = [], set()
    for prompt, image in cases:
        inputs = saved.processor(images=image, text=prompt, return_tensors="pt")
        grids.add(tuple(inputs["image_grid_thw"][0].tolist()))
        with torch.no_grad():
            out = saved.model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        eager.append(out[0, inputs["input_ids"].shape[1]:].tolist())
    assert len(grids) == 2, grids
    assert len({tuple(tokens) for tokens in eager}) > 1, "the cases must not all give the same tokens"
    assert got == eager


def test_an_image_text_model_vlm_pipeline_does_not_serve_says_why(tmp_path):
    """An image-text architecture without `VLMPipeline` models (Qwen2.5-VL): the manifest's entry
    says the folder is no `VLMPipeline` folder, and why."""
    from transformers import Qwen2_5_VLConfig

    from hfexport import OpenVINOConfig
    from hfexport.backends.openvino.vlm import vlm_folder_files, vlm_refusal

    refusal = vlm_refusal(Qwen2_5_VLConfig(), OpenVINOConfig(dynamic=True))
    entry = vlm_folder_files({"image_encoder": object()}, tmp_path, None, refusal)["runtime_package"]
    assert entry["runner"] == "VLMPipeline" and entry["ready"] is False and "'qwen2_5_vl'" in entry["why"], entry
    assert "llava and qwen2_vl only" in entry["why"] and "keeps the components" in entry["why"]


def test_the_refusals_name_what_to_change():
    """Without exporting: another architecture, a stateless or static export, a tokenizer without
    `<image>` (LLaVA) or the vision tokens (Qwen2-VL), a Qwen2-VL whose patches or rotary angles
    VLMPipeline computes otherwise, and a model without an image processor config each say why."""
    import copy
    from types import SimpleNamespace

    from transformers import Qwen2_5_VLConfig

    from hfexport import OpenVINOConfig
    from hfexport.backends.openvino.vlm import _processor_config, _tokenizer_refusal, vlm_refusal
    from tests.harness import tiny_bpe_tokenizer

    llava, _ = build_preset("llava")
    qwen, _ = build_preset("qwen2_vl")
    dynamic = OpenVINOConfig(dynamic=True)
    assert vlm_refusal(llava.config, dynamic) is None
    assert vlm_refusal(qwen.config, dynamic) is None
    assert "llava and qwen2_vl only; model_type 'qwen2_5_vl'" in vlm_refusal(Qwen2_5_VLConfig(), dynamic)
    assert "stateful=False" in vlm_refusal(qwen.config, OpenVINOConfig(dynamic=True, stateful=False))
    frames = copy.deepcopy(qwen.config)
    frames.vision_config.temporal_patch_size = 3
    assert "temporal_patch_size=3" in vlm_refusal(frames, dynamic)
    theta = copy.deepcopy(qwen.config)
    theta.vision_config.rope_parameters = {**theta.vision_config.rope_parameters, "rope_theta": 500.0}
    assert "theta 10000" in vlm_refusal(theta, dynamic)
    why = _tokenizer_refusal(SimpleNamespace(tokenizer=tiny_bpe_tokenizer(), model_config=qwen.config))
    assert "add '<|vision_start|>' to the tokenizer" in why and str(qwen.config.vision_start_token_id) in why
    assert "stateful=False" in vlm_refusal(llava.config, OpenVINOConfig(dynamic=True, stateful=False))
    assert "dynamic=True" in vlm_refusal(llava.config, OpenVINOConfig())
    why = _tokenizer_refusal(SimpleNamespace(tokenizer=tiny_bpe_tokenizer(), model_config=llava.config))
    assert "add '<image>' to the tokenizer" in why and "120" in why
    assert "no tokenizer" in _tokenizer_refusal(SimpleNamespace(tokenizer=None, model_config=llava.config))
    assert _processor_config(None) is None and _processor_config("/nonexistent/model") is None


def test_qwen2_vl_split_tower_on_vlm_pipelines_inputs_equals_the_tower():
    """Qwen2-VL's two VLMPipeline vision models in eager, fed the mask and rotary angles as
    VLMPipeline 2026.4.1 computes them from the grids: the tower's merged features, for one image
    and for several images of different grids (each image attends only within itself)."""
    from hfexport.backends.openvino.vlm import Qwen2VLMerger, Qwen2VLPatchEmbeddings, qwen2_vl_merger_inputs
    from hfexport.presets import qwen2_vl_image

    model, _ = build_preset("qwen2_vl")
    for grid in ([(1, 4, 6)], [(1, 2, 4), (1, 6, 2), (1, 4, 4)]):
        image = qwen2_vl_image(model.config, grid, seed=DRAW.randrange(1000))
        with torch.no_grad():
            tower = model.model.visual(image["pixel_values"], image["image_grid_thw"]).pooler_output
            embeddings = Qwen2VLPatchEmbeddings(model)(image["pixel_values"])
            merged = Qwen2VLMerger(model)(embeddings, **qwen2_vl_merger_inputs(model.config, image["image_grid_thw"]))
        torch.testing.assert_close(merged, tower, rtol=1e-5, atol=1e-5)


def test_qwen2_vl_merger_resized_as_vlm_pipeline_feeds_it():
    """Issue 50: validation moved every size of the merger's inputs (N + 2 patches, then 1), which
    no image gives and eager refuses, so a correct export was refused. Its registered resizer adds
    whole images (copies of the first frame): the inputs `VLMPipeline` computes for that grid, on
    which the merger gives the tower's features; the report says which shapes were checked."""
    from hfexport.backends.openvino.vlm import (Qwen2VLMerger, Qwen2VLPatchEmbeddings, qwen2_vl_merger_inputs,
                                                resize_qwen2_vl_merger)
    from hfexport.presets import qwen2_vl_image
    from hfexport.validation import RESIZERS

    assert RESIZERS["Qwen2VLMerger"] is resize_qwen2_vl_merger
    model, _ = build_preset("qwen2_vl")
    image = qwen2_vl_image(model.config, [(2, 2, 4), (1, 4, 2)], seed=5)  # two frames, then another image
    grid = image["image_grid_thw"]
    with torch.no_grad():
        embeddings = Qwen2VLPatchEmbeddings(model)(image["pixel_values"])
    sample = {"hidden_states": embeddings, **qwen2_vl_merger_inputs(model.config, grid)}
    resized = resize_qwen2_vl_merger(sample, 2)
    grown = torch.cat([grid, torch.tensor([[1, 2, 4]] * 2)])  # the first image's first frame, twice more
    expected = {"hidden_states": torch.cat([embeddings, embeddings[:8], embeddings[:8]]),
                **qwen2_vl_merger_inputs(model.config, grown)}
    for name, value in expected.items():
        torch.testing.assert_close(resized[name], value, rtol=0, atol=0)
    pixels = torch.cat([image["pixel_values"], image["pixel_values"][:8], image["pixel_values"][:8]])
    with torch.no_grad():
        tower = model.model.visual(pixels, grown).pooler_output
        merged = Qwen2VLMerger(model)(**resized)
    torch.testing.assert_close(merged, tower, rtol=1e-5, atol=1e-5)
