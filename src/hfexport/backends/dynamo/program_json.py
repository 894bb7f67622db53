"""What a `.pt2`'s program (`models/model.json`) and payload configs may say: `program_fault`,
`payload_config_fault`, a walk along torch's own serialization schema with a rule for every string.

# NOTE: torch 2.13 reads these files into the dataclasses of torch/_export/serde/schema.py
# (`_dict_to_dataclass`, by their type hints) and then resolves or pastes their strings
# (torch/_export/serde/serialize.py, torch/export/_unlift.py, torch/fx/graph.py): a node's target
# and an operator argument by `getattr` chains on `torch`, `operator` or `math`; a `source_fn_stack`
# entry the same way; a tree spec through pytree's registry (`tree_specs.py`); an `expr_str`
# through `sympy.sympify`; guards through `exec`; names (nodes, arguments, parameters, keyword
# arguments) into the Python source FX generates and `exec`s; a placeholder's string constant into
# a guard's source; custom objects by class name. So the walk follows the same type hints, refuses
# a field the schema lacks or a union member hfexport never writes, and holds every string field to
# a rule of its own (`_STRINGS`, `_KEYS`): identifiers for names, dotted names for parameters,
# an operator of the namespaces hfexport's programs use (or a function of sizes) for targets, the
# grammars of `expressions.py`, text without control characters for what is only shown. A string
# field without a rule is refused: a field a later torch adds is refused until it has one.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import json
import re
import types
import typing
from typing import Any, Callable

from .expressions import is_guard, is_size_expression
from .tree_specs import tree_spec_fault

__all__ = ["program_fault", "payload_config_fault"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOTTED = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")
#: The operator namespaces of hfexport's programs: ATen, transformers' own custom ops (its MoE
#: `grouped_mm_fallback`), and the quantize/dequantize ops of PT2E int8 (`--quantize int8-dynamic`).
_OVERLOAD = re.compile(r"torch\.ops\.(aten|transformers|quantized_decomposed)\.([A-Za-z_][A-Za-z0-9_]*)"
                       r"\.([A-Za-z][A-Za-z0-9_]*)")
#: The functions of sizes a node may call, as torch 2.13 serializes its `_SYM_OPS` (serialize.py): the
#: only targets besides operators it deserializes (`llava`'s program calls `torch.sym_ite`).
_SIZE_OPERATORS = {*(f"_operator.{name}" for name in ("add", "and_", "eq", "floordiv", "ge", "gt", "le", "lshift", "lt",
                                                      "mod", "mul", "ne", "neg", "or_", "pos", "pow", "rshift", "sub",
                                                      "truediv")),
                   "math.trunc", "torch._sym_sqrt", "torch.sym_float", "torch.sym_int", "torch.sym_ite",
                   "torch.sym_max", "torch.sym_min", "torch.sym_not"}


def _operator_fault(text: str) -> str | None:
    import torch._ops  # OpOverloadPacket, read from torch 2.13

    match = _OVERLOAD.fullmatch(text)
    if text in _SIZE_OPERATORS or match and _is_operator_name(match[1], match[2]) and inspect.getattr_static(
            torch._ops.OpOverloadPacket, match[3], None) is None:
        return None
    return "is not an operator of torch.ops.aten, transformers or quantized_decomposed, nor a function of sizes"


def _is_operator_name(namespace: str, name: str) -> bool:
    """Whether `torch.ops.<namespace>.<name>` can only be an operator (not an attribute of the
    namespace object itself, as `__class__` or `__dict__` are)."""
    import torch

    found = inspect.getattr_static(getattr(torch.ops, namespace), name, None)
    return found is None or isinstance(found, torch._ops.OpOverloadPacket)


def _pattern(pattern: re.Pattern, what: str) -> Callable[[str], str | None]:
    return lambda text: None if pattern.fullmatch(text) else f"is not {what}"


def _one_of(*allowed: str) -> Callable[[str], str | None]:
    return lambda text: None if text in allowed else f"is not one of {', '.join(allowed)}"


_NAME = _pattern(_IDENTIFIER, "a Python identifier")
_FQN = _pattern(_DOTTED, "a dotted name")
_TEXT = _pattern(re.compile(r"[^\x00-\x1f\x7f-\x9f\u2028\u2029]*"), "text without control characters")
_TRACE = _pattern(re.compile(r"[^\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]*"), "text without control characters")

#: (schema class, field) -> the rule a string there (or each string of a list there) must meet.
_STRINGS: dict[tuple[str, str], Callable[[str], str | None]] = {
    ("SymExpr", "expr_str"): lambda text: None if is_size_expression(text) else (
        "is not a size expression of hfexport's grammar (torch.export.load evaluates it: sympy.sympify)"),
    ("ExportedProgram", "guards_code"): lambda text: None if is_guard(text) else (
        "is not a test on input sizes (the loaded program runs it as Python before each call)"),
    ("ExportedProgram", "verifiers"): _one_of("ATEN", "TRAINING"),
    ("ExportedProgram", "torch_version"): _pattern(re.compile(r"[0-9A-Za-z.+_-]+"), "a version"),
    ("Node", "target"): _operator_fault,
    ("Node", "name"): _NAME,
    ("TensorArgument", "name"): _NAME,
    ("TokenArgument", "name"): _NAME,
    ("SymIntArgument", "as_name"): _NAME,
    ("SymFloatArgument", "as_name"): _NAME,
    ("SymBoolArgument", "as_name"): _NAME,
    ("NamedArgument", "name"): _NAME,
    ("ModuleCallSignature", "forward_arg_names"): _NAME,
    ("ModuleCallSignature", "in_spec"): tree_spec_fault,
    ("ModuleCallSignature", "out_spec"): tree_spec_fault,
    ("ModuleCallEntry", "fqn"): lambda text: None if text == "" else _FQN(text),
    ("InputToParameterSpec", "parameter_name"): _FQN,
    ("InputToBufferSpec", "buffer_name"): _FQN,
    ("InputToTensorConstantSpec", "tensor_constant_name"): _FQN,
    ("BufferMutationSpec", "buffer_name"): _FQN,
    ("UserInputMutationSpec", "user_input_name"): _NAME,
    ("Device", "type"): _one_of("cpu", "cuda"),
    ("Argument", "as_string"): _TEXT,  # FX writes it with repr()
    ("Argument", "as_strings"): _TEXT,
    ("PayloadMeta", "path_name"): _pattern(re.compile(r"(weight|tensor)_(0|[1-9][0-9]*)"), "a tensor payload's name"),
}
#: (schema class, dict field) -> the rule its keys must meet.
_KEYS: dict[tuple[str, str], Callable[[str], str | None]] = {
    ("ExportedProgram", "opset_version"): _NAME,
    ("ExportedProgram", "range_constraints"): _TEXT,  # a size's name or printed expression, only looked up
    ("Graph", "tensor_values"): _NAME,
    ("Graph", "sym_int_values"): _NAME,
    ("Graph", "sym_bool_values"): _NAME,
    ("Graph", "sym_float_values"): _NAME,
    ("PayloadConfig", "config"): _FQN,
}
def _custom(text: str) -> str | None:
    """The rule of a node's `custom` metadata: a JSON object of plain values (torch's tracer marks
    nodes `{"_torchdynamo_disable": true, ...}` in a torchao-quantized program), its names
    identifiers and its strings free of control characters: torch 2.13 `json.loads` it and FX
    prints it into a comment of the source it generates (`fx/graph.py`, "Annotation:")."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return "is not JSON"
    if not (isinstance(value, dict) and all(isinstance(k, str) and _IDENTIFIER.fullmatch(k) for k in value)):
        return "is not a JSON object keyed by names"
    for item in value.values():
        if not (item is None or isinstance(item, (bool, int, float)) or (isinstance(item, str) and not _TEXT(item))):
            return "holds a value other than a number, a boolean or text without control characters"
    return None


#: Node metadata torch reads without resolving anything, and the rule of its text: hfexport's
#: programs hold these five (`source_fn_stack` is resolved by getattr).
_METADATA = {"stack_trace": _TRACE, "nn_module_stack": _TEXT, "torch_fn": _TEXT, "from_node": _TEXT,
             "custom": _custom}
#: Union members hfexport never writes, which name code, graphs or objects, or feed guards' source.
_REFUSED_MEMBERS = {
    "Argument": {"as_custom_obj", "as_operator", "as_graph", "as_string_to_argument"},
    "InputSpec": {"custom_obj", "token", "constant_input"},
    "OutputSpec": {"loss_output", "gradient_to_parameter", "gradient_to_user_input", "token", "parameter_mutation"},
}
#: Fields that hfexport's programs leave empty.
_EMPTY = {("GraphModule", "metadata"), ("GraphModule", "treespec_namedtuple_fields"), ("Graph", "custom_obj_values")}
_NON_FINITE = {"Infinity", "-Infinity", "NaN", "inf", "-inf", "nan"}


class _Fault(Exception):
    """Where the walk stopped, and why."""

    def __init__(self, where: str, why: str):
        super().__init__(f"{where} {why}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    from torch._export.serde import schema  # the schema torch 2.13 reads a program into

    return typing.get_type_hints(cls, globalns=vars(schema))


def _schema(name: str) -> type:
    from torch._export.serde import schema

    return getattr(schema, name)


def program_fault(program: Any) -> str | None:
    """Why `program` (the JSON of `models/model.json`) holds something hfexport does not write, or
    None: see the module's note."""
    return _fault(_schema("ExportedProgram"), program)


def payload_config_fault(config: Any) -> str | None:
    """Why `config` (a payload config's JSON) holds something hfexport does not write, or None."""
    return _fault(_schema("PayloadConfig"), config)


def _fault(cls: type, tree: Any) -> str | None:
    try:
        _walk(cls, tree, "", None)
    except _Fault as fault:
        return str(fault)
    except RecursionError:
        return "it nests too deep"
    return None


def _at(where: str, key: Any) -> str:
    return f"{where}.{str(key)[:60]}" if where else str(key)[:60]


def _walk(kind: Any, value: Any, where: str, field: tuple[str, str] | None) -> None:
    """Check `value` as torch would read it as `kind` (a schema type), from `field` (class, name)."""
    from torch._export.serde.union import _Union

    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(kind):
            return
        kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
        origin = typing.get_origin(kind)
    if isinstance(kind, type) and issubclass(kind, _Union):
        if not (isinstance(value, dict) and len(value) == 1):
            raise _Fault(where or "it", f"is not one of {kind.__name__}'s kinds")
        (member, inner), = value.items()
        if member not in _hints(kind) or member == "_type" or member in _REFUSED_MEMBERS.get(kind.__name__, ()):
            raise _Fault(where, f"is a {kind.__name__} of kind {str(member)[:60]!r}, which hfexport never writes")
        _member(kind, member, inner, _at(where, member))
    elif dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            raise _Fault(where or "it", f"is not a {kind.__name__}")
        names = {f.name for f in dataclasses.fields(kind)}
        for key, inner in value.items():
            if key not in names:
                raise _Fault(_at(where, key), f"is not a field of torch's {kind.__name__}")
            _member(kind, key, inner, _at(where, key))
    elif origin is list:
        if not isinstance(value, list):
            raise _Fault(where, "is not a list")
        for index, item in enumerate(value):
            _walk(typing.get_args(kind)[0], item, f"{where}[{index}]", field)
    elif origin is dict:
        _dict(kind, value, where, field)
    else:
        _scalar(kind, value, where, field)


def _member(cls: type, name: str, value: Any, where: str) -> None:
    field = (cls.__name__, name)
    if field in _EMPTY and value not in ({}, [], None):
        raise _Fault(where, "is not empty, as in every program hfexport writes")
    if field == ("Node", "metadata"):
        _metadata(value, where)
    elif field == ("Graph", "inputs"):
        if not (isinstance(value, list) and all(isinstance(item, dict) and list(item) == ["as_tensor"]
                                                for item in value)):
            raise _Fault(where, "holds an input that is not a tensor (a constant torch would paste into a guard)")
        _walk(_hints(cls)[name], value, where, field)
    else:
        _walk(_hints(cls)[name], value, where, field)


def _metadata(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise _Fault(where, "is not a dict")
    for key, text in value.items():
        rule = _METADATA.get(key)
        if rule is None:
            raise _Fault(_at(where, key), "is node metadata hfexport never writes")
        if not isinstance(text, str) or (fault := rule(text)):
            raise _Fault(_at(where, key), fault or "is not text")


def _dict(kind: Any, value: Any, where: str, field: tuple[str, str] | None) -> None:
    if not isinstance(value, dict):
        raise _Fault(where, "is not a dict")
    rule = _KEYS.get(field) if field else None
    for key, inner in value.items():
        if rule is None:
            raise _Fault(f"{where}[{str(key)[:60]!r}]", "is a key where hfexport writes none")
        if fault := rule(key):
            raise _Fault(f"{where}[{key[:60]!r}]", f"(a key) {fault}")
        _walk(typing.get_args(kind)[1], inner, f"{where}[{key!r}]", field)


def _scalar(kind: Any, value: Any, where: str, field: tuple[str, str] | None) -> None:
    if kind is str:
        rule = _STRINGS.get(field) if field else None
        if rule is None:
            raise _Fault(where, "is a string where hfexport writes none")
        if not isinstance(value, str):
            raise _Fault(where, "is not a string")
        if fault := rule(value):
            raise _Fault(where, f"= {value!r} {fault}") if len(value) <= 120 else _Fault(f"{where}:", fault)
    elif kind is bool:
        if not isinstance(value, bool):
            raise _Fault(where, "is not a bool")
    elif kind is int:
        if type(value) is not int:
            raise _Fault(where, "is not an int")
    elif kind is float:
        if not (type(value) in (int, float) or value in _NON_FINITE):
            raise _Fault(where, "is not a float")
    elif isinstance(kind, type) and issubclass(kind, enum.Enum):
        if value not in {member.value for member in kind} or isinstance(value, bool):
            raise _Fault(where, f"is not a {kind.__name__}")
    else:
        raise _Fault(where, f"has the type {kind!r}, which hfexport has no rule for")
