"""Every artifact declares the program's shapes ("static means static").

For each component of every generation case, the shapes the artifact itself declares (ONNX graph
inputs' `dim_value`/`dim_param`, OpenVINO ports' partial shapes, ExecuTorch's method meta) are
checked against the program's (`record.input_shapes`: ints and symbol expressions): a size the
program fixes is declared as that number; a symbolic one as a symbolic dimension, under one name
wherever it appears (a cache's keys and values share `cache_length`, every input's batch is
`batch`); ExecuTorch declares a symbolic size at its upper bound.
"""

from __future__ import annotations

import re

import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
ov = pytest.importorskip("openvino")

from hfexport import GenerationExport  # noqa: E402
from hfexport.capture.names import role_of  # noqa: E402

from ..generation.exports import CASES, MAX_CACHE_LEN  # noqa: E402

pytestmark = pytest.mark.slow  # every test reads generation exports to ONNX, OpenVINO or ExecuTorch

#: Inputs whose batch axis counts images rather than sequences.
_IMAGE_INPUTS = ("pixel_values", "pixel_values_videos")


def _components(saved_generation, fmt: str, case: str):
    saved = saved_generation(fmt, case)
    return saved, GenerationExport.load(saved.directory).components


# -- what each artifact declares: per input or output, a list of int (static), str (a named
# -- symbolic dim) or None (a symbolic dim without a name) --------------------------------------

def _onnx_dim(dim) -> int | str | None:
    if dim.HasField("dim_value"):
        return dim.dim_value
    return dim.dim_param if dim.HasField("dim_param") else None


def _onnx_declared(path) -> tuple[list[list], dict[str, list]]:
    """Graph inputs' shapes in order, and outputs' shapes by name."""
    graph = onnx.load(str(path), load_external_data=False).graph

    def shape(value) -> list:
        return [_onnx_dim(d) for d in value.type.tensor_type.shape.dim]

    return [shape(v) for v in graph.input], {v.name: shape(v) for v in graph.output}


def _openvino_declared(model, record) -> tuple[list[list], dict[str, list]]:
    """Input ports' shapes in `record.input_names` order, and output ports' shapes by name; a
    stateful model's cache leaves are its variables (their shapes on both sides).

    Inputs are taken by position: an input passed through unchanged to an output (T5's encoder
    states, a sliding window's size) shares its tensor with that output, and a saved model gives
    it the output's name.
    """
    def shape(port) -> list:
        return [d.get_length() if d.is_static else None for d in port.get_partial_shape()]

    states = {op.get_variable_id(): shape(op.output(0)) for op in model.get_ops() if op.get_type_name() == "ReadValue"}
    ports = iter(p for p in model.inputs if p.get_any_name() != "beam_idx")
    inputs = [states[name] if name in states else shape(next(ports)) for name in record.input_names]
    outputs = {p.get_any_name(): shape(p) for p in model.outputs}
    outputs.update({f"output.{name}": dims for name, dims in states.items()})
    return inputs, outputs


def _as_the_graph_takes_it(record):
    """The record's inputs as an ONNX GroupQueryAttention graph declares them (the record keeps
    hfexport's interface, `record.details["graph_interface"]` the translation): the write counters
    and unread inputs left out, the 4-D mask `[batch, 1, query, attended]` as `[batch, attended]`."""
    import dataclasses

    from hfexport.backends.onnx.graph_interface import GraphInterface

    interface = GraphInterface.of(record)
    if interface is None:
        return record
    kept = [(name, [shape[0], shape[-1]] if name == "attention_mask" else shape)
            for name, shape in zip(record.input_names, record.input_shapes)
            if name not in interface.counters and name not in interface.unfed]
    return dataclasses.replace(record, input_names=[n for n, _ in kept], input_shapes=[s for _, s in kept])


def _io_name(record_name: str) -> str:
    """The name a runtime with named I/O gives an input leaf (`input.cache.0.keys`)."""
    return f"input.{record_name}" if record_name.split(".")[0] == "cache" else record_name


# -- the checks -------------------------------------------------------------------------------------

def _check_inputs(record, declared: list[list], *, named: bool) -> dict[str, str]:
    """Fixed sizes declared as themselves, symbolic ones as symbolic; with `named`, one name per
    symbol expression (returned: expression -> declared name)."""
    names: dict[str, str] = {}
    for name, shape, dims in zip(record.input_names, record.input_shapes, declared):
        assert len(dims) == len(shape), (name, shape, dims)
        for axis, (program, artifact) in enumerate(zip(shape, dims)):
            where = f"{name}[{axis}]: program {shape}, artifact {dims}"
            if isinstance(program, int):
                assert artifact == program, where
                continue
            assert not isinstance(artifact, int), where
            if named:
                assert isinstance(artifact, str) and artifact and not artifact.isdigit(), where
                assert not re.search(r"\bs\d+\b", artifact), f"raw torch symbol in {where}"
                assert names.setdefault(program, artifact) == artifact, f"{program} named twice: {where}"
    return names


def _check_roles(record, declared: list[list]) -> None:
    """Every self-attention cache's keys and values share `cache_length`; every batch is `batch`."""
    for name, shape, dims in zip(record.input_names, record.input_shapes, declared):
        parts = name.split(".")
        for axis, (program, artifact) in enumerate(zip(shape, dims)):
            if isinstance(program, int) or not program.isidentifier():
                continue
            role = role_of(name, len(shape), axis)
            if role == "cache_length" and parts[-1] in ("keys", "values") and "cross_attention" not in parts:
                assert artifact == "cache_length", (name, axis, dims)
            if role == "batch" and parts[-1] not in _IMAGE_INPUTS:
                assert artifact == "batch", (name, axis, dims)


def _check_outputs(declared_inputs: dict[str, list], outputs: dict[str, list], vocab_size: int,
                   known_names: set[str]) -> None:
    """Logits end in the vocabulary size; an updated cache keeps every fixed size of the cache fed
    in; a named symbolic output dim is an expression over the inputs' dim names."""
    for name, dims in outputs.items():
        if name.endswith("logits"):
            assert dims[-1] == vocab_size, (name, dims)
        fed = declared_inputs.get(name.replace("output.", "input.", 1)) if name.startswith("output.") else None
        if fed is not None:
            assert len(dims) == len(fed), (name, dims, fed)
            for axis, (size, fed_size) in enumerate(zip(dims, fed)):
                if isinstance(fed_size, int):
                    assert size == fed_size, (name, axis, dims, fed)
        for dim in dims:
            if isinstance(dim, str):
                assert not dim.isdigit(), (name, dims)
                symbols = set(re.findall(r"\b([A-Za-z_]\w*)\b(?!\()", dim))  # not `Max(` and the like
                assert symbols <= known_names, (name, dims, known_names)


# -- ONNX and OpenVINO: every case ----------------------------------------------------------------

@pytest.mark.parametrize("case", list(CASES))
def test_onnx_declares_the_program_shapes(saved_generation, case):
    saved, components = _components(saved_generation, "onnx", case)
    for component in components.values():
        record = _as_the_graph_takes_it(component.record)
        declared, outputs = _onnx_declared(component.files[0])
        assert len(declared) == len(record.input_names)
        names = _check_inputs(record, declared, named=True)
        _check_roles(record, declared)
        inputs = {_io_name(name): dims for name, dims in zip(record.input_names, declared)}
        _check_outputs(inputs, outputs, saved.model.config.get_text_config().vocab_size, set(names.values()))


@pytest.mark.parametrize("case", list(CASES))
def test_openvino_declares_the_program_shapes(saved_generation, case):
    saved, components = _components(saved_generation, "openvino", case)
    for component in components.values():
        record = component.record
        declared, outputs = _openvino_declared(component.artifact, record)
        assert len(declared) == len(record.input_names)
        _check_inputs(record, declared, named=False)
        inputs = {_io_name(name): dims for name, dims in zip(record.input_names, declared)}
        _check_outputs(inputs, outputs, saved.model.config.get_text_config().vocab_size, set())


def test_the_static_decode_graph_declares_its_cache_in_full(saved_generation):
    """The numbers a caller sizes a static cache from: ONNX `[1, heads, cache_length, head_dim]`
    with the heads and head_dim as numbers, OpenVINO the same with `?` for the length (and the
    batch: its growing state takes any)."""
    saved = saved_generation("onnx", "llama-static")
    config = saved.model.config
    heads, head_dim = config.num_key_value_heads, config.head_dim
    for fmt, declared_of, length in (("onnx", lambda c: _onnx_declared(c.files[0]), "cache_length"),
                                     ("openvino", lambda c: _openvino_declared(c.artifact, c.record), None)):
        decode = _components(saved_generation, fmt, "llama-static")[1]["decode"]
        inputs, outputs = declared_of(decode)
        record = _as_the_graph_takes_it(decode.record) if fmt == "onnx" else decode.record
        caches = [dims for name, dims in [*zip(record.input_names, inputs), *outputs.items()]
                  if name.endswith((".keys", ".values"))]
        assert len(caches) == 4 * config.num_hidden_layers
        # OpenVINO maps a static cache onto its growing state (`genai.py`), whose batch follows beam_idx
        batch = None if (decode.record.details.get("state") or {}).get("layout") == "growing" else 1
        assert all(dims == [batch, heads, length, head_dim] for dims in caches), (fmt, caches)


# -- ExecuTorch: a symbolic size is declared at its upper bound ------------------------------------

def _upper_bound(expression: str, ranges: dict[str, tuple]) -> int:
    import sympy

    symbols = {s: sympy.Symbol(s) for s in re.findall(r"\bs\d+\b", expression)}
    value = sympy.sympify(expression, locals=symbols).subs({symbols[s]: ranges[s][1] for s in symbols})
    return int(value)


@pytest.mark.parametrize("case", ["llama-static", "llama"])
def test_executorch_method_meta_declares_the_program_shapes(saved_generation, case):
    runtime = pytest.importorskip("executorch.runtime")
    _, components = _components(saved_generation, "executorch", case)
    for name, component in components.items():
        record = component.record
        meta = runtime.Runtime.get().load_program(str(component.files[0])).metadata("forward")
        assert meta.num_inputs() == len(record.input_shapes)
        for index, (input_name, shape) in enumerate(zip(record.input_names, record.input_shapes)):
            sizes = list(meta.input_tensor_meta(index).sizes())
            expected = [d if isinstance(d, int) else _upper_bound(d, record.symbol_ranges) for d in shape]
            assert sizes == expected, (name, input_name, shape, sizes)
            if CASES[case][1] and role_of(input_name, len(shape), 2) == "cache_length" and len(shape) == 4:
                assert sizes[2] == MAX_CACHE_LEN, (input_name, sizes)  # planned at the static cache's size
