"""`ExportRecord`: what an export knows about its artifact (names, symbolic shapes, how it was made).

The artifact returned by `export()` is the backend's own object; the record rides along on it
(`record_of(artifact)`) so validation, saving and the CLI need not guess. A `torch.export` program
loaded from disk has no record attached, but one can be rebuilt from the program itself.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.utils._pytree as pytree

from .names import CACHE_PREFIX, INTERFACE_CACHE_NAME, io_leaf_names, with_interface_cache_name
from .pytree import leaf_names

__all__ = ["ExportRecord", "record_of", "attach_record", "record_from_program"]

_ATTR = "hfexport_record"


@dataclasses.dataclass
class ExportRecord:
    """Facts about one exported artifact.

    Attributes:
        format: the export format (`"dynamo"`, `"onnx"`, ...).
        model_class: the exported module's class name.
        input_names: flattened user input leaves, in the artifact's order (`input_ids`, `cache.0.keys`);
            cache leaves are `cache.<layer>.<tensor>` on both sides, whatever the argument's name.
        output_names: flattened outputs, in order (`logits`, `cache.0.keys`).
        input_shapes: per input leaf, its dims as ints or symbol expressions (`"s0"`, `"s1 + 1"`).
        symbol_ranges: symbol -> (min, max or None) allowed by the program.
        program: the `torch.export` program the artifact was converted from.
        details: backend facts for the report (precision, delegation, patches applied, ...).
    """

    format: str
    model_class: str
    input_names: list[str]
    output_names: list[str]
    input_shapes: list[tuple[int | str, ...]]
    symbol_ranges: dict[str, tuple[int, int | None]]
    program: torch.export.ExportedProgram | None = None
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    input_keys: list[str] = dataclasses.field(default_factory=list)
    input_dtypes: list[str] = dataclasses.field(default_factory=list)

    def artifact_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The part of forward kwargs the artifact takes (constants like `use_cache` are baked in)."""
        if not self.input_keys:
            return inputs
        if INTERFACE_CACHE_NAME in self.input_keys:
            inputs = with_interface_cache_name(inputs)
        return {key: inputs[key] for key in self.input_keys if key in inputs}

    @property
    def is_dynamic(self) -> bool:
        """Whether any input dimension is symbolic."""
        return any(isinstance(d, str) for shape in self.input_shapes for d in shape)

    def named_inputs(self) -> list[str]:
        """Input names for runtimes with named inputs (ONNX, OpenVINO): cache leaves as
        `input.cache.<layer>.<tensor>`, so each pairs with the output that updates it."""
        return [_side(name, "input") for name in self.input_names]

    def named_outputs(self) -> list[str]:
        """Output names for runtimes with named outputs: cache leaves as `output.cache.<layer>.<tensor>`,
        and an output named as an input (a forward handing back its mask, Qwen2-Audio's
        `attention_mask`) as `output.<name>`, since an ONNX graph names each value once."""
        taken = set(self.input_names)
        return [f"output.{name}" if name in taken else _side(name, "output") for name in self.output_names]

    def summary(self) -> dict[str, Any]:
        """The record as the report shows it: inputs with their shapes, outputs, details."""
        return {
            "format": self.format,
            "model_class": self.model_class,
            "inputs": dict(zip(self.input_names, [list(s) for s in self.input_shapes])),
            "outputs": list(self.output_names),
            **self.details,
        }


def _side(name: str, side: str) -> str:
    return f"{side}.{name}" if name.startswith(f"{CACHE_PREFIX}.") else name


def _bound(value: Any) -> int | None:
    """An int bound, or `None` for an infinite one (`int_oo`)."""
    if getattr(value, "is_finite", True) is False or "oo" in str(value):
        return None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None


def record_from_program(program: torch.export.ExportedProgram, *, format: str = "dynamo",
                        model_class: str | None = None) -> ExportRecord:
    """Build the record of `program` from its signature, tree specs and placeholder metadata."""
    in_spec = program.call_spec.in_spec
    user_inputs = [s for s in program.graph_signature.input_specs
                   if s.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    shapes: list[tuple[int | str, ...]] = []
    dtypes: list[str] = []
    for spec in user_inputs:
        node = placeholders.get(getattr(spec.arg, "name", ""))
        val = node.meta.get("val") if node is not None else None
        shapes.append(tuple(int(d) if isinstance(d, int) or str(d).isdigit() else str(d) for d in val.shape)
                      if isinstance(val, torch.Tensor) else ())
        dtypes.append(str(val.dtype).removeprefix("torch.") if isinstance(val, torch.Tensor) else "")
    input_keys: list[str] = []
    if in_spec is not None:
        args, kwargs = _placeholder_tree(in_spec)
        input_names = leaf_names(args, "arg") + io_leaf_names(kwargs)
        input_keys = list(kwargs)
    else:
        input_names = [s.arg.name for s in user_inputs]
    output_names = [name for name, none in zip(user_output_names(program), none_outputs(program)) if not none]
    ranges = {str(sym): (_bound(vr.lower) or 0, _bound(vr.upper)) for sym, vr in program.range_constraints.items()}
    model_class = model_class or getattr(program, "_hfexport_model_class", None) or "ExportedProgram"
    return ExportRecord(format, model_class, input_names, output_names, shapes, ranges, program,
                        input_keys=input_keys, input_dtypes=dtypes)


def user_output_names(program: torch.export.ExportedProgram) -> list[str]:
    """The name of each user output leaf, in the program's order, the constant `None`s' included
    (the record's `output_names` leaves those out: `none_outputs`)."""
    out_spec = program.call_spec.out_spec
    return leaf_names(_placeholder_tree(out_spec)) if out_spec else []


def none_outputs(program: torch.export.ExportedProgram) -> list[bool]:
    """Per user output leaf, whether it is a constant `None` (`hidden_states` entries a model left
    empty): runtimes with named outputs (ONNX, OpenVINO) have no such output, so it gets no name."""
    kinds = torch.export.graph_signature.OutputKind
    return [spec.kind == kinds.USER_OUTPUT and isinstance(spec.arg, torch.export.graph_signature.ConstantArgument)
            and spec.arg.value is None
            for spec in program.graph_signature.output_specs if spec.kind == kinds.USER_OUTPUT]


def _placeholder_tree(spec: pytree.TreeSpec) -> Any:
    """`spec` rebuilt with empty tensors as leaves (caches keep tensor leaves only)."""
    return pytree.tree_unflatten([torch.empty(0) for _ in range(spec.num_leaves)], spec)


def attach_record(artifact: Any, record: ExportRecord) -> None:
    """Attach `record` to `artifact` (`record_of` finds it again)."""
    try:
        setattr(artifact, _ATTR, record)
    except (AttributeError, TypeError):
        _side_records[id(artifact)] = (artifact, record)


_side_records: dict[int, tuple[Any, ExportRecord]] = {}


def record_of(artifact: Any) -> ExportRecord:
    """Return the `ExportRecord` of an artifact made by hfexport (or rebuilt for a loaded program)."""
    record = getattr(artifact, _ATTR, None)
    if record is not None:
        return record
    held = _side_records.get(id(artifact))
    if held is not None and held[0] is artifact:
        return held[1]
    if isinstance(artifact, torch.export.ExportedProgram):
        return record_from_program(artifact)
    raise TypeError(
        f"{type(artifact).__name__} carries no hfexport record; validate artifacts returned by an hfexport exporter"
    )
