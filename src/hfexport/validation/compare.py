"""How one output of the artifact is compared with eager's.

An output passes when `max|artifact - eager| <= atol + rtol * max|eager|`; the report states
`atol` and `rtol`. Integer and boolean outputs must match exactly; a wrong shape fails.

A quantized artifact is judged by cosine similarity with eager instead (`min_cosine`): its error is
the quantization's, spread over every value, and a max abs difference grows with the vocabulary
(3.8 over SmolLM2's 49152 logits at cosine 0.9991). The outputs a caller reads (logits, hidden
states) are held to `min_cosine`; the cache tensors a generation component hands back to itself
(`cache.<layer>.<keys|values>`) to the looser `min_cache_cosine`: one layer's keys carry the
quantization error of one projection, unaveraged (cosine 0.965 on SmolLM2 int4 while the
logits keep 0.999), and whatever of it matters reaches the logits of the next step, which the
export job's accuracy gate compares over many steps (`generation/accuracy.py`).

Positions a 2-D `attention_mask` marks as padding (0) are left out of the comparison of outputs
laid out `[batch, sequence, ...]` or `[batch, heads, sequence, ...]` (logits, hidden states,
cache tensors): what a model computes for a padding token is undefined, and attention kernels
differ there (fully masked softmax rows). The report counts the positions left out.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .report import OutputDiff

__all__ = ["DEFAULT_TOLERANCE", "LOW_PRECISION_EPS", "default_tolerance", "attended_positions", "is_cache_output",
           "compare_output"]

#: (atol, rtol) per format for fp32 artifacts.
DEFAULT_TOLERANCE: dict[str, tuple[float, float]] = {
    "dynamo": (1e-5, 1e-5),
    "onnx": (1e-4, 1e-4),
    "openvino": (1e-4, 1e-4),
    "executorch": (1e-4, 1e-4),
}

#: How many machine epsilons of a 16-bit dtype `default_tolerance` allows, on `atol` and on `rtol`.
LOW_PRECISION_EPS = 16


def default_tolerance(fmt: str, dtype: torch.dtype) -> tuple[float, float]:
    """The default `(atol, rtol)` of an artifact of format `fmt` whose model computes in `dtype`:
    `DEFAULT_TOLERANCE` for float32, `LOW_PRECISION_EPS` times the dtype's epsilon for a 16-bit one.

    # NOTE: why eps-based. Eager PyTorch and the runtime both round every op's result to `dtype`
    # (half an epsilon, relative), but in another order (fused kernels, other accumulation orders, a
    # runtime that computes some ops in float32 and rounds once): through a model's few dozen ops the
    # outputs drift apart by some epsilons of their own scale, which `rtol` (times max|eager|) allows;
    # `atol` covers outputs near zero. float16's epsilon is 2**-10, bfloat16's 2**-7 (8x looser).
    """
    atol, rtol = DEFAULT_TOLERANCE.get(fmt, (1e-4, 1e-4))
    if not dtype.is_floating_point or torch.finfo(dtype).bits > 16:
        return atol, rtol
    allowed = LOW_PRECISION_EPS * torch.finfo(dtype).eps
    return max(atol, allowed), max(rtol, allowed)


def attended_positions(attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`(by query position [batch, query], by slot [batch, length])`: False where the mask marks
    padding. A 2-D mask covers the tokens of the call (and the cached ones before them); a static
    cache's 4-D boolean causal mask marks them in its last row, its own slot the last one it attends
    (later slots are free, not padding). `None` for a mask with no padding, or another form."""
    if attention_mask is None:
        return None
    if attention_mask.dim() == 2:
        keep = attention_mask.bool()
        return None if bool(keep.all()) else (keep, keep)
    if attention_mask.dim() != 4 or attention_mask.dtype != torch.bool:
        return None
    query = attention_mask.shape[2]
    slots = torch.arange(attention_mask.shape[3])
    last = attention_mask[:, 0, -1, :]
    own = torch.where(last, slots, torch.full_like(slots, -1)).amax(dim=-1, keepdim=True)
    by_slot = last | (slots[None, :] > own)
    past = own[:, 0] - (query - 1)
    if not bool((past == past[0]).all()) or int(past[0]) < 0 or bool(by_slot.all()):
        return None
    return by_slot[:, int(past[0]):int(past[0]) + query], by_slot


def _padding_keep(shape: tuple[int, ...], attention_mask: torch.Tensor | None,
                  cache: bool = False) -> torch.Tensor | None:
    """A boolean mask broadcastable to `shape` that is False at padded positions, or None: outputs
    laid out `[batch, query, ...]` (logits, hidden states) by query position, `[batch, heads,
    length, ...]` (cache tensors, `cache=True`) by slot.

    # NOTE: a cache leaf is never read as `[batch, query, ...]`, even when its heads equal the
    # prompt length: a GPT-J key cache `[2, 4, 4, 8]` under a 2 x 4 mask was masked by heads, and
    # its padded slot (rotated at position -1, which ONNX Runtime and eager compute apart) was
    # compared (fuzz seed 303).
    """
    attended = attended_positions(attention_mask)
    if attended is None:
        return None
    by_query, by_slot = attended
    batch = by_query.shape[0]
    if cache and len(shape) >= 3 and shape[2] > by_slot.shape[1]:
        # a mask over the written slots only (`generation/attended.py`): the later slots are free
        free = torch.ones(batch, shape[2] - by_slot.shape[1], dtype=torch.bool)
        by_slot = torch.cat([by_slot, free], dim=1)
    if not cache and len(shape) >= 2 and tuple(shape[:2]) == tuple(by_query.shape):
        return by_query.view(batch, by_query.shape[1], *([1] * (len(shape) - 2)))
    if len(shape) >= 3 and shape[0] == batch and shape[2] == by_slot.shape[1]:
        return by_slot.view(batch, 1, by_slot.shape[1], *([1] * (len(shape) - 3)))
    if len(shape) >= 3 and shape[0] == batch and shape[2] == by_query.shape[1]:
        return by_query.view(batch, 1, by_query.shape[1], *([1] * (len(shape) - 3)))
    return None


def is_cache_output(name: str) -> bool:
    """Whether output `name` is a cache tensor (`cache.0.keys`) rather than one a caller reads."""
    return name.startswith(("cache.", "past_key_values"))


def compare_output(name: str, got: Any, want: Any, atol: float, rtol: float,
             attention_mask: torch.Tensor | None = None, min_cosine: float | None = None,
             advisory: bool = False) -> OutputDiff:
    """Output `name` of the artifact (`got`) against eager's (`want`): shapes must match, int and bool
    values exactly; float values within `atol + rtol * max|want|`, or, with `min_cosine`, at that
    cosine similarity (`advisory`: reported, not failed), padded positions left out (module docstring)."""
    if not isinstance(want, torch.Tensor):
        same = got == want
        return OutputDiff(name, [], 0.0 if same else float("inf"), 0.0, bool(same), None if same else f"{got!r} != {want!r}")
    got = torch.as_tensor(got)
    shape = list(want.shape)
    if tuple(got.shape) != tuple(want.shape):
        return OutputDiff(name, list(got.shape), float("nan"), float("nan"), False,
                          f"shape {list(got.shape)} but eager gives {shape}")
    if not want.is_floating_point():
        mismatches = int((got.to(want.dtype) != want).sum())
        return OutputDiff(name, shape, float(mismatches), 0.0, mismatches == 0,
                          None if mismatches == 0 else f"{mismatches} values differ")
    if want.numel() == 0:
        return OutputDiff(name, shape, 0.0, 0.0, True)
    got, want = got.double(), want.double()
    keep = _padding_keep(tuple(want.shape), attention_mask, cache=is_cache_output(name))
    if keep is not None:
        region = keep.expand_as(want)
        got, want = got[region], want[region]
    # Only the finite entries are compared. The checks and the boolean selection each cost a pass
    # and a copy, so they are made only where a sum says some entry is not finite (NaN and inf
    # propagate through it; float32 values cannot overflow a float64 sum); the maxima are norms,
    # which allocate nothing. A decoder's validation compares a static cache of [batch, heads,
    # 2048, head_dim] per layer and case: these passes were most of its time (bench/RESULTS.md,
    # "Where export time goes").
    a, b = got.reshape(-1), want.reshape(-1)
    if not (math.isfinite(float(a.sum())) and math.isfinite(float(b.sum()))):
        finite = torch.isfinite(b)
        if not torch.equal(torch.isfinite(a), finite):
            return OutputDiff(name, shape, float("inf"), float("inf"), False, "non-finite values differ from eager")
        a, b = a[finite], b[finite]
    max_abs = float(torch.linalg.vector_norm(a - b, ord=math.inf)) if a.numel() else 0.0
    scale = float(torch.linalg.vector_norm(b, ord=math.inf)) if a.numel() else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    norms = float(a.norm() * b.norm())
    cosine = float(torch.dot(a, b)) / norms if norms > 0 else (1.0 if max_abs == 0 else 0.0)
    if min_cosine is None:
        return OutputDiff(name, shape, max_abs, max_rel, max_abs <= atol + rtol * scale, cosine=cosine)
    below = not cosine >= min_cosine
    return OutputDiff(name, shape, max_abs, max_rel, advisory or not below, cosine=cosine,
                      below_floor=advisory and below)
