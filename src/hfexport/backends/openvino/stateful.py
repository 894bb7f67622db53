"""The cache of a generation component as OpenVINO state: `ReadValue`/`Assign` variables.

A component whose cache leaves come back updated (`input.cache.<layer>.<tensor>` paired with
`output.cache.<layer>.<tensor>`: a static cache written in place, a dynamic cache grown by one
token) is rewritten so that each pair is one variable named by its leaf (`cache.0.keys`), as
OpenVINO's own stateful LLMs are: the model's inputs are the other inputs plus `beam_idx`, its
outputs the others (`logits`). A caller creates one infer request, sets (or resets) the state
once, and feeds only tokens, positions and masks each step.

# NOTE: a variable rather than a fed-back cache, because the plugin then keeps the cache in its
# own memory between calls (no copy of the whole cache in and out per token), and the CPU plugin
# fuses `ReadValue -> Gather(beam_idx) -> Concat -> ScaledDotProductAttention -> Assign` (a
# dynamic cache) into its KV-cache attention, which reads only the tokens cached. `beam_idx`
# (int32, one index per batch row) reorders the batch of every cache leaf of rank >= 2 along
# axis 0 before it is used, which is how a beam search or a batch reset is done on state; the
# runner feeds `0..batch-1`. Scalar leaves (a static cache's write counter) are not reordered.

# NOTE: an int64 leaf (a static cache's write counter) is kept as an int32 variable, converted
# on the way in and out: OpenVINO 2026.4.1's CPU plugin refuses int64 state ("CPU plugin does not
# support i64 for use with oneDNN"). The record lists such leaves under `variable_types`.

# NOTE: we build the variables ourselves rather than with `openvino.passes.MakeStateful`: the
# pass (openvino 2026.4.1) names each variable by concatenating the Parameter's and the Result's
# friendly names, which are arbitrary here (`input4Result_1235`); a C++ user needs stable names.
# Each `ReadValue` also gets the value a reset state takes (zeros: an empty dynamic cache, a
# static cache's buffers at the traced length, counters at 0). Without one, 2026.4.1's CPU
# plugin fails to compile the KV-cache attention it fuses ("Node ... contains less parent edges
# than 0"). Leaves with other initial values (the manifest's `initial_cache`) are set after a reset.

# NOTE: a model with M-RoPE positions (`position_ids` `[3, batch, sequence]`, Qwen2-VL) reads its
# batch size from its token input, not from the cache: `torch.export` may take the batch from a
# cache leaf's shape, and openvino 2026.4.1's `SDPAToPagedAttention` (VLMPipeline's default
# `ATTENTION_BACKEND="PA"`) replaces such a read with `position_ids.shape[0]`, the batch of its 1-D
# `[tokens]` positions but 3 for M-RoPE's `[3, tokens]`: the attention's `view` then failed
# ("the shape of input data (23.1.32) conflicts with the reshape pattern (3.1.-1.8)").
"""

from __future__ import annotations

from typing import Any

__all__ = ["BEAM_IDX", "make_stateful", "state_variables", "is_stateful"]

#: the name of the batch-reordering input of a stateful model
BEAM_IDX = "beam_idx"
_IN, _OUT = "input.", "output."


def cache_pairs(model: Any) -> list[tuple[str, Any, Any]]:
    """`(leaf, Parameter, Result)` for every cache leaf that is both an input and an output of `model`."""
    results = {r.output(0).get_any_name(): r for r in model.get_results()}
    pairs = []
    for parameter in model.get_parameters():
        name = parameter.output(0).get_any_name()
        if name.startswith(_IN + "cache.") and _OUT + name[len(_IN):] in results:
            leaf = name[len(_IN):]
            pairs.append((leaf, parameter, results[_OUT + leaf]))
    return pairs


def make_stateful(model: Any, sizes: dict[str, list[int]] | None = None) -> dict[str, Any] | None:
    """Turn every cache input/output pair of `model` (an `openvino.Model`, changed in place) into
    a variable named by its leaf, and add the `beam_idx` input; return what the record says
    (`{"variables": [...], "beam_idx": "beam_idx", "reordered": [...]}`), or `None` when the
    model has no cache pair (nothing changed).

    Args:
        sizes: per leaf, the shape a reset state takes (a static cache's buffers at their
            length); a leaf not listed resets to an empty cache (its dynamic axes 0).
    """
    import openvino as ov
    import openvino.opset13 as ops
    from openvino.op.util import Variable, VariableInfo

    pairs = cache_pairs(model)
    if not pairs:
        return None
    _batch_from_tokens(model, [parameter for _, parameter, _ in pairs])
    beam_idx = ops.parameter(ov.PartialShape([-1]), ov.Type.i32, name=BEAM_IDX)
    beam_idx.output(0).set_names({BEAM_IDX})
    axis = ops.constant(0, ov.Type.i64)
    narrower = {ov.Type.i64: ov.Type.i32}  # see the module note
    sinks, reordered, narrowed = [], [], {}
    grows = all(_appends_to(parameter, result) for _, parameter, result in pairs)
    for leaf, parameter, result in pairs:
        info = VariableInfo()
        info.variable_id = leaf
        info.data_shape = parameter.get_partial_shape()
        leaf_type = parameter.get_element_type()
        info.data_type = narrower.get(leaf_type, leaf_type)
        variable = Variable(info)
        read = ov.op.read_value(_reset_value(parameter, info.data_type, beam_idx, (sizes or {}).get(leaf)), variable)
        read.set_friendly_name(f"{leaf}.read")
        value = read.output(0)
        if info.data_type != leaf_type:
            value = ops.convert(value, leaf_type).output(0)
            narrowed[leaf] = info.data_type.to_string()
        if parameter.get_partial_shape().rank.get_length() >= 2:
            value = ops.gather(read, beam_idx, axis, name=f"{leaf}.beam_gather").output(0)
            reordered.append(leaf)
        for target in list(parameter.output(0).get_target_inputs()):
            target.replace_source_output(value)
        new_value = result.input_value(0)
        if info.data_type != leaf_type:
            new_value = ops.convert(new_value, info.data_type).output(0)
        # NOTE: openvino 2026.4.1's Python `op.assign` takes a Node (its output 0), not an Output;
        # the producer of a cache leaf may have several outputs, so its input is set afterwards.
        assign = ov.op.assign(new_value.get_node(), variable)
        assign.input(0).replace_source_output(new_value)
        assign.set_friendly_name(f"{leaf}.assign")
        sinks.append(assign)
        model.remove_result(result)
        model.remove_parameter(parameter)
    model.add_parameters([beam_idx])
    model.add_sinks(sinks)
    model.validate_nodes_and_infer_types()
    return {"variables": [leaf for leaf, _, _ in pairs], "beam_idx": BEAM_IDX, "reordered": reordered,
            "variable_types": narrowed, "grows": grows}


def _batch_from_tokens(model: Any, caches: list[Any]) -> None:
    """In a model with M-RoPE `position_ids` (rank 3), read the batch size (`shape[0]`) of the
    cache parameters `caches` from the token input instead (see the module note)."""
    import openvino.opset13 as ops

    inputs = {parameter.output(0).get_any_name(): parameter for parameter in model.get_parameters()}
    positions = inputs.get("position_ids")
    tokens = inputs["inputs_embeds"] if "inputs_embeds" in inputs else inputs.get("input_ids")
    if positions is None or tokens is None or positions.get_partial_shape().rank.get_length() != 3:
        return
    for cache in caches:
        if cache.get_partial_shape().rank.get_length() < 2:
            continue
        for shape_read in [t.get_node() for t in cache.output(0).get_target_inputs()]:
            if shape_read.get_type_name() != "ShapeOf":
                continue
            for target in list(shape_read.output(0).get_target_inputs()):
                gather = target.get_node()
                if gather.get_type_name() == "Gather" and _constant_values(gather, 1) == [0] \
                        and _constant_values(gather, 2) == [0]:
                    batch = ops.shape_of(tokens, shape_read.get_output_element_type(0))
                    target.replace_source_output(batch.output(0))


def _constant_values(node: Any, port: int) -> list[int] | None:
    """The values of `node`'s input `port` when it is a Constant, flattened; else None."""
    source = node.input_value(port).get_node()
    if source.get_type_name() != "Constant":
        return None
    return [int(v) for v in source.get_data().reshape(-1)]


def _appends_to(parameter: Any, result: Any) -> bool:
    """Whether the leaf's new value is its old value with the call's tokens concatenated (a
    dynamic cache's key/value layer), so its variable grows with the tokens."""
    producer = result.input_value(0).get_node()
    return producer.get_type_name() == "Concat" and any(
        value.get_node() is parameter or value.get_node().get_friendly_name() == parameter.get_friendly_name()
        for value in producer.input_values())


def _reset_value(parameter: Any, dtype: Any, beam_idx: Any, size: list[int] | None) -> Any:
    """The value a reset variable takes: zeros, batch from `beam_idx`, other axes as the
    parameter fixes them, else `size`'s, else 0 (an empty dynamic cache)."""
    import openvino as ov
    import openvino.opset13 as ops

    shape = parameter.get_partial_shape()
    zero = ops.constant(0, dtype)
    if shape.rank.get_length() == 0:
        return zero
    dims = []
    for axis in range(shape.rank.get_length()):
        if axis == 0 and shape.rank.get_length() >= 2 and not shape[0].is_static:
            dims.append(ops.shape_of(beam_idx, ov.Type.i64))  # the batch the caller feeds
        else:
            fixed = shape[axis].get_length() if shape[axis].is_static else (size[axis] if size else 0)
            dims.append(ops.constant([fixed], ov.Type.i64))
    return ops.broadcast(zero, ops.concat(dims, 0))


def state_variables(model: Any) -> list[str]:
    """The variable ids of a stateful `model` (its `Assign` sinks), in the model's order; `[]` when stateless."""
    return [sink.get_variable_id() for sink in model.get_sinks() if hasattr(sink, "get_variable_id")]


def is_stateful(model: Any) -> bool:
    """Whether `model` keeps state (has variables)."""
    return bool(state_variables(model))
