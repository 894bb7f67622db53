"""Turn what a user names on the CLI into a model and sample inputs.

`tiny:<preset>` builds a random model offline; a local folder written by `save_pretrained`
(or a hub id, when online) goes through `from_pretrained` with the class its config names.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from pathlib import Path
from typing import Any

import torch

from .errors import PrepareError
from .presets import PRESETS, build_preset

__all__ = ["LoadedModel", "load_model", "mapped_share", "sample_inputs_for"]


@dataclasses.dataclass
class LoadedModel:
    """A model ready to export: the module, sample inputs, where it came from, its tokenizer if any."""
    model: torch.nn.Module
    inputs: dict[str, Any]
    source: str
    tokenizer: Any = None
    #: the share of the weight bytes mapped from the checkpoint's files rather than copied into
    #: memory (`mapped_share`); None for a model not loaded from a folder
    weights_mapped: float | None = None


def _first_input_name(model: torch.nn.Module) -> str:
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return params[0].name if params else "input_ids"


def sample_inputs_for(model: torch.nn.Module, tokenizer: Any = None, prompt: str = "Hello, world!") -> dict[str, Any]:
    """Small sample inputs for `model`, derived from its config and forward signature."""
    from . import presets

    config = model.config
    first = _first_input_name(model)
    if first == "input_ids":
        if tokenizer is not None:
            inputs = dict(tokenizer(prompt, return_tensors="pt"))
        else:
            inputs = presets._text_inputs(config)
        if getattr(config, "is_encoder_decoder", False):
            start = getattr(config, "decoder_start_token_id", None) or 0
            inputs["decoder_input_ids"] = torch.tensor([[start]], dtype=torch.long).repeat(1, 3)
        if "token_type_ids" in inspect.signature(model.forward).parameters and "token_type_ids" not in inputs:
            inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
        return inputs
    if first == "pixel_values":
        return presets._image_inputs(config)
    if first == "input_features":
        return presets._whisper_inputs(config)
    if first == "input_values":
        return presets._audio_inputs(config)
    raise PrepareError(
        f"cannot make sample inputs for a model whose forward starts with {first!r}",
        model=type(model).__name__,
        remedy="export from Python with exporter.export(model, inputs) and your own inputs",
    )


def load_model(spec: str, *, prompt: str = "Hello, world!") -> LoadedModel:
    """Load `spec` (`tiny:<preset>`, a local folder, or a hub id) with sample inputs."""
    if spec.startswith("tiny:"):
        model, inputs = build_preset(spec)
        return LoadedModel(model, inputs, spec)
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(spec)
    except (OSError, ValueError) as error:
        hint = (f"'{spec}' is neither a folder with a config.json nor a reachable hub id; "
                f"presets work offline: {', '.join('tiny:' + n for n in PRESETS)}")
        raise PrepareError(f"cannot load {spec!r}: {str(error).splitlines()[0]}", remedy=hint) from error
    architectures = getattr(config, "architectures", None) or []
    model_class = next((getattr(transformers, a) for a in architectures if hasattr(transformers, a)), None)
    if model_class is None:
        raise PrepareError(
            f"{spec!r} names no model class transformers knows (architectures={architectures})",
            remedy="save the model with save_pretrained so config.json records its class",
        )
    model = model_class.from_pretrained(spec).eval()
    tokenizer = _tokenizer(spec)
    mapped = mapped_share(model, spec) if os.path.isdir(spec) else None
    return LoadedModel(model, sample_inputs_for(model, tokenizer, prompt), spec, tokenizer, mapped)


def mapped_share(model: torch.nn.Module, folder: str | os.PathLike) -> float | None:
    """The share of `model`'s weight bytes whose memory is mapped from the safetensors files in
    `folder` (1.0: none was copied); None where the process's mappings cannot be read (no
    `/proc/self/maps`: not Linux).

    # NOTE: why it matters: `from_pretrained` (transformers 5.24) builds the model on the meta
    # device and, where a tensor's dtype is the checkpoint's, points it into the file mapped by
    # safetensors instead of reading it. Such weights cost no memory of their own: the kernel reads
    # their pages when touched and drops them under pressure, so an export that never copies them
    # (torch.export traces with fake tensors; ONNX and OpenVINO convert without copying) holds a
    # model larger than its memory (`bench/large_model.py`). A weight cast to another dtype is a
    # copy; the report says how much was (`weights_mapped`).
    """
    if not os.path.exists("/proc/self/maps"):
        return None
    files = {os.path.realpath(f) for f in map(str, Path(folder).glob("*.safetensors"))}
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() in files:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    seen, total, mapped = set(), 0, 0
    for tensor in model.state_dict(keep_vars=True).values():  # what a checkpoint holds (no inv_freq)
        pointer, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
        if pointer in seen or size == 0:
            continue
        seen.add(pointer)
        total += size
        mapped += size if any(start <= pointer and pointer + size <= end for start, end in ranges) else 0
    return mapped / total if total else 0.0


def _tokenizer(spec: str) -> Any:
    """The tokenizer saved with `spec`, or None (a folder without tokenizer files has none)."""
    import transformers

    if os.path.isdir(spec) and not any(
        os.path.exists(os.path.join(spec, name)) for name in ("tokenizer.json", "tokenizer_config.json")
    ):
        return None
    try:
        return transformers.AutoTokenizer.from_pretrained(spec)
    except (OSError, ValueError, TypeError):
        return None
