"""An image-text (LLaVA) or audio-text (Qwen2-Audio) generation export as ExecuTorch's
`MultimodalRunner` loads it.

```
out/tiny-llava/                          hfexport export DIR --format executorch --generate
  multimodal.pte                         one program, three methods and the LLM runner's metadata:
    vision_encoder(pixel_values [1, 3, H, W] float32)   -> image features [1, patches, hidden]
      or, for an audio-text model,
    audio_encoder(input_features [1, bins, frames] float32) -> the clip's rows [1, rows, hidden]
    token_embedding(input_ids [1, q] int64)             -> embeddings [1, q, hidden]
    text_decoder(embeddings [1, q, hidden], input_pos [1] int64) -> logits [1, 1, vocab]
      (the key/value cache in the program, as `llm.LlmProgram` holds it; q: 1 .. max cache)
    get_max_seq_len, get_max_context_len, get_vocab_size, get_bos_id, get_eos_ids, use_kv_cache,
    use_sdpa_with_kv_cache, enable_dynamic_shape
  tokenizer.json                         what the runner decodes tokens with (and encodes text inputs)
  image_encoder.pte, text_embeddings.pte, language_model.pte, lm_head.pte, decode.pte, ... (`hfexport generate`)
```
`executorch.extension.llm.runner.MultimodalRunner("multimodal.pte", "tokenizer.json"[, "multimodal.ptd"])`, then
`generate_hf(runner, processor(images=..., text=...), config, image_token_id=...)`, or for a clip
`runner.generate([make_token_input(ids before), make_audio_input(input_features),
make_token_input(ids after)], config)`: `multimodal_runner.run_multimodal_runner` runs it.

# NOTE: what MultimodalRunner reads, from executorch's source at v1.4.1
# (extension/llm/runner/constants.h, multimodal_prefiller.cpp, multimodal_decoder_runner.h,
# multimodal_runner.cpp, llm_runner_helper.cpp, util.h, image.h, audio.h, pybindings.cpp,
# __init__.py): the method names above; each input of the prompt is prefilled in turn at the
# running position, text or token ids through `token_embedding`, an image through
# `vision_encoder`, a clip through `audio_encoder`, then `text_decoder(output, input_pos)` on that
# piece (a second input of one element: the start position); the image method's first input's
# dtype (float32 or uint8, checked against the image given) and rank (4 adds the batch axis) decide
# how the image is passed, unresized and unnormalized: so the processor's float `pixel_values` go
# in as they are, and the runner's features equal the model's on the same processor output.
# `generate_hf` splits a processor's `input_ids` at its one run of `image_token_id` (text before,
# image, text after); the run must be as long as the vision method's output rows, which the
# processor makes it. Decoding feeds one token at a time through `token_embedding` and
# `text_decoder`, greedy at temperature 0, and stops at `get_eos_ids` (the Python bindings expose
# no `ignore_eos`).
#
# NOTE: audio. `make_audio_input(tensor)` takes preprocessed features `(batch, n_bins, n_frames)`,
# float32 or uint8 (pybindings.cpp), and the prefiller calls `audio_encoder` with that one tensor,
# unchanged (`Audio::toTensor()`, no batch axis added; converted only to bfloat16 where the
# method's input is): nothing else, so no per-frame mask. `make_raw_audio_input` (uint8 samples)
# reaches no method: 1.4.1's prefiller has no branch for raw audio ("Unsupported input type").
# `generate_hf` reads `pixel_values` only: a processor's `input_features` would be dropped, so a
# clip goes in through `generate` with the pieces built by hand (docs/runtimes/executorch.md).
# Qwen2-Audio's tower takes the whole chunk of the feature extractor (30 s; the tiny preset's 1 s,
# 32 frames), which the processor pads to, and transformers 5.24 masks the padded frames from a
# mask built from `feature_attention_mask`, then keeps the rows of the frames heard. With no mask
# given, the program serves one clip length: a clip filling the chunk, which has no padding and
# which transformers calls the tower on with no mask (`create_bidirectional_mask` returns None for
# an all-ones mask), so `audio_encoder` is the tower without a mask, then the projector, giving
# every row. A shorter clip padded with silence to the chunk is such a clip (eager `generate` on
# the padded clip is what the program answers); a prompt with another number of audio tokens,
# or a mask with padding, is refused by `run_multimodal_runner` (the runner itself cannot tell).
# The audio features after padding depend on the whole clip (the log-mel's clamp to its max - 8,
# the window over the clip's end), so a method taking only the frames heard could not rebuild the
# padding the tower sees at the clip's end: a shorter clip cannot be served exactly.
#
# NOTE: one program rather than the components because the runner opens one `.pte`; its three
# methods are captured here, in the backend (`method_programs`), and lowered together in
# `ExecutorchExporter._convert`: the export pipeline captures and validates `text_decoder` (the
# module's `forward`) as any component; the two small methods are the model's own modules
# (`models.llava.LlavaVisionEmbeddings`; the audio tower and projector of the components; the
# embedding table), and the runner's tokens tie all three to eager `generate` (the export job's
# runner check for a clip, `job/runner_check.py`; tests/backends/executorch/test_multimodal.py and
# test_multimodal_audio.py).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .llm import LlmProgram

__all__ = ["MultimodalProgram", "EmbeddedLlmProgram", "EncoderMethod", "AudioEncoderMethod", "RUNNER", "PROGRAM",
           "DECODER_METHOD", "ENCODER_METHODS", "SERVED", "modality_of", "image_encoder_method",
           "audio_encoder_method", "multimodal_refusal", "multimodal_component", "multimodal_package",
           "method_programs"]

logger = logging.getLogger("hfexport")

#: The runner of the manifest's `runtime_package` entry of an image-text or speech folder (`manifest.RUNNERS`).
RUNNER = "MultimodalRunner"
#: The component (and file stem) of the program.
PROGRAM = "multimodal"
#: The method the export pipeline captures and validates (`MultimodalProgram.forward`).
DECODER_METHOD = "text_decoder"
#: modality -> (the generation component its encoder is, the method `MultimodalRunner` calls for it
#: (executorch 1.4.1 constants.h: kVisionEncoderMethod, kAudioEncoderMethod), the processor's input it takes)
ENCODER_METHODS = {"image": ("image_encoder", "vision_encoder", "pixel_values"),
                   "audio": ("audio_encoder", "audio_encoder", "input_features")}
#: The model types whose folder gets the program, with the modality it takes: those whose runner's
#: tokens the tests hold to eager `generate` (tests/backends/executorch/test_multimodal*.py).
SERVED = {"llava": "image", "qwen2_audio": "audio"}


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


class AudioEncoderMethod(torch.nn.Module):
    """`input_features [1, bins, frames]` of a clip filling the feature extractor's chunk -> the
    rows the language model reads `[1, rows, hidden]` (`audio_encoder`): the audio tower without a
    mask, as transformers 5.24's Qwen2-Audio calls it on such a clip (the module note), then the
    projector where the model has one."""

    def __init__(self, tower: torch.nn.Module, projector: torch.nn.Module | None):
        super().__init__()
        self.tower, self.projector = tower, projector

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        """The clip's rows `[1, rows, hidden]`."""
        hidden = self.tower(input_features=input_features).last_hidden_state
        return hidden if self.projector is None else self.projector(hidden)


class EncoderMethod(NamedTuple):
    """The program's image or audio method: its modality (`ENCODER_METHODS`), the module, and its
    sample input (the one tensor the runner passes it)."""

    modality: str
    module: torch.nn.Module
    sample: torch.Tensor

    @property
    def name(self) -> str:
        """The method's name as `MultimodalRunner` calls it."""
        return ENCODER_METHODS[self.modality][1]

    @property
    def input_name(self) -> str:
        """The processor output the method takes."""
        return ENCODER_METHODS[self.modality][2]


def modality_of(names: Any) -> str | None:
    """`"image"` or `"audio"` for components (or artifacts) holding that encoder, else None."""
    return next((modality for modality, (component, _, _) in ENCODER_METHODS.items() if component in names), None)


def image_encoder_method(model: Any, pixel_values: torch.Tensor) -> EncoderMethod:
    """LLaVA's `vision_encoder`: `models.llava.LlavaVisionEmbeddings` on one image of the processor's size."""
    from ...models.llava import LlavaVisionEmbeddings

    return EncoderMethod("image", LlavaVisionEmbeddings(model), pixel_values[:1])


def audio_encoder_method(components: dict[str, Any]) -> EncoderMethod:
    """An audio-text model's `audio_encoder` from its generation `components`: the tower (behind
    its per-frame-mask front, `generation.audio_tower.AudioTowerFront`, in the components) and the
    projector, on one clip of the features' whole chunk."""
    from ...generation.audio_tower import AudioTowerFront
    from ...generation.components import PROJECTOR_NAMES

    encoder, kwargs = components["audio_encoder"]
    tower = encoder.tower if isinstance(encoder, AudioTowerFront) else encoder
    projector = next((components[name][0] for name in PROJECTOR_NAMES if name in components), None)
    return EncoderMethod("audio", AudioEncoderMethod(tower, projector), kwargs["input_features"][:1])


class MultimodalProgram(torch.nn.Module):
    """An image-text or audio-text model as the three methods of `MultimodalRunner`'s program (the
    module note): `forward` is `text_decoder`; `methods()` gives the other two, each with its sample
    and dynamic shapes.

    Args:
        model: a `LlavaForConditionalGeneration` or `Qwen2AudioForConditionalGeneration`.
        encoder: its image or audio method (`image_encoder_method`, `audio_encoder_method`), whose
            sample's shape the program fixes.
        max_cache_len: the cache's length in tokens (image features or audio rows, prompt and new
            tokens together).

    Raises:
        PrepareError: the language model cannot hold its cache in the program (`LlmProgram`).
    """

    def __init__(self, model: Any, encoder: EncoderMethod, max_cache_len: int):
        super().__init__()
        self.decoder = EmbeddedLlmProgram(model, max_cache_len)
        self.encoder = encoder.module
        self.encoder_spec = encoder
        self.embedding = _TokenEmbedding(model.get_input_embeddings())
        self.max_cache_len = int(max_cache_len)
        with torch.no_grad():
            self.encoder_rows = int(self.encoder(encoder.sample).shape[1])

    def forward(self, inputs_embeds: torch.Tensor, input_pos: torch.Tensor) -> dict[str, torch.Tensor]:
        """`text_decoder`: `EmbeddedLlmProgram.forward`."""
        return self.decoder(inputs_embeds, input_pos)

    def dynamic_shapes(self) -> dict[str, Any]:
        """The `text_decoder` method's (`EmbeddedLlmProgram.dynamic_shapes`)."""
        return self.decoder.dynamic_shapes()

    def methods(self) -> dict[str, tuple[torch.nn.Module, dict[str, Any], dict[str, Any] | None]]:
        """`{method: (module, sample kwargs, dynamic shapes)}` of the encoder and `token_embedding`."""
        spec = self.encoder_spec
        tokens = torch.export.Dim("tokens", min=1, max=self.max_cache_len)
        return {spec.name: (self.encoder, {spec.input_name: spec.sample}, None),
                "token_embedding": (self.embedding, {"input_ids": torch.tensor([[1, 2]])}, {"input_ids": {1: tokens}})}

    def constant_methods(self) -> dict[str, Any]:
        """The LLM runner's metadata (`LlmProgram.constant_methods`)."""
        return self.decoder.constant_methods()

    def summary(self) -> dict[str, Any]:
        """What the record says (`record.details["multimodal_program"]`): the methods, the encoder
        input's shape under its modality (`"image"`, `"audio"`), its rows."""
        spec = self.encoder_spec
        return {"methods": [DECODER_METHOD, *self.methods()], spec.modality: list(spec.sample.shape),
                "encoder_rows": self.encoder_rows, **self.decoder.plan_summary(),
                "constant_methods": self.constant_methods()}


def method_programs(model: MultimodalProgram) -> dict[str, Any]:
    """`{method: ExportedProgram}` of `model`'s methods besides `text_decoder` (`torch.export`,
    under the patches the caller's export applies)."""
    out = {}
    with torch.no_grad():
        for name, (module, sample, dynamic) in model.methods().items():
            out[name] = torch.export.export(module, (), sample, dynamic_shapes=dynamic, strict=False)
    return out


#: Why an encoder-decoder speech model's ExecuTorch folder is no runner's package (executorch 1.4.1).
SEQ2SEQ_WHY = ("an encoder-decoder (Whisper): ExecuTorch's MultimodalRunner drives a decoder-only language model "
               "over embeddings, and executorch 1.4.1's runner for encoder-decoder speech models (Seq2SeqRunner, "
               "extension/asr/runner) is C++ only: its Python package binds TextLLMRunner and MultimodalRunner alone. "
               "The folder holds the components, which `hfexport generate --audio` runs")


def multimodal_refusal(model_config: Any, config: Any) -> str | None:
    """Why the folder of an image-text or speech generation export (its `model_config`, the
    export's `config`) gets no `MultimodalRunner` program, or None."""
    model_type = getattr(model_config, "model_type", None)
    if getattr(model_config, "is_encoder_decoder", False):
        return SEQ2SEQ_WHY
    if model_type not in SERVED:
        return (f"MultimodalRunner programs are made for LLaVA (images) and Qwen2-Audio (audio) only; model_type "
                f"{model_type!r} keeps the components, which `hfexport generate` runs")
    if getattr(config, "llm_runner", None) is False:
        return "llm_runner=False (--no-llm-runner): the components only, no program for ExecuTorch's runners"
    if getattr(config, "quantizer", None) is not None:
        return (f"a quantized export: the program's {ENCODER_METHODS[SERVED[model_type]][1]} and token_embedding "
                "methods are not quantized with its text_decoder; export without quantization for MultimodalRunner")
    if SERVED[model_type] == "image" and not isinstance(model_config.vision_feature_layer, int):
        return "several vision feature layers (vision_feature_layer is a list): the vision_encoder method takes one"
    return None


def multimodal_component(model: Any, components: dict[str, Any], max_cache_len: int) -> tuple[Any, str | None]:
    """`((MultimodalProgram, kwargs), None)` for an image-text or audio-text model's `components`
    (from `decompose_for_generation`), sampled on the prompt's embeddings from position 0; or
    `(None, why)` where the language model cannot hold its cache in the program, or the cache
    cannot hold the sample prompt or a whole clip's rows."""
    from ...errors import PrepareError

    modality = modality_of(components)
    encoder = (image_encoder_method(model, components["image_encoder"][1]["pixel_values"]) if modality == "image"
               else audio_encoder_method(components))
    embed_module, embed_kwargs = components["text_embeddings"]
    with torch.no_grad():
        embeddings = embed_module(**embed_kwargs)[:1]
    if embeddings.shape[1] >= max_cache_len:
        return None, (f"the sample prompt's {embeddings.shape[1]} tokens do not fit the cache of {max_cache_len}: "
                      "export with --max-sequence-length N")
    try:
        program = MultimodalProgram(model, encoder, max_cache_len)
    except PrepareError as error:
        return None, str(error).split("\nWhat to do:")[0]
    if program.encoder_rows >= max_cache_len:
        return None, (f"a whole {modality}'s {program.encoder_rows} rows do not fit the cache of {max_cache_len}: "
                      "export with --max-sequence-length N")
    return (program, {"inputs_embeds": embeddings, "input_pos": torch.tensor([0])}), None


def multimodal_package(folder: Path, artifacts: dict[str, Any], context: Any, why: str | None) -> dict[str, Any]:
    """The manifest's `runtime_package` entry of an image-text or speech generation export folder:
    the files `MultimodalRunner` reads (`multimodal.pte`, its `.ptd`, the `tokenizer.json` placed
    beside it), and the program's methods and image or audio input, or why it cannot open the
    folder; `{}` for an export with no image or audio encoder and no why."""
    from ...folder.manifest import runtime_package_entry
    from ...capture.record import record_of
    from .llm_export import runner_tokenizer

    modality = modality_of(artifacts)
    if modality is None and why is None:
        return {}
    if PROGRAM not in artifacts:
        return runtime_package_entry(RUNNER, why=why or f"the export has no {PROGRAM} program")
    placed = runner_tokenizer(folder, context.tokenizer)
    summary = record_of(artifacts[PROGRAM]).details.get("multimodal_program", {})
    data = f"{PROGRAM}.ptd" if f"{PROGRAM}.ptd" in context.component_files.get(PROGRAM, []) else None
    settings = {"program": f"{PROGRAM}.pte", "data": data, "methods": summary.get("methods"),
                **_encoder_settings(modality, summary, context), "max_cache_len": summary.get("max_cache_len")}
    if placed["tokenizer"] is None:
        logger.warning("the export folder is not a MultimodalRunner folder: it was given no tokenizer")
        return runtime_package_entry(RUNNER, why="the export was given no tokenizer: MultimodalRunner needs "
                                     "tokenizer.json", settings=settings)
    return runtime_package_entry(RUNNER, files=[*context.component_files.get(PROGRAM, []), placed["tokenizer"]],
                                 settings=settings)


def _encoder_settings(modality: str, summary: dict[str, Any], context: Any) -> dict[str, Any]:
    """The manifest settings of the program's image or audio input, and the placeholder token the
    processor repeats once per row of it."""
    config = context.model_config
    if modality == "image":
        return {"image": {"input": "pixel_values", "shape": summary.get("image"), "dtype": "float32",
                          "given_as": "the processor's pixel_values (resized and normalized)"},
                "image_token_id": int(getattr(config, "image_token_index"))}
    extractor = getattr(context.processor, "feature_extractor", None)
    seconds = getattr(extractor, "chunk_length", None)
    chunk = f"the feature extractor's chunk ({seconds} s)" if seconds else "the feature extractor's chunk"
    token = getattr(config, "audio_token_id", None)
    return {"audio": {"input": "input_features", "shape": summary.get("audio"), "dtype": "float32",
                      "rows": summary.get("encoder_rows"), "seconds": seconds,
                      "given_as": f"the processor's input_features of a clip filling {chunk}: a shorter clip padded "
                      "with silence to it (hfexport generate --audio takes any clip up to the chunk)"},
            "audio_token_id": int(getattr(config, "audio_token_index", None) if token is None else token)}
