"""An image-text generation export as OpenVINO GenAI's `VLMPipeline` takes it (LLaVA).

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
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from ...models.llava import LlavaVisionEmbeddings

__all__ = ["VLM_STEMS", "VLM_ENTRY", "vlm_components", "vlm_refusal", "vlm_folder_files"]

logger = logging.getLogger("hfexport")

#: component -> the file stem `VLMPipeline` opens
VLM_STEMS = {"vision_embeddings": "openvino_vision_embeddings_model",
             "text_embeddings": "openvino_text_embeddings_model",
             "vlm_language_model": "openvino_language_model"}
#: the manifest's entry on the folder as a `VLMPipeline` folder
VLM_ENTRY = "openvino_genai_vlm"
#: the image placeholder `VLMPipeline` 2026.4.1 writes into a LLaVA prompt (`VLMConfig::im_start`)
IMAGE_TAG = "<image>"
_PROCESSOR = "preprocessor_config.json"


def vlm_refusal(model_config: Any, config: Any) -> str | None:
    """Why the folder of an image-text model's generation export (its `model_config`, the export's
    `config`) gets no `VLMPipeline` models, or None: a LLaVA model, stateful, dynamic shapes, one
    feature layer."""
    if getattr(model_config, "model_type", None) != "llava":
        return (f"VLMPipeline folders are made for LLaVA only; model_type "
                f"{getattr(model_config, 'model_type', None)!r} keeps the components, which "
                "`hfexport generate` runs")
    if not getattr(config, "stateful", False):
        return "OpenVINOConfig(stateful=False): VLMPipeline's language model keeps its cache as state"
    if not getattr(config, "dynamic", False) and getattr(config, "dynamic_shapes", None) is None:
        return "a static export: VLMPipeline feeds prompts and images of any size; export with dynamic=True"
    if not isinstance(model_config.vision_feature_layer, int):
        return ("several vision feature layers (vision_feature_layer is a list): VLMPipeline's LLaVA takes one "
                "vision model output")
    return None


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
    """The two models `VLMPipeline` needs besides `components` (an image-text model's, from
    `decompose_for_generation`): `vision_embeddings` on the sample's pixels, and
    `vlm_language_model` on 3 new tokens after the sample prompt's cache (so the query and cache
    axes both stay symbolic)."""
    from transformers import DynamicCache

    pixel_values = components["image_encoder"][1]["pixel_values"]
    lm = EmbeddedLanguageModel(model)
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    with torch.no_grad():
        embeddings = components["text_embeddings"][0](components["text_embeddings"][1]["input"])
        past, new = embeddings.shape[1] - 3, 3  # an image prompt holds one token per image feature: past >= 1
        lm.language_model(inputs_embeds=embeddings[:, :past], position_ids=torch.arange(past)[None],
                          past_key_values=cache, use_cache=True)
    step = {"inputs_embeds": embeddings[:, past:],
            "attention_mask": torch.ones(embeddings.shape[0], past + new, dtype=torch.long),
            "position_ids": torch.arange(past, past + new)[None].expand(embeddings.shape[0], -1),
            "past_key_values": cache}
    return {"vision_embeddings": (LlavaVisionEmbeddings(model), {"pixel_values": pixel_values}),
            "vlm_language_model": (lm, step)}


def vlm_folder_files(artifacts: dict[str, Any], directory: Path, context: Any, refusal: str | None) -> dict[str, Any]:
    """For an image-text generation export, write what `VLMPipeline` reads besides the models
    (the converted tokenizer, the image processor's config) into `directory` (the staged folder)
    and return the manifest's entry: whether `VLMPipeline` can open the folder, and why not."""
    from ...record import record_of
    from .genai import convert_tokenizer_for_genai

    if "image_encoder" not in artifacts:
        return {}
    if refusal is not None or "vision_embeddings" not in artifacts:
        return {VLM_ENTRY: {"vlm_pipeline": False, "why": refusal or "the export has no vision_embeddings model"}}
    properties = record_of(artifacts["vlm_language_model"]).details.get("compile_properties") or {}
    entry: dict[str, Any] = {"models": {name: f"{stem}.xml" for name, stem in VLM_STEMS.items()},
                             "properties": dict(properties)}
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
        return {VLM_ENTRY: {**entry, "vlm_pipeline": False, "why": why}}
    if isinstance(processor, Path):
        shutil.copyfile(processor, directory / _PROCESSOR)
    elif not (directory / _PROCESSOR).is_file():  # the processor's own save may have written it
        processor.to_json_file(directory / _PROCESSOR)
    return {VLM_ENTRY: {**entry, "vlm_pipeline": True, "tokenizer": [f.name for f in files],
                        "image_processor": _PROCESSOR}}


def _processor_config(name_or_path: str | None) -> Path | None:
    """The image processor config of the model loaded from `name_or_path`: in its folder, or a hub
    model's in the local Hugging Face cache (never downloaded here); None where there is none."""
    from ...output_folder import model_folder

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
    """Why `context`'s tokenizer cannot serve `VLMPipeline`'s LLaVA prompt, or None."""
    tokenizer = context.tokenizer
    if tokenizer is None:
        return "no tokenizer was given: VLMPipeline needs openvino_tokenizer.xml"
    token = getattr(context.model_config, "image_token_index", None)
    ids = tokenizer(IMAGE_TAG, add_special_tokens=False).input_ids
    if not ids or ids[-1] != token:
        return (f"the tokenizer encodes {IMAGE_TAG!r} as {ids}, not as the image token {token} "
                f"(image_token_index): VLMPipeline writes {IMAGE_TAG!r} once per image feature; "
                f"add {IMAGE_TAG!r} to the tokenizer as a special token with that id")
    return None
