"""An image-text generation export as ExecuTorch's `MultimodalRunner` loads it (LLaVA).

```
out/tiny-llava/                          hfexport export DIR --format executorch --generate
  multimodal.pte                         one program, three methods and the LLM runner's metadata:
    vision_encoder(pixel_values [1, 3, H, W] float32)   -> image features [1, patches, hidden]
    token_embedding(input_ids [1, q] int64)             -> embeddings [1, q, hidden]
    text_decoder(embeddings [1, q, hidden], input_pos [1] int64) -> logits [1, 1, vocab]
      (the key/value cache in the program, as `llm.LlmProgram` holds it; q: 1 .. max cache)
    get_max_seq_len, get_max_context_len, get_vocab_size, get_bos_id, get_eos_ids, use_kv_cache,
    use_sdpa_with_kv_cache, enable_dynamic_shape
  tokenizer.json                         what the runner decodes tokens with (and encodes text inputs)
  image_encoder.pte, text_embeddings.pte, language_model.pte, lm_head.pte, decode.pte, ... (`hfexport generate`)
```
`executorch.extension.llm.runner.MultimodalRunner("multimodal.pte", "tokenizer.json"[, "multimodal.ptd"])`, then
`generate_hf(runner, processor(images=..., text=...), config, image_token_id=...)`:
`multimodal_runner.run_multimodal_runner` runs it.

# NOTE: what MultimodalRunner reads, from executorch's source at v1.4.1
# (extension/llm/runner/constants.h, multimodal_prefiller.cpp, multimodal_decoder_runner.h,
# multimodal_runner.cpp, llm_runner_helper.cpp, util.h, image.h, __init__.py): the method names
# above; each input of the prompt is prefilled in turn at the running position, text or token ids
# through `token_embedding`, an image through `vision_encoder`, then `text_decoder(output,
# input_pos)` on that piece (a second input of one element: the start position); the image
# method's first input's dtype (float32 or uint8, checked against the image given) and rank (4
# adds the batch axis) decide how the image is passed, unresized and unnormalized: so the
# processor's float `pixel_values` go in as they are, and the runner's features equal the
# model's on the same processor output. `generate_hf` splits a processor's `input_ids` at its one
# run of `image_token_id` (text before, image, text after); the run must be as long as the
# vision method's output rows, which the processor makes it. Decoding feeds one token at a time
# through `token_embedding` and `text_decoder`, greedy at temperature 0, and stops at
# `get_eos_ids` (the Python bindings expose no `ignore_eos`).
#
# NOTE: one program rather than the components because the runner opens one `.pte`; its three
# methods are captured here, in the backend (`method_programs`), and lowered together in
# `ExecutorchExporter._convert`: the export pipeline captures and validates `text_decoder` (the
# module's `forward`) as any component; the two small methods are the model's own modules
# (`models.llava.LlavaVisionEmbeddings`, the embedding table), and the runner's tokens in
# tests/backends/executorch/test_multimodal.py tie all three to eager `generate`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from .llm import LlmProgram

__all__ = ["MultimodalProgram", "EmbeddedLlmProgram", "RUNNER", "PROGRAM", "DECODER_METHOD",
           "multimodal_refusal", "multimodal_component", "multimodal_package", "method_programs"]

logger = logging.getLogger("hfexport")

#: The runner of the manifest's `runtime_package` entry of an image-text folder (`manifest.RUNNERS`).
RUNNER = "MultimodalRunner"
#: The component (and file stem) of the program.
PROGRAM = "multimodal"
#: The method the export pipeline captures and validates (`MultimodalProgram.forward`).
DECODER_METHOD = "text_decoder"


class EmbeddedLlmProgram(LlmProgram):
    """`LlmProgram` on embeddings: `forward(inputs_embeds [1, q, hidden], input_pos [1])` ->
    `{"logits": [1, 1, vocab]}`, the model's own forward on `inputs_embeds` with its cache in the
    program's buffers (what `MultimodalRunner` calls `text_decoder`)."""

    def forward(self, inputs_embeds: torch.Tensor, input_pos: torch.Tensor) -> dict[str, torch.Tensor]:
        """`{"logits": [1, 1, vocab]}` of the last of `inputs_embeds`, written at `input_pos[0]` .. `+ q`."""
        return self._step(input_pos, inputs_embeds=inputs_embeds)

    def dynamic_shapes(self) -> dict[str, Any]:
        """Any number of embeddings up to the cache's length, one start position."""
        return {"inputs_embeds": {1: torch.export.Dim("tokens", min=1, max=self.max_cache_len)}, "input_pos": None}


class _TokenEmbedding(torch.nn.Module):
    """`input_ids [1, q]` -> the model's input embeddings `[1, q, hidden]` (`token_embedding`)."""

    def __init__(self, table: torch.nn.Module):
        super().__init__()
        self.table = table

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.table(input_ids)


class MultimodalProgram(torch.nn.Module):
    """LLaVA as the three methods of `MultimodalRunner`'s program (the module note): `forward` is
    `text_decoder`; `methods()` gives the other two, each with its sample and dynamic shapes.

    Args:
        model: a `LlavaForConditionalGeneration`.
        pixel_values: the sample image `[1, 3, H, W]` (the processor's size, fixed in the program).
        max_cache_len: the cache's length in tokens (image features, prompt and new tokens together).

    Raises:
        PrepareError: the language model cannot hold its cache in the program (`LlmProgram`).
    """

    def __init__(self, model: Any, pixel_values: torch.Tensor, max_cache_len: int):
        super().__init__()
        from ...models.llava import LlavaVisionEmbeddings

        self.decoder = EmbeddedLlmProgram(model, max_cache_len)
        self.vision = LlavaVisionEmbeddings(model)
        self.embedding = _TokenEmbedding(model.get_input_embeddings())
        self.pixel_values = pixel_values[:1]
        self.max_cache_len = int(max_cache_len)

    def forward(self, inputs_embeds: torch.Tensor, input_pos: torch.Tensor) -> dict[str, torch.Tensor]:
        """`text_decoder`: `EmbeddedLlmProgram.forward`."""
        return self.decoder(inputs_embeds, input_pos)

    def dynamic_shapes(self) -> dict[str, Any]:
        """The `text_decoder` method's (`EmbeddedLlmProgram.dynamic_shapes`)."""
        return self.decoder.dynamic_shapes()

    def methods(self) -> dict[str, tuple[torch.nn.Module, dict[str, Any], dict[str, Any] | None]]:
        """`{method: (module, sample kwargs, dynamic shapes)}` of `vision_encoder` and `token_embedding`."""
        tokens = torch.export.Dim("tokens", min=1, max=self.max_cache_len)
        return {"vision_encoder": (self.vision, {"pixel_values": self.pixel_values}, None),
                "token_embedding": (self.embedding, {"input_ids": torch.tensor([[1, 2]])}, {"input_ids": {1: tokens}})}

    def constant_methods(self) -> dict[str, Any]:
        """The LLM runner's metadata (`LlmProgram.constant_methods`)."""
        return self.decoder.constant_methods()

    def summary(self) -> dict[str, Any]:
        """What the record says (`record.details["multimodal_program"]`)."""
        return {"methods": [DECODER_METHOD, *self.methods()], "image": list(self.pixel_values.shape),
                **self.decoder.plan_summary(), "constant_methods": self.constant_methods()}


def method_programs(model: MultimodalProgram) -> dict[str, Any]:
    """`{method: ExportedProgram}` of `model`'s methods besides `text_decoder` (`torch.export`,
    under the patches the caller's export applies)."""
    out = {}
    with torch.no_grad():
        for name, (module, sample, dynamic) in model.methods().items():
            out[name] = torch.export.export(module, (), sample, dynamic_shapes=dynamic, strict=False)
    return out


def multimodal_refusal(model_config: Any, config: Any) -> str | None:
    """Why the folder of an image-text generation export (its `model_config`, the export's
    `config`) gets no `MultimodalRunner` program, or None."""
    if getattr(model_config, "model_type", None) != "llava":
        return (f"MultimodalRunner programs are made for LLaVA only; model_type "
                f"{getattr(model_config, 'model_type', None)!r} keeps the components, which `hfexport generate` runs")
    if getattr(config, "llm_runner", None) is False:
        return "llm_runner=False (--no-llm-runner): the components only, no program for ExecuTorch's runners"
    if getattr(config, "quantizer", None) is not None:
        return ("a quantized export: the program's vision_encoder and token_embedding methods are not quantized "
                "with its text_decoder; export without quantization for MultimodalRunner")
    if not isinstance(model_config.vision_feature_layer, int):
        return "several vision feature layers (vision_feature_layer is a list): the vision_encoder method takes one"
    return None


def multimodal_component(model: Any, components: dict[str, Any], max_cache_len: int) -> tuple[Any, str | None]:
    """`((MultimodalProgram, kwargs), None)` for an image-text model's `components` (from
    `decompose_for_generation`), sampled on the prompt's embeddings from position 0; or
    `(None, why)` where the language model cannot hold its cache in the program."""
    from ...errors import PrepareError

    pixel_values = components["image_encoder"][1]["pixel_values"]
    embed_module, embed_kwargs = components["text_embeddings"]
    with torch.no_grad():
        embeddings = embed_module(**embed_kwargs)[:1]
    if embeddings.shape[1] >= max_cache_len:
        return None, (f"the sample prompt's {embeddings.shape[1]} tokens do not fit the cache of {max_cache_len}: "
                      "export with --max-sequence-length N")
    try:
        program = MultimodalProgram(model, pixel_values, max_cache_len)
    except PrepareError as error:
        return None, str(error).split("\nWhat to do:")[0]
    return (program, {"inputs_embeds": embeddings, "input_pos": torch.tensor([0])}), None


def multimodal_package(folder: Path, artifacts: dict[str, Any], context: Any, why: str | None) -> dict[str, Any]:
    """The manifest's `runtime_package` entry of an image-text generation export folder: the
    files `MultimodalRunner` reads (`multimodal.pte`, its `.ptd`, the `tokenizer.json` placed
    beside it), and the program's methods and image input, or why it cannot open the folder;
    `{}` for any other export."""
    from ...folder.manifest import runtime_package_entry
    from ...capture.record import record_of
    from .llm_export import runner_tokenizer

    if "image_encoder" not in artifacts:
        return {}
    if PROGRAM not in artifacts:
        return runtime_package_entry(RUNNER, why=why or f"the export has no {PROGRAM} program")
    placed = runner_tokenizer(folder, context.tokenizer)
    summary = record_of(artifacts[PROGRAM]).details.get("multimodal_program", {})
    data = f"{PROGRAM}.ptd" if f"{PROGRAM}.ptd" in context.component_files.get(PROGRAM, []) else None
    settings = {"program": f"{PROGRAM}.pte", "data": data, "methods": summary.get("methods"),
                "image": {"input": "pixel_values", "shape": summary.get("image"), "dtype": "float32",
                          "given_as": "the processor's pixel_values (resized and normalized)"},
                "image_token_id": int(getattr(context.model_config, "image_token_index")),
                "max_cache_len": summary.get("max_cache_len")}
    if placed["tokenizer"] is None:
        logger.warning("the export folder is not a MultimodalRunner folder: it was given no tokenizer")
        return runtime_package_entry(RUNNER, why="the export was given no tokenizer: MultimodalRunner needs "
                                     "tokenizer.json", settings=settings)
    return runtime_package_entry(RUNNER, files=[*context.component_files.get(PROGRAM, []), placed["tokenizer"]],
                                 settings=settings)
