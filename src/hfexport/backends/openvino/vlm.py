"""An image-text generation export as OpenVINO GenAI's `VLMPipeline` takes it (LLaVA, Qwen2-VL).

```
out/tiny-llava/                                 hfexport export DIR --format openvino --generate
  openvino_vision_embeddings_model.xml/.bin     pixel_values -> the projected image features [batch, patches, hidden]
  openvino_text_embeddings_model.xml/.bin       input_ids -> embeddings (the `text_embeddings` component)
  openvino_language_model.xml/.bin              stateful: inputs_embeds, attention_mask, position_ids, beam_idx -> logits
  openvino_tokenizer.xml/.bin, openvino_detokenizer.xml/.bin
  preprocessor_config.json                      the image processor's settings (the export's processor or the model folder's)
  config.json, generation_config.json, image_encoder.xml, language_model.xml, decode.xml, ... (`hfexport generate`)
```
`openvino_genai.VLMPipeline(out, "CPU", INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32")`.

# NOTE: what VLMPipeline reads, from openvino.genai's source (src/cpp/src/visual_language/,
# llava/classes.cpp, vision_encoder.cpp, embedding_model.cpp, pipeline.cpp; read at the 2026.4
# line, run on 2026.4.1): `config.json`'s `model_type` picks the class ("llava") and
# `vision_config.patch_size`; `preprocessor_config.json`'s `size.shortest_edge`, `crop_size`,
# `image_mean`, `image_std` drive its own C++ resize, center crop and normalisation; the vision
# model is fed by name (`pixel_values`) and must have one output, whose row count is the number of
# `<image>` tokens it writes into the prompt (followed by "\n"); the image token id is the
# tokenizer's id of the string `<image>` (which must be the config's `image_token_index`); the
# text embeddings model is fed and read by position; the language model is the stateful layout
# LLMPipeline's is (`stateful.py`), with `inputs_embeds` for `input_ids`, and it both prefills
# and decodes. Those two models are added to the components `hfexport generate` runs (which keep
# their names and files), rather than replacing them: the runner's prefill merges features
# between graphs and validates each one (`generation/multimodal.py`).
#
# NOTE: the vision model is `models.llava.LlavaVisionEmbeddings` (the tower, the feature layer
# and the projector in one graph), shared with ExecuTorch's multimodal program.
#
# NOTE: Qwen2-VL (`qwen2vl/classes.cpp`, same line): the tower is split in two. Its C++ resizes
# the image (`smart_resize` to multiples of patch*merge within `min_pixels`/`max_pixels`, or
# `size.shortest_edge`/`size.longest_edge`; bicubic, in a graph it patches in front of the vision
# model by default, `VISION_PREPROCESS=CPP` for its C++ resize), normalizes it and cuts the
# flattened patches `[t*h*w, C*T*P*P]` as transformers' processor does; it feeds them to
# `openvino_vision_embeddings_model.xml`'s one input (named `hidden_states`; it replaces that
# parameter) and reads one output, the patch embeddings. `openvino_vision_embeddings_merger_model.xml`
# takes `hidden_states` (those embeddings, all images concatenated), `attention_mask`
# `[1, N, N]` (0 inside an image, -inf across) and `rotary_pos_emb` `[N, D]` (the rows' and
# columns' angles, theta 10000, D read from the input's declared shape, so static), and outputs
# the merged features, one row per `<|image_pad|>`. The language model takes M-RoPE's
# `position_ids` `[3, batch, sequence]` (VLMPipeline computes them as `get_rope_index` does and
# adds the rope delta on each decode step). `<|vision_start|><|vision_end|><|image_pad|><|video_pad|>`
# are looked up in the tokenizer (`add_special_tokens=False`); a prompt without
# `<|vision_start|><|image_pad|><|vision_end|>` gets it in front.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from ...models.llava import LlavaVisionEmbeddings
from ...validation.inputs import register_resizer

__all__ = ["VLM_STEMS", "RUNNER", "QWEN2_VL_IMAGE_TAG", "vlm_components", "vlm_refusal", "vlm_folder_files",
           "qwen2_vl_merger_inputs", "resize_qwen2_vl_merger"]

logger = logging.getLogger("hfexport")

#: component -> the file stem `VLMPipeline` opens
VLM_STEMS = {"vision_embeddings": "openvino_vision_embeddings_model",
             "vision_embeddings_merger": "openvino_vision_embeddings_merger_model",
             "text_embeddings": "openvino_text_embeddings_model",
             "vlm_language_model": "openvino_language_model"}
#: the runner of the manifest's `runtime_package` entry of an image-text folder (`manifest.RUNNERS`)
RUNNER = "VLMPipeline"
#: the image placeholder `VLMPipeline` 2026.4.1 writes into a LLaVA prompt (`VLMConfig::im_start`)
IMAGE_TAG = "<image>"
#: the image placeholder a Qwen2-VL prompt holds (`InputsEmbedderQwen2VL::NATIVE_TAG`), put in
#: front of a prompt without one
QWEN2_VL_IMAGE_TAG = "<|vision_start|><|image_pad|><|vision_end|>"
#: the model types `VLMPipeline` folders are made for
SERVED = ("llava", "qwen2_vl")
#: Qwen2-VL's vision tokens, as `VLMPipeline` looks them up -> the config attribute with their id
_QWEN2_VL_TOKENS = {"<|vision_start|>": "vision_start_token_id", "<|vision_end|>": "vision_end_token_id",
                    "<|image_pad|>": "image_token_id", "<|video_pad|>": "video_token_id"}
_PROCESSOR = "preprocessor_config.json"


def vlm_refusal(model_config: Any, config: Any) -> str | None:
    """Why the folder of an image-text model's generation export (its `model_config`, the export's
    `config`) gets no `VLMPipeline` models, or None: a LLaVA (one feature layer) or Qwen2-VL
    (two frames per patch, vision rotary theta 10000) model, stateful, dynamic shapes."""
    model_type = getattr(model_config, "model_type", None)
    if model_type not in SERVED:
        return (f"VLMPipeline folders are made for {' and '.join(SERVED)} only; model_type "
                f"{model_type!r} keeps the components, which `hfexport generate` runs")
    if not getattr(config, "stateful", False):
        return "OpenVINOConfig(stateful=False): VLMPipeline's language model keeps its cache as state"
    if not getattr(config, "dynamic", False) and getattr(config, "dynamic_shapes", None) is None:
        return "a static export: VLMPipeline feeds prompts and images of any size; export with dynamic=True"
    if model_type == "qwen2_vl":
        return _qwen2_vl_refusal(model_config.vision_config)
    if not isinstance(model_config.vision_feature_layer, int):
        return ("several vision feature layers (vision_feature_layer is a list): VLMPipeline's LLaVA takes one "
                "vision model output")
    return None


def _qwen2_vl_refusal(vision: Any) -> str | None:
    """Why `VLMPipeline` 2026.4.1 would compute a Qwen2-VL tower's inputs otherwise than the model."""
    if vision.temporal_patch_size != 2:
        return (f"vision_config.temporal_patch_size={vision.temporal_patch_size}: VLMPipeline's Qwen2-VL "
                "cuts patches of 2 frames only")
    theta = (getattr(vision, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    if theta != 10000.0:
        return (f"the vision tower's rope_theta is {theta}: VLMPipeline computes the merger's rotary_pos_emb "
                "with theta 10000")
    return None


class Qwen2VLPatchEmbeddings(torch.nn.Module):
    """Flattened patches `hidden_states` `[patches, C*T*P*P]` -> Qwen2-VL's patch embeddings
    `[patches, embed_dim]`: the tower's `patch_embed` (`openvino_vision_embeddings_model`)."""

    def __init__(self, model: Any):
        super().__init__()
        self.patch_embed = model.model.visual.patch_embed

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The embeddings of every patch."""
        return self.patch_embed(hidden_states)


class Qwen2VLMerger(torch.nn.Module):
    """The rest of Qwen2-VL's tower, on `VLMPipeline`'s inputs (`openvino_vision_embeddings_merger_model`):
    the blocks over the patch embeddings `hidden_states` `[N, embed_dim]`, attending within an
    image by the additive `attention_mask` `[1, N, N]`, with rotary angles `rotary_pos_emb`
    `[N, head_dim / 2]` (rows' then columns'), then the merger: `[N / merge**2, hidden]`.

    Written from transformers 5.24's `Qwen2VisionTransformerPretrainedModel.forward` and
    `VisionAttention.forward` with a mask for the per-image split (`models/qwen2_vl.py` does the
    same from `cu_seqlens` for the one-graph tower)."""

    def __init__(self, model: Any):
        super().__init__()
        self.tower = model.model.visual

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor,
                rotary_pos_emb: torch.Tensor) -> torch.Tensor:
        """The merged features of the patches (one row per `<|image_pad|>`)."""
        import importlib

        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        module = importlib.import_module("transformers.models.qwen2_vl.modeling_qwen2_vl")
        angles = torch.cat([rotary_pos_emb, rotary_pos_emb], dim=-1)
        cos, sin = angles.cos(), angles.sin()
        mask = attention_mask[0][None, None].to(hidden_states.dtype)
        patches = hidden_states.shape[0]
        for block in self.tower.blocks:
            attn = block.attn
            query, key, value = (attn.qkv(block.norm1(hidden_states)).reshape(patches, 3, attn.num_heads, -1)
                                 .permute(1, 0, 2, 3).unbind(0))
            query, key = module.apply_rotary_pos_emb_vision(query, key, cos, sin)
            query, key, value = (t.transpose(0, 1).unsqueeze(0) for t in (query, key, value))
            attention = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation,
                                                              module.eager_attention_forward)
            output, _ = attention(attn, query, key, value, attention_mask=mask, scaling=attn.scaling,
                                  dropout=0.0, is_causal=False)
            hidden_states = hidden_states + attn.proj(output.reshape(patches, -1).contiguous())
            hidden_states = hidden_states + block.mlp(block.norm2(hidden_states))
        return self.tower.merger(hidden_states)


@register_resizer("Qwen2VLMerger")
def resize_qwen2_vl_merger(inputs: dict[str, Any], step: int) -> dict[str, Any]:
    """The merger's inputs with `step` more images, each a copy of the first image's first frame
    (its patch embeddings and rotary rows, attending only within itself).

    # NOTE: the patch count of each image is tied to the merge (a multiple of `merge**2`) and to
    # the mask's blocks, which a generic resize of every size (N + 2, or 1) breaks: eager refuses
    # those inputs, so validation could not compare the artifact at any other size. Whole images
    # are what `VLMPipeline` feeds it; the first block of `attention_mask` is the first frame.
    """
    mask, hidden, rotary = inputs["attention_mask"], inputs["hidden_states"], inputs["rotary_pos_emb"]
    first, patches = int((mask[0, 0] == 0).sum()), mask.shape[-1]
    total = patches + step * first
    grown = torch.full((mask.shape[0], total, total), float("-inf"), dtype=mask.dtype)
    grown[:, :patches, :patches] = mask
    for start in range(patches, total, first):
        grown[:, start:start + first, start:start + first] = 0.0
    return {**inputs, "hidden_states": torch.cat([hidden, hidden[:first].repeat(step, 1)]),
            "attention_mask": grown, "rotary_pos_emb": torch.cat([rotary, rotary[:first].repeat(step, 1)])}


def qwen2_vl_merger_inputs(config: Any, grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
    """`attention_mask` and `rotary_pos_emb` for images of patch grids `grid_thw` `(images, 3)`,
    as `VLMPipeline` 2026.4.1 computes them (`get_attention_mask`, `get_rotary_pos_emb`)."""
    from ...models.qwen2_vl import vision_patch_layout

    vision = config.vision_config
    patches = int((grid_thw[:, 0] * grid_thw[:, 1] * grid_thw[:, 2]).sum())
    position_ids, _ = vision_patch_layout(grid_thw, patches, vision.spatial_merge_size)
    dim = vision.embed_dim // vision.num_heads // 2
    inv_freq = 1.0 / 10000.0 ** (torch.arange(dim // 2, dtype=torch.float) / (dim // 2))
    rotary = (position_ids[..., None].float() * inv_freq).flatten(1)  # [N, rows' dim/2 | columns' dim/2]
    frame = torch.repeat_interleave(torch.arange(int(grid_thw[:, 0].sum())),
                                    (grid_thw[:, 1] * grid_thw[:, 2]).repeat_interleave(grid_thw[:, 0]))
    mask = torch.full((1, patches, patches), float("-inf"))
    mask[0][frame[:, None] == frame[None, :]] = 0.0
    return {"attention_mask": mask, "rotary_pos_emb": rotary}


class EmbeddedLanguageModel(torch.nn.Module):
    """The language model and head on embeddings with a cache: what `VLMPipeline` prefills and
    decodes with (logits at every position; the cache comes back as `cache`, made state)."""

    def __init__(self, model: Any):
        super().__init__()
        self.language_model, self.lm_head = model.get_decoder(), model.get_output_embeddings()

    def forward(self, inputs_embeds, attention_mask, position_ids, past_key_values):
        """`{"logits", "cache"}` for the new tokens' `inputs_embeds` after `past_key_values`."""
        from .patches import fully_masked_rows_left_unzeroed

        # as LLMPipeline's model (`genai.py`): PagedAttention (`ATTENTION_BACKEND="PA"`) drops the
        # `attention_mask` that zeroing a fully masked row reads
        with fully_masked_rows_left_unzeroed():
            return self._forward(inputs_embeds, attention_mask, position_ids, past_key_values)

    def _forward(self, inputs_embeds, attention_mask, position_ids, past_key_values):
        out = self.language_model(inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                  position_ids=position_ids, past_key_values=past_key_values, use_cache=True)
        return {"logits": self.lm_head(out.last_hidden_state), "cache": out.past_key_values}


def vlm_components(model: Any, components: dict[str, Any]) -> dict[str, Any]:
    """The models `VLMPipeline` needs besides `components` (an image-text model's, from
    `decompose_for_generation`): `vision_embeddings` on the sample's pixels (Qwen2-VL: its patch
    embeddings, then `vision_embeddings_merger` on them), and `vlm_language_model` on 3 new tokens
    after the sample prompt's cache (so the query and cache axes both stay symbolic)."""
    from transformers import DynamicCache

    qwen = model.config.model_type == "qwen2_vl"
    vision = _qwen2_vl_vision(model, components["image_encoder"][1]) if qwen else {
        "vision_embeddings": (LlavaVisionEmbeddings(model),
                              {"pixel_values": components["image_encoder"][1]["pixel_values"]})}
    lm = EmbeddedLanguageModel(model)
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    with torch.no_grad():
        embeddings = components["text_embeddings"][0](components["text_embeddings"][1]["input"])
        past, new = embeddings.shape[1] - 3, 3  # an image prompt holds one token per image feature: past >= 1
        lm.language_model(inputs_embeds=embeddings[:, :past], position_ids=torch.arange(past)[None],
                          past_key_values=cache, use_cache=True)
    positions = torch.arange(past, past + new)[None].expand(embeddings.shape[0], -1)
    step = {"inputs_embeds": embeddings[:, past:],
            "attention_mask": torch.ones(embeddings.shape[0], past + new, dtype=torch.long),
            # Qwen2-VL: M-RoPE's temporal, height and width positions (text tokens: all three alike)
            "position_ids": positions[None].expand(3, -1, -1) if qwen else positions,
            "past_key_values": cache}
    return {**vision, "vlm_language_model": (lm, step)}


def _qwen2_vl_vision(model: Any, encoder_inputs: dict[str, Any]) -> dict[str, Any]:
    """Qwen2-VL's two vision models on the image encoder's sample (`hidden_states`, `grid_thw`)."""
    patches = Qwen2VLPatchEmbeddings(model)
    with torch.no_grad():
        embeddings = patches(encoder_inputs["hidden_states"])
    merger_inputs = {"hidden_states": embeddings, **qwen2_vl_merger_inputs(model.config, encoder_inputs["grid_thw"])}
    return {"vision_embeddings": (patches, {"hidden_states": encoder_inputs["hidden_states"]}),
            "vision_embeddings_merger": (Qwen2VLMerger(model), merger_inputs)}


def vlm_folder_files(artifacts: dict[str, Any], directory: Path, context: Any, refusal: str | None) -> dict[str, Any]:
    """For an image-text generation export, write what `VLMPipeline` reads besides the models
    (the converted tokenizer, the image processor's config) into `directory` (the staged folder)
    and return the manifest's `runtime_package` entry: the files `VLMPipeline` reads, or why it
    cannot open the folder."""
    from ...folder.manifest import runtime_package_entry
    from ...capture.record import record_of
    from .genai import convert_tokenizer_for_genai

    if "image_encoder" not in artifacts:
        return {}
    if refusal is not None or "vision_embeddings" not in artifacts:
        return runtime_package_entry(RUNNER, why=refusal or "the export has no vision_embeddings model")
    properties = record_of(artifacts["vlm_language_model"]).details.get("compile_properties") or {}
    settings: dict[str, Any] = {"models": {name: f"{stem}.xml" for name, stem in VLM_STEMS.items()
                                           if name in artifacts}, "properties": dict(properties)}
    why = _tokenizer_refusal(context)
    # the processor the export carries (its image processor's settings), else the model folder's file
    image_processor = getattr(getattr(context, "processor", None), "image_processor", None)
    processor = None if why is not None else image_processor or _processor_config(
        getattr(context.model_config, "_name_or_path", None))
    if why is None and processor is None:
        why = (f"no {_PROCESSOR} beside the model ({getattr(context.model_config, '_name_or_path', None)!r}) and "
               "no processor given: VLMPipeline resizes, crops and normalizes images by it; export from a folder "
               "where the processor was saved (processor.save_pretrained), or a hub model whose processor is in "
               "the local cache")
    if why is None:
        try:
            files = convert_tokenizer_for_genai(context.tokenizer, directory)
        except Exception as error:  # noqa: BLE001 - the export stands; the manifest and a warning say why
            why = f"openvino-tokenizers could not convert the tokenizer: {type(error).__name__}: {error}"
    if why is not None:
        logger.warning("the export folder is not a VLMPipeline folder: %s", why)
        return runtime_package_entry(RUNNER, why=why, settings=settings)
    if isinstance(processor, Path):
        shutil.copyfile(processor, directory / _PROCESSOR)
    elif not (directory / _PROCESSOR).is_file():  # the processor's own save may have written it
        processor.to_json_file(directory / _PROCESSOR)
    models = [f for name in VLM_STEMS if name in artifacts for f in context.component_files.get(name, [])]
    return runtime_package_entry(RUNNER, files=[*models, *(f.name for f in files), _PROCESSOR], settings=settings)


def _processor_config(name_or_path: str | None) -> Path | None:
    """The image processor config of the model loaded from `name_or_path`: in its folder, or a hub
    model's in the local Hugging Face cache (never downloaded here); None where there is none."""
    from ...folder.output_folder import model_folder

    folder = model_folder(name_or_path or "")
    if folder is not None:
        return folder / _PROCESSOR if (folder / _PROCESSOR).is_file() else None
    if not name_or_path:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        cached = try_to_load_from_cache(name_or_path, _PROCESSOR)
    except ValueError:  # not a hub id either (a path that does not exist): no processor config to find
        return None
    return Path(cached) if isinstance(cached, str) else None


def _tokenizer_refusal(context: Any) -> str | None:
    """Why `context`'s tokenizer cannot serve `VLMPipeline`'s prompt (LLaVA's `<image>`, Qwen2-VL's
    vision tokens), or None."""
    tokenizer = context.tokenizer
    if tokenizer is None:
        return "no tokenizer was given: VLMPipeline needs openvino_tokenizer.xml"
    if getattr(context.model_config, "model_type", None) == "qwen2_vl":
        for text, attribute in _QWEN2_VL_TOKENS.items():
            token = getattr(context.model_config, attribute, None)
            ids = tokenizer(text, add_special_tokens=False).input_ids
            if ids != [token]:
                return (f"the tokenizer encodes {text!r} as {ids}, not as the token {token} ({attribute}): "
                        f"VLMPipeline looks Qwen2-VL's vision tokens up by text; add {text!r} to the "
                        "tokenizer as a special token with that id")
        return None
    token = getattr(context.model_config, "image_token_index", None)
    ids = tokenizer(IMAGE_TAG, add_special_tokens=False).input_ids
    if not ids or ids[-1] != token:
        return (f"the tokenizer encodes {IMAGE_TAG!r} as {ids}, not as the image token {token} "
                f"(image_token_index): VLMPipeline writes {IMAGE_TAG!r} once per image feature; "
                f"add {IMAGE_TAG!r} to the tokenizer as a special token with that id")
    return None
