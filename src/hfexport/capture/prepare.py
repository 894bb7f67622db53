"""Step 1, prepare: normalise inputs, check the attention implementation, put the model in
inference mode, and put everything back afterwards (also when the export raises)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ..errors import PrepareError

__all__ = ["normalize_inputs", "check_attention", "inference_mode", "model_name"]

#: Attention implementations that torch.export can trace.
EXPORTABLE_ATTENTION = ("sdpa", "eager")


def model_name(model: Any) -> str:
    """The class name of `model` (of the model inside a generation component's front)."""
    inner = getattr(model, "model", None) if type(model).__name__ == "ComponentFront" else None
    return type(inner if inner is not None else model).__name__


def normalize_inputs(inputs: Any, *, model: Any = None) -> dict[str, Any]:
    """Return the forward kwargs as a plain dict (a `BatchEncoding` or any mapping is accepted)."""
    if isinstance(inputs, Mapping) or hasattr(inputs, "keys") and hasattr(inputs, "__getitem__"):
        out = {str(k): inputs[k] for k in inputs.keys() if inputs[k] is not None}
    else:
        raise PrepareError(
            f"inputs must be a dict of forward keyword arguments (or a tokenizer's BatchEncoding), "
            f"got {type(inputs).__name__}",
            model=model_name(model) if model is not None else None,
            remedy='pass e.g. {"input_ids": ids, "attention_mask": mask}',
        )
    if not out:
        raise PrepareError("inputs is empty", remedy="pass at least one forward keyword argument")
    return out


def _attention_settings(model: torch.nn.Module) -> list[tuple[str, str]]:
    """Every (config path, attention implementation) reachable from `model`'s configs."""
    seen, out = set(), []
    for module_name, module in model.named_modules():
        config = getattr(module, "config", None)
        if config is None or id(config) in seen:
            continue
        seen.add(id(config))
        impl = getattr(config, "_attn_implementation", None)
        if isinstance(impl, str):
            out.append((module_name or type(model).__name__, impl))
    return out


def check_attention(model: torch.nn.Module) -> None:
    """Raise `PrepareError` when `model` (or a submodel) uses an attention that cannot be exported."""
    for where, impl in _attention_settings(model):
        if impl not in EXPORTABLE_ATTENTION and ("flash" in impl or "flex" in impl or "paged" in impl):
            raise PrepareError(
                f"{where} uses attn_implementation={impl!r}, which no backend can export "
                "(FlashAttention and FlexAttention call kernels torch.export cannot trace)",
                model=model_name(model),
                remedy='call model.set_attn_implementation("sdpa") before exporting (or "eager"), '
                'or load with from_pretrained(..., attn_implementation="sdpa")',
            )


@contextlib.contextmanager
def inference_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Put every module in eval mode under `no_grad`; restore each module's training flag after."""
    flags = [(module, module.training) for module in model.modules()]
    try:
        model.eval()
        with torch.no_grad():
            yield model
    finally:
        for module, training in flags:
            module.training = training
