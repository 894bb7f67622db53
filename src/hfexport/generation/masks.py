"""One causal mask in, the masks each attention layer type needs built inside the graph.

# NOTE: with a static cache, `generate` hands the model precomputed 4-D masks, and their form
# depends on the architecture: one boolean mask (Llama), a sliding-window mask alone (Mistral),
# a dict keyed by layer type (`{"full_attention": ..., "sliding_attention": ...}` for every
# config with `layer_types`, Qwen3 included), additive float masks under eager attention
# (Gemma-2). Exported as captured, each form is a different interface, and a dict of masks
# whose sliding entry a caller must build knows the window. The static `decode` graph instead
# takes one boolean causal mask (the interface the README documents) `[batch, 1, query, cache_length]` (padding included)
# and the component's front (`front.ComponentFront`) builds from it, in the graph, what the model was given:
# the window applied from each query's own slot (the last position its row attends, which is its
# cache position: sliding-window layers keep a full-length cache, see `caches.full_length_caches`), the dtype
# and additive form converted. The front is used only when it reproduces, exactly, every mask
# `generate` computed during the capture (`masks_from_causal` is checked against them); any
# other mask (chunked attention, a model-specific mask function) keeps its captured form.
# A model that builds its masks itself from a 2-D padding mask over the whole static cache
# (BLOOM's `create_masks_for_generate`, for its alibi) is given that row: the slots the last query
# attends, which is generate's 2-D mask (ones over past and new tokens, padding and free slots 0).
"""

from __future__ import annotations

from typing import Any

import torch

from ..model_config import text_config

__all__ = ["mask_layout", "causal_mask", "masks_from_causal", "same_masks", "PADDING_ROW"]

#: Layer types whose mask is the causal mask, optionally with a window on it.
_FULL, _SLIDING = "full_attention", "sliding_attention"

#: The window slot of a layout entry for a 2-D padding mask over the whole cache (the model
#: builds its causal mask itself).
PADDING_ROW = "padding_row"

#: What the model takes: `(key or None for a bare tensor, window or None or PADDING_ROW, dtype)` per mask.
Layout = list[tuple[Any, "int | str | None", torch.dtype]]


def mask_layout(config: Any, captured: Any, *, static: bool = False) -> Layout | None:
    """How the model's `attention_mask` is laid out, given the text `config` and a captured
    mask; `None` when it is not a causal mask with at most a sliding window. With a `static`
    cache a 2-D mask is a padding mask over the whole cache (`PADDING_ROW`)."""
    text = text_config(config)
    window = getattr(text, "sliding_window", None)
    if static and isinstance(captured, torch.Tensor) and captured.dim() == 2:
        return [(None, PADDING_ROW, captured.dtype)]
    if isinstance(captured, dict):
        if not captured or not set(captured) <= {_FULL, _SLIDING} or window is None and _SLIDING in captured:
            return None
        if not all(isinstance(m, torch.Tensor) and m.dim() == 4 for m in captured.values()):
            return None
        return [(key, window if key == _SLIDING else None, mask.dtype) for key, mask in captured.items()]
    if not isinstance(captured, torch.Tensor) or captured.dim() != 4:
        return None
    if getattr(text, "attention_chunk_size", None) is not None and window is None:
        return None
    return [(None, window, captured.dtype)]


def causal_mask(padding: torch.Tensor, past: int, query: int, length: int) -> torch.Tensor:
    """The boolean causal mask `[batch, 1, query, length]` of `query` tokens written after
    `past` cached ones, over a cache of `length` slots; `padding` (`[batch, >= past]`, 0 = pad)
    masks padded slots."""
    slots = torch.arange(length)
    rows = torch.arange(past, past + query)
    causal = slots[None, :] <= rows[:, None]
    pad = torch.ones(padding.shape[0], length, dtype=torch.bool)
    width = min(padding.shape[1], length)
    pad[:, :width] = padding[:, :width].bool()
    return causal[None, None] & pad[:, None, None, :]


def _windowed(allowed: torch.Tensor, window: int) -> torch.Tensor:
    """`allowed` with each row cut to the `window` slots before and at the query's own slot
    (the last slot the row attends): transformers' `sliding_window_overlay`, `kv > q - window`."""
    slots = torch.arange(allowed.shape[-1], device=allowed.device)
    own = (allowed * slots).amax(dim=-1, keepdim=True)
    return allowed & (slots > own - window)


def _as_dtype(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask in the form the model took: boolean, or additive (0 where allowed, the
    dtype's minimum elsewhere, as transformers builds it for eager attention)."""
    if dtype == torch.bool:
        return allowed
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def masks_from_causal(mask: torch.Tensor, layout: Layout) -> Any:
    """What the model takes as `attention_mask`, built from the boolean causal `mask`."""
    allowed = mask if mask.dtype == torch.bool else mask != 0
    built = {key: allowed[:, 0, -1, :].to(dtype) if window == PADDING_ROW
             else _as_dtype(_windowed(allowed, window) if window else allowed, dtype)
             for key, window, dtype in layout}
    return built[None] if None in built else built


def same_masks(built: Any, captured: Any) -> bool:
    """Whether `built` equals `captured` exactly (same keys, shapes, dtypes, values)."""
    if isinstance(captured, dict) or isinstance(built, dict):
        if not (isinstance(captured, dict) and isinstance(built, dict) and set(built) == set(captured)):
            return False
        return all(same_masks(built[key], mask) for key, mask in captured.items())
    return built.dtype == captured.dtype and built.shape == captured.shape and torch.equal(built, captured)
