"""A static cache's attention over the slots written so far, not over the whole cache.

# NOTE: transformers 5.24's `StaticLayer.update` writes the new keys at `cumulative_length` and
# returns the whole `[batch, heads, max_cache_len, head_dim]` buffers, so attention reads every
# slot under the mask: traced as it is, each decode step costs what a full cache costs, whatever
# the tokens cached (measured, `bench/decode.py`: ONNX Runtime fp32 6.3 ms a step at cache 256,
# 14.7 ms at 2048, with 16-48 tokens cached; OpenVINO 11.6 and 47 ms), and a 128-token prefill
# runs attention over all 2048 slots.
#
# A static component's boolean causal mask `[batch, 1, query, attended]` therefore says how many
# slots attention reads: the first `attended` slots of the cache, anything from the tokens cached
# plus the query up to the cache's length (the documented full-length mask is the largest
# value, so a loop written for it still works). The component's front narrows the buffers
# `update` returns to that many slots (`attending`) after the write, in eager and in the trace
# alike, so the program's attention follows the mask's length: the runner passes
# `cached + query`. The cache buffers, and where each step writes, are unchanged.
#
# `decompose._attending_written_slots` decides which components get it (plain `StaticLayer`s, a
# 4-D mask, the narrowed call giving the captured call's logits); `front.traced_sample` gives a
# dynamic capture the narrowed sample, so the mask's last axis becomes a size of its own.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["attending", "narrowed"]

#: `(width, lengths seen)` of the active `attending`, per context: the patched method is the
#: class's while it is active, and a static layer updated elsewhere meanwhile (another thread)
#: still returns its whole buffers.
_ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("hfexport_attended_slots", default=None)


@contextlib.contextmanager
def attending(width: Any) -> Iterator[None]:
    """While active, a `StaticLayer.update` returns the first `width` slots of its buffers (an
    int or a traced size, at most the buffers' length), and every layer's buffers are checked to
    be as long as the first's.

    # NOTE: the check ties the layers' lengths in a trace. With the whole buffers fed to attention
    # under one mask, the program tied every layer's length to the mask's; narrowed, each layer's
    # length would be a symbol of its own, and the interface would take a cache whose layers differ
    # in length (no static cache does: its layers are all `max_cache_len`).
    """
    from transformers.cache_utils import StaticLayer

    original = StaticLayer.update

    def update(self: Any, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        keys, values = original(self, key_states, value_states, *args, **kwargs)
        active = _ACTIVE.get()
        if active is None:
            return keys, values
        slots, lengths = active
        length = keys.shape[-2]
        if lengths:
            torch._check(length == lengths[0], lambda: f"a static cache layer of {length} slots beside one of {lengths[0]}")
        else:
            lengths.append(length)
        torch._check(slots <= length, lambda: f"the mask attends {slots} slots of a cache of {length}")
        return keys.narrow(-2, 0, slots), values.narrow(-2, 0, slots)

    token = _ACTIVE.set((width, []))
    StaticLayer.update = update
    try:
        yield
    finally:
        StaticLayer.update = original
        _ACTIVE.reset(token)


def narrowed(kwargs: dict[str, Any], *, written: int) -> dict[str, Any] | None:
    """`kwargs` with the 4-D boolean mask cut to `written` slots, the query's and one free slot
    (the later slots are causally masked), so the mask's last axis is neither the query's nor the
    cache's length; `None` where that is the whole mask."""
    mask, ids = kwargs.get("attention_mask"), kwargs.get("input_ids")
    if not (isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.dtype == torch.bool and isinstance(ids, torch.Tensor)):
        return None
    width = written + ids.shape[1] + 1
    if width >= mask.shape[-1]:
        return None
    return {**kwargs, "attention_mask": mask[..., :width].contiguous()}
