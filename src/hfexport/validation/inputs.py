"""Inputs of other sizes than the sample's, for the resized cases of `validate`.

`resize_inputs` moves every symbolic size of the program (batch 1 -> 3, sequence 7 -> 9), or takes
every batch and token count down to 1 (`smallest=True`), keeping what ties sizes together: a mask
covering the cache, a static cache's writes inside its length. A model whose input sizes are tied
by their values registers its own resizer instead (`register_resizer`, `RESIZERS`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..capture.record import ExportRecord
from ..errors import ValidationError

__all__ = ["resize_inputs", "RESIZERS", "register_resizer"]


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
    from ..capture.dynamic import TOKEN_ROLES
    from ..capture.names import role_of

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
            elif name == "position_ids" and leaf.dim() == 2 and not leaf.is_floating_point():
                resized.append(_positions(leaf, size))
            elif name.endswith("attention_mask") and leaf.dim() == 4 and leaf.dtype == torch.bool:
                resized.append(_causal_mask(leaf, size))
            else:
                resized.append(_tile(leaf, size))
        else:
            resized.append(leaf)
    return {**inputs, **pytree.tree_unflatten(resized, spec)}



def _positions(positions: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Token positions `[batch, query]` resized: each row consecutive from its first position (the
    tokens before the query), as a runtime numbers a longer or shorter query after the same cache,
    and as the resized masks place it (`_padding_mask`, `_causal_mask`). Tiled instead, a query of
    three would sit at one position three times: eager takes that, while a graph that numbers the
    query from the mask (GroupQueryAttention's own rotary) cannot."""
    first = _tile(positions[:, :1], (shape[0], 1))
    return (first + torch.arange(shape[1], dtype=positions.dtype)).contiguous()


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

