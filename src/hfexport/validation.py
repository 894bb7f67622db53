"""Run an artifact in its runtime, compare with eager PyTorch, and report per output.

`validate(artifact, model, inputs)` checks the sample inputs and, when the artifact has dynamic
dimensions, a second set of inputs where every symbolic size moves (batch 1 -> 3, sequence 7 -> 9):
a dimension that was silently specialised then shows up as a failure, not a pass.

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

Where that gate runs (a quantized generation export with the default criteria), the job makes the
cosine floors advisory (`cosine_advisory=`, its reason): each output's cosine is still measured and
reported, one under its floor marked `below floor (advisory)`, but only a wrong shape, an integer
output or a non-finite value fails. On a real LLM one position's logits are a lottery under a
correct int4 quantization (SmolLM2's sample prompt: cosine 0.95 at its last position; per position
0.99 down to -0.23 over a chat prompt, eager PyTorch with the same round-to-nearest int4), so a
floor on them refuses correct exports at random; the gate's teacher-forced steps over a real prompt
average that out and still refuse a broken quantizer (bench/RESULTS.md).

Positions a 2-D `attention_mask` marks as padding (0) are left out of the comparison of outputs
laid out `[batch, sequence, ...]` or `[batch, heads, sequence, ...]` (logits, hidden states,
cache tensors): what a model computes for a padding token is undefined, and attention kernels
differ there (fully masked softmax rows). The report counts the positions left out.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from .capture.interface import call_model
from .capture.prepare import inference_mode, normalize_inputs
from .capture.pytree import flatten_with_names, register_cache_pytree_nodes
from .errors import ValidationError, summarize
from .generation.front import unwrap
from .record import ExportRecord, record_of
from .runner import runner_for
from .timing import phase

__all__ = ["validate", "validate_components", "ValidationReport", "CaseReport", "OutputDiff", "resize_inputs", "DEFAULT_TOLERANCE",
           "default_tolerance"]

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


def _compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of `model`'s floating-point weights (float32 when it has none)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


@dataclasses.dataclass
class OutputDiff:
    """One output of one case: its shape and its distance from eager."""

    name: str
    shape: list[int]
    max_abs: float
    max_rel: float
    passed: bool
    error: str | None = None
    cosine: float | None = None  # cosine similarity with eager (float outputs)
    below_floor: bool = False  # under an advisory cosine floor (`validate(cosine_advisory=...)`): reported, not failed


@dataclasses.dataclass
class CaseReport:
    """One set of inputs run through the artifact and eager."""

    label: str
    input_shapes: dict[str, list[int]]
    outputs: list[OutputDiff]
    error: str | None = None
    padded_positions: int = 0  # attention_mask == 0 positions left out of the comparison

    @property
    def passed(self) -> bool:
        """Whether the case ran and every output passed."""
        return self.error is None and all(o.passed for o in self.outputs)


@dataclasses.dataclass
class ValidationReport:
    """The result of `validate`: every case, the tolerance used, and where it ran."""

    format: str
    model_class: str
    runtime: str
    precision: str
    atol: float
    rtol: float
    cases: list[CaseReport]
    note: str = ""
    min_cosine: float | None = None  # set: float outputs were judged by cosine similarity
    min_cache_cosine: float | None = None  # the cache tensors' floor under `min_cosine` (None: the same)
    cosine_advisory: str | None = None  # set: the cosine floors were advisory, and why (`validate`)

    @property
    def passed(self) -> bool:
        """Whether every case passed (and there was at least one)."""
        return bool(self.cases) and all(c.passed for c in self.cases)

    @property
    def max_abs(self) -> float:
        """The largest absolute difference over every output of every case."""
        values = [o.max_abs for c in self.cases for o in c.outputs if not math.isnan(o.max_abs)]
        return max(values, default=float("nan"))

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-able dict, with each case's verdict and the rule applied."""
        out = dataclasses.asdict(self)
        out["passed"] = self.passed
        out["rule"] = self.rule
        for case, raw in zip(self.cases, out["cases"]):
            raw["passed"] = case.passed
        return out

    @property
    def rule(self) -> str:
        """What an output had to meet to pass, in words."""
        if self.min_cosine is None:
            return (f"tolerance: atol={self.atol:g}, rtol={self.rtol:g}  (pass if max|artifact - eager| <= "
                    "atol + rtol * max|eager|; exact for int/bool)")
        cache = self.min_cosine if self.min_cache_cosine is None else self.min_cache_cosine
        if self.cosine_advisory:
            return (f"quantized: cosine similarity with eager measured against advisory floors {self.min_cosine:g}, "
                    f"{cache:g} for cache tensors ({self.cosine_advisory}); shapes, int/bool values and "
                    "non-finite values must match")
        return (f"pass if the cosine similarity with eager is >= {self.min_cosine:g}, >= {cache:g} for cache "
                "tensors (quantized; exact for int/bool)")

    @property
    def below_floor(self) -> list[str]:
        """`case/output` of every output under its advisory cosine floor."""
        return [f"{c.label}/{o.name}" for c in self.cases for o in c.outputs if o.below_floor]

    def to_table(self) -> str:
        """A readable table: one row per case and output."""
        lines = [f"validation of {self.model_class} ({self.format}) in {self.runtime}, precision {self.precision}",
                 self.rule]
        width = max([len(o.name) for c in self.cases for o in c.outputs] + [6])
        cos = self.min_cosine is not None
        lines.append(f"  {'case':<10} {'output':<{width}} {'shape':<18} {'max abs':>10} {'max rel':>10}"
                     + (f" {'cosine':>9}" if cos else "") + "  result")
        for case in self.cases:
            if case.padded_positions:
                lines.append(f"  {case.label:<10} ({case.padded_positions} padded positions not compared)")
            if case.error:
                lines.append(f"  {case.label:<10} {'-':<{width}} {'-':<18} {'-':>10} {'-':>10}  FAIL: {case.error}")
            for o in case.outputs:
                verdict = ("below floor (advisory)" if o.below_floor else "ok") if o.passed else \
                    f"FAIL{': ' + o.error if o.error else ''}"
                lines.append(
                    f"  {case.label:<10} {o.name:<{width}} {str(o.shape):<18} {o.max_abs:>10.3g} {o.max_rel:>10.3g}"
                    + (f" {o.cosine if o.cosine is not None else float('nan'):>9.6f}" if cos else "") + f"  {verdict}"
                )
        lines.append(f"result: {'PASSED' if self.passed else 'FAILED'}" + (f" ({self.note})" if self.note else ""))
        return "\n".join(lines)


# -- second-size inputs ---------------------------------------------------------------------------


def _tile(tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Resize `tensor` to `shape` by repeating (or cutting) its values along each dim."""
    out = tensor
    for axis, size in enumerate(shape):
        current = out.shape[axis]
        if size == current:
            continue
        if current == 0:
            new_shape = list(out.shape)
            new_shape[axis] = size
            out = torch.zeros(new_shape, dtype=out.dtype, device=out.device)
            continue
        repeats = [1] * out.dim()
        repeats[axis] = -(-size // current)
        out = out.repeat(*repeats).narrow(axis, 0, size)
    return out.contiguous()


def resize_inputs(inputs: dict[str, Any], record: ExportRecord, step: int = 2, *,
                  smallest: bool = False) -> dict[str, Any] | None:
    """Return `inputs` with every symbolic size moved by `step` (within the program's ranges), or
    `None` when the artifact has no symbolic input dimension.

    With `smallest`, every batch and token count (`TOKEN_ROLES`, a cache's length aside: a cache
    holds the tokens already written) goes down to 1 instead, and the other sizes stay: what
    `dynamic=True` promises is any size, and a program traced at 2 tokens or at a batch of 2 that
    refuses 1 is the silent specialisation a growing step cannot see. Symbols already at 1 stay.

    Raises:
        ValidationError: a symbol's range leaves it no other size, or the inputs do not line up
            with the program's inputs (the resized case would otherwise rerun the sample shape).
    """
    import sympy

    leaves, spec = pytree.tree_flatten(record.artifact_inputs(inputs))
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    if not any(isinstance(d, str) for shape in record.input_shapes for d in shape):
        return None
    if len(tensors) != len(record.input_shapes):
        raise ValidationError(f"the inputs hold {len(tensors)} tensors but the program takes "
                              f"{len(record.input_shapes)}, so they cannot be resized",
                              remedy="validate with the inputs the artifact was exported with")
    from .capture.dynamic import TOKEN_ROLES
    from .capture.names import role_of

    values: dict[str, int] = {}
    token_symbols: set[str] = set()
    cache_symbols: set[str] = set()
    for tensor, shape, name in zip(tensors, record.input_shapes, record.input_names):
        for axis, (size, dim) in enumerate(zip(tensor.shape, shape)):
            if isinstance(dim, str) and dim.isidentifier():
                values[dim] = int(size)
                role = role_of(name, len(shape), axis)
                if role in TOKEN_ROLES:
                    token_symbols.add(dim)
                if role == "cache_length":
                    cache_symbols.add(dim)
    new_values = {}
    if smallest:
        shrinking = token_symbols - cache_symbols
        new_values = {symbol: 1 for symbol in shrinking if values[symbol] > 1}
        values_to_move: dict[str, int] = {}
    else:
        values_to_move = values
    for symbol, value in values_to_move.items():
        low, high = record.symbol_ranges.get(symbol, (0, None))
        target = value + step
        if high is not None and target > high:
            target = high if high > value else max(low, value - 1)
        if target == value and symbol not in token_symbols:
            continue  # a size the weights fix (one key/value head), bounded to it: kept
        if target == value:
            raise ValidationError(f"the program allows {symbol} only {low}..{high}, so no size but the sample's "
                                  f"({value}) can be checked", remedy="export with dynamic axes that can take "
                                  "other sizes (see the record's symbol_ranges), or validate(resized=False)")
        new_values[symbol] = target
    _keep_mask_covering_cache(record, new_values, values)
    _keep_writes_inside_static_cache(record, tensors, new_values, values)
    _keep_attended_covering_writes(record, tensors, new_values, values)
    sizes = {**values, **new_values}  # an expression (`s0 + s1`) is sized from every symbol, moved or not
    symbols = {name: sympy.Symbol(name) for name in sizes}
    substitution = {symbols[name]: v for name, v in sizes.items()}

    def size_of(dim: int | str, current: int) -> int:
        if isinstance(dim, int):
            return dim
        if dim in new_values:
            return new_values[dim]
        try:
            return int(sympy.sympify(dim, locals=symbols).subs(substitution))
        except (TypeError, ValueError, sympy.SympifyError):
            return current

    shapes, names = iter(record.input_shapes), iter(record.input_names)
    resized = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            shape, name = next(shapes), next(names)
            size = tuple(size_of(d, s) for d, s in zip(shape, leaf.shape))
            if name.endswith("attention_mask") and leaf.dim() == 2:
                resized.append(_padding_mask(leaf, size))
            elif name.endswith("attention_mask") and leaf.dim() == 4 and leaf.dtype == torch.bool:
                resized.append(_causal_mask(leaf, size))
            else:
                resized.append(_tile(leaf, size))
        else:
            resized.append(leaf)
    return {**inputs, **pytree.tree_unflatten(resized, spec)}


def _static_layers_sized_by_buffers(cache: Any) -> None:
    """Give each static layer of `cache` (eager's copy of a resized input) the length of its buffers.

    # NOTE: a resized cache keeps the sample's `max_cache_len` (a number of the layer, part of
    # the input's tree spec, so the program's copy must keep it), which eager reads when a model
    # builds its mask from a 2-D one (BLOOM): eager would refuse a resized cache the program
    # takes (the program reads the buffers' length, `models/static_cache.py`).
    """
    for layer in getattr(cache, "layers", None) or []:
        keys = getattr(layer, "keys", None)
        if isinstance(getattr(layer, "max_cache_len", None), int) and isinstance(keys, torch.Tensor) and keys.dim() >= 2:
            layer.max_cache_len = int(keys.shape[-2])
    for child in ("self_attention_cache", "cross_attention_cache"):
        if hasattr(cache, child):
            _static_layers_sized_by_buffers(getattr(cache, child))


def _padding_mask(mask: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A 2-D padding mask resized: rows repeated, new positions attended (appended on the right, so
    a left-padded row stays left-padded and the last position, whose logits are kept, is a token)."""
    rows = _tile(mask, (shape[0], mask.shape[1]))
    if shape[1] <= mask.shape[1]:
        return rows[:, mask.shape[1] - shape[1]:].contiguous()
    return torch.cat([rows, torch.ones(shape[0], shape[1] - mask.shape[1], dtype=mask.dtype)], dim=1)


def _causal_mask(mask: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A boolean causal mask `[batch, 1, query, cache_length]` (a static cache's) resized: the
    rows of the new query tokens, written after the same cached ones, over the new cache length;
    the query's own slots keep their padding rightmost (a shorter prompt keeps its last tokens,
    a longer one gets attended tokens after them). Tiling its rows instead would give a padded
    row of a shorter prompt no key at all, where runtimes rightly differ. A mask that is not such
    a causal mask is tiled."""
    batch, _, query, length = mask.shape
    new_batch, _, new_query, new_length = shape
    slots = torch.arange(length)
    last = mask[:, 0, -1, :]
    own = torch.where(last, slots, torch.full_like(slots, -1)).amax(dim=-1)  # the last query's own slot
    past = own - (query - 1)
    if not bool((past == past[0]).all()) or int(past[0]) < 0:
        return _tile(mask, shape)
    past = int(past[0])
    attended = last[:, past:past + query]
    if new_query <= query:
        mine = attended[:, query - new_query:]
    else:
        mine = torch.cat([attended, torch.ones(batch, new_query - query, dtype=torch.bool)], dim=1)
    rest = torch.ones(batch, max(0, new_length - past - new_query), dtype=torch.bool)
    padding = _tile(torch.cat([last[:, :past], mine, rest], dim=1)[:, :new_length], (new_batch, new_length))
    rows = past + torch.arange(new_query)
    causal = torch.arange(new_length)[None, :] <= rows[:, None]
    return (causal[None] & padding[:, None, :])[:, None].contiguous()


#: model class name -> `resize(inputs, step) -> inputs` for models whose input sizes are tied by
#: their values (Qwen2-VL's patch count is the sum of `t * h * w` over `grid_thw`), which moving
#: every symbol by `step` cannot respect; registered by `models/<family>.py`.
RESIZERS: dict[str, Callable[[dict[str, Any], int], dict[str, Any]]] = {}


def register_resizer(model_class: str):
    """Register how to make valid inputs of other sizes for `model_class` (see `RESIZERS`)."""
    def decorate(fn: Callable[[dict[str, Any], int], dict[str, Any]]):
        RESIZERS[model_class] = fn
        return fn

    return decorate


def _keep_mask_covering_cache(record: ExportRecord, new_values: dict[str, int], values: dict[str, int]) -> None:
    """A decode step's 2-D `attention_mask` covers the cached tokens and the new ones: where the
    program has a symbol of its own for the mask's length, resize it to cache + query (moving it
    by the same step as the others would give a mask the program rightly refuses)."""
    shapes = dict(zip(record.input_names, record.input_shapes))
    # the query's tokens: ids `[batch, query]`, or embeddings `[batch, query, hidden]` (VLMPipeline's language model)
    ids = shapes.get("input_ids") or shapes.get("decoder_input_ids") or shapes.get("inputs_embeds")
    mask = shapes.get("attention_mask")
    cache = next((shape for name, shape in shapes.items() if name.endswith(".keys") and len(shape) == 4), None)
    if not (mask and len(mask) == 2 and ids and len(ids) >= 2 and cache) or mask[1] not in new_values:
        return
    size = {**values, **new_values}
    query = ids[1] if isinstance(ids[1], int) else size.get(ids[1])
    past = cache[2] if isinstance(cache[2], int) else size.get(cache[2])
    if query is not None and past is not None and mask[1] not in (ids[1], cache[2]):
        new_values[mask[1]] = past + query


def _keep_writes_inside_static_cache(record: ExportRecord, tensors: list[torch.Tensor], new_values: dict[str, int],
                                     values: dict[str, int]) -> None:
    """A static cache's decode step writes its query at `cumulative_length`: keep cumulative + query
    within every cache tensor's length. Where a length is bounded at the sample's (ExecuTorch bounds
    it by `max_cache_len`), moving every size would shorten the cache under the tokens already
    written and give inputs eager itself refuses; such a length is kept, and a query that no longer
    fits is moved down instead of up."""
    named = dict(zip(record.input_names, zip(tensors, record.input_shapes)))
    written = [int(t) for name, (t, _) in named.items() if name.endswith("cumulative_length") and t.dim() == 0]
    ids = named.get("input_ids") or named.get("decoder_input_ids")
    lengths = {shape[2] for name, (_, shape) in named.items() if name.endswith((".keys", ".values")) and len(shape) == 4}
    if not written or ids is None or len(ids[1]) != 2 or not lengths:
        return
    query_dim = ids[1][1]

    def room() -> int:
        size = {**values, **new_values}
        return min(d if isinstance(d, int) else size[d] for d in lengths) - max(written)

    def query() -> int:
        return query_dim if isinstance(query_dim, int) else new_values.get(query_dim, values[query_dim])

    if query() <= room():
        return
    for dim in lengths:
        if isinstance(dim, str) and new_values.get(dim, values[dim]) < values[dim]:
            del new_values[dim]
    if not isinstance(query_dim, str) or query() <= room():
        return
    fitting = room() if room() != values[query_dim] else room() - 1  # the most that fits, or one fewer than the sample
    if fitting >= 1:
        new_values[query_dim] = fitting
    else:
        new_values.pop(query_dim, None)  # one token that just fits: it stays, the other sizes still move


def _keep_attended_covering_writes(record: ExportRecord, tensors: list[torch.Tensor], new_values: dict[str, int],
                                   values: dict[str, int]) -> None:
    """Where a static mask's last axis is a size of its own (attention reads that many slots,
    `generation/attended.py`), resize it to the slots written after the call, as the runner
    passes: the cached tokens plus the query, within the cache."""
    named = dict(zip(record.input_names, zip(tensors, record.input_shapes)))
    mask, ids = named.get("attention_mask"), named.get("input_ids")
    lengths = [shape[2] for name, (_, shape) in named.items() if name.endswith((".keys", ".values")) and len(shape) == 4]
    written = [int(t) for name, (t, _) in named.items() if name.endswith("cumulative_length") and t.dim() == 0]
    if not (mask and len(mask[1]) == 4 and ids and len(ids[1]) == 2 and lengths and written):
        return
    attended, query = mask[1][3], ids[1][1]
    if not isinstance(attended, str) or attended in lengths:
        return
    size = {**values, **new_values}
    query_size = query if isinstance(query, int) else size[query]
    room = min(d if isinstance(d, int) else size[d] for d in lengths)
    new_values[attended] = min(max(written) + query_size, room)


# -- comparison -----------------------------------------------------------------------------------


def _attended(attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
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
    attended = _attended(attention_mask)
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


def _is_cache(name: str) -> bool:
    """Whether output `name` is a cache tensor (`cache.0.keys`) rather than one a caller reads."""
    return name.startswith(("cache.", "past_key_values"))


def _compare(name: str, got: Any, want: Any, atol: float, rtol: float,
             attention_mask: torch.Tensor | None = None, min_cosine: float | None = None,
             advisory: bool = False) -> OutputDiff:
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
    keep = _padding_keep(tuple(want.shape), attention_mask, cache=_is_cache(name))
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


def _shapes(inputs: dict[str, Any]) -> dict[str, list[int]]:
    return {name: list(leaf.shape) for name, leaf in flatten_with_names(inputs) if isinstance(leaf, torch.Tensor)}


def _run_case(label: str, runner, model, inputs, record, atol, rtol, min_cosine=None,
              min_cache_cosine=None, advisory=False) -> CaseReport:
    from .generation.decompose import full_length_caches

    try:  # the caches a model builds keep every token, as in the export (see `full_length_caches`)
        eager_inputs = copy.deepcopy(inputs)
        for value in eager_inputs.values():
            _static_layers_sized_by_buffers(value)
        with inference_mode(model), full_length_caches():
            eager = call_model(model, eager_inputs)
    except Exception as error:  # noqa: BLE001 - the check cannot be made: a failed case, never a pass
        if label == "sample":
            raise
        return CaseReport(label, _shapes(inputs), [], f"eager PyTorch rejects these inputs, so the artifact cannot "
                          f"be compared at this shape: {summarize(error, 200)}")
    expected = [(name, value) for name, value in flatten_with_names(eager) if value is not None]
    try:
        got = runner.run(copy.deepcopy(record.artifact_inputs(inputs)))
    except Exception as error:  # noqa: BLE001 - a runtime failure is a validation result, reported
        return CaseReport(label, _shapes(inputs), [], summarize(error))
    if len(got) != len(expected):
        return CaseReport(label, _shapes(inputs), [],
                          f"artifact returned {len(got)} outputs, eager {len(expected)}")
    names = record.output_names if len(record.output_names) == len(expected) else [n for n, _ in expected]
    mask = inputs.get("attention_mask") if isinstance(inputs.get("attention_mask"), torch.Tensor) else None
    cache_floor = min_cosine if min_cosine is None or min_cache_cosine is None else min_cache_cosine
    outputs = [_compare(name, g, w, atol, rtol, mask, cache_floor if _is_cache(name) else min_cosine, advisory)
               for name, g, (_, w) in zip(names, got, expected)]
    attended = _attended(mask)
    padded = int((~attended[0]).sum()) if attended is not None else 0
    return CaseReport(label, _shapes(inputs), outputs, padded_positions=padded)


def validate(
    artifact: Any,
    model: torch.nn.Module,
    inputs: Any,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    resized: bool | None = None,
    steps: tuple[int, ...] = (2,),
    smallest: bool | None = None,
    min_cosine: float | None = None,
    min_cache_cosine: float | None = None,
    cosine_advisory: str | None = None,
    on_case: Callable[[int, int], None] | None = None,
) -> ValidationReport:
    """Run `artifact` in its runtime on `inputs` and compare every output with `model(**inputs)`.

    Args:
        artifact: what an hfexport exporter returned (or a loaded `ExportedProgram`).
        model: the eager model it was exported from.
        inputs: the forward kwargs to compare on.
        atol, rtol: tolerance; defaults per format and the model's dtype (`default_tolerance`).
        resized: also run at other batch sizes and sequence lengths; default: when the artifact
            has dynamic dimensions.
        steps: how far each symbolic size moves for each resized case (`(2, 5)`: two more cases).
        smallest: also run with every batch and token count at 1 (`resize_inputs(smallest=True)`);
            default: with `resized`. Skipped, with a note, when the sample is already that small.
        min_cosine: judge float outputs by cosine similarity with eager instead of the tolerance
            (a quantized artifact: its error is the quantization's, not a conversion bug).
        min_cache_cosine: with `min_cosine`, the floor of the cache tensors (`cache.*`) instead
            (see the module docstring); default: `min_cosine`.
        cosine_advisory: with `min_cosine`, why its floors are advisory: an output under its floor
            is marked (`OutputDiff.below_floor`, `ValidationReport.below_floor`) and does not fail
            (the export job's accuracy gate judges a quantized generation export instead).

    Returns:
        A `ValidationReport`; `report.passed` says whether every output of every case passed.
    """
    record = record_of(artifact)
    kwargs = normalize_inputs(inputs, model=model)
    register_cache_pytree_nodes(kwargs)
    default_atol, default_rtol = default_tolerance(record.format, _compute_dtype(model))
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    runner = runner_for(artifact, record)
    if cosine_advisory and min_cosine is None:
        raise ValueError("cosine_advisory makes the cosine floors advisory: pass min_cosine too")
    floors = (min_cosine, min_cache_cosine, bool(cosine_advisory))
    if resized is None:
        resized = record.is_dynamic
    cases: list[CaseReport] = []
    planned = 1 + (len(steps) + (smallest is not False) if resized else 0)

    def add(case: CaseReport) -> None:
        cases.append(case)
        if on_case is not None:
            on_case(len(cases), max(planned, len(cases)))

    add(_run_case("sample", runner, model, kwargs, record, atol, rtol, *floors))
    note = ""
    for step in steps if resized else ():
        label = "resized" if len(steps) == 1 else f"resized+{step}"
        try:
            resizer = RESIZERS.get(type(unwrap(model)).__name__)
            other = resizer(kwargs, step) if resizer else resize_inputs(kwargs, record, step)
        except ValidationError as error:
            add(CaseReport(label, _shapes(kwargs), [], str(error)))
            continue
        if other is None:
            note = "no symbolic input dimension: only the sample shape was checked"
            break
        if _shapes(other) == _shapes(kwargs):
            add(CaseReport(label, _shapes(other), [], "resizing left every input at the sample's shape"))
            continue
        add(_run_case(label, runner, model, other, record, atol, rtol, *floors))
    if resized and smallest is not False and not note:
        note = _smallest_case(add, runner, model, kwargs, record, atol, rtol, floors) or note
    return ValidationReport(record.format, record.model_class, runner.runtime, runner.precision,
                            atol, rtol, cases, note, min_cosine, None if min_cosine is None else min_cache_cosine,
                            cosine_advisory or None)


def _smallest_case(add: Callable[[CaseReport], None], runner, model, kwargs, record, atol, rtol, floors) -> str:
    """Add the `smallest` case (every batch and token count at 1) with `add`; return a note
    when it does not apply (the sample is that small already, or the model's sizes are tied by
    value, see `RESIZERS`)."""
    resizer = RESIZERS.get(type(unwrap(model)).__name__)
    if resizer is not None:  # the report says which shapes were checked, and why not the generic ones
        what = (resizer.__doc__ or "").strip().splitlines()[0].rstrip(".")
        return f"sizes tied by value: resized by {resizer.__name__} ({what}); no smallest case"
    try:
        other = resize_inputs(kwargs, record, smallest=True)
    except ValidationError as error:
        add(CaseReport("smallest", _shapes(kwargs), [], str(error)))
        return ""
    if other is None or _shapes(other) == _shapes(kwargs):
        return ""  # the sample is already the smallest size: its own case checked it
    add(_run_case("smallest", runner, model, other, record, atol, rtol, *floors))
    return ""


def validate_components(artifacts: dict[str, Any], components: dict[str, tuple[torch.nn.Module, Any]],
                        on_case: Callable[[str, int, int], None] | None = None,
                        **options: Any) -> dict[str, ValidationReport]:
    """`validate` each artifact of `export_for_generation` against its eager submodule on the kwargs
    `decompose_for_generation` captured for it (`options`: `validate`'s keywords; `on_case(name,
    done, total)`: `validate`'s `on_case`, told which component).

    Returns:
        `{component name: report}`, in the artifacts' order.
    """
    def told(name: str) -> Callable[[int, int], None] | None:
        return None if on_case is None else lambda done, total: on_case(name, done, total)

    reports = {}
    for name, artifact in artifacts.items():
        with phase("validate", component=name):
            reports[name] = validate(artifact, *components[name], on_case=told(name), **options)
    return reports
