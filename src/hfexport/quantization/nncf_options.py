"""NNCF's own parameters on `NNCFQuantizer`: checked against NNCF's signatures, kept in JSON.

`NNCFQuantizer("int4-weights", mode=nncf.CompressWeightsMode.INT4_ASYM, ratio=0.8, group_size=64)`
passes `mode`, `ratio` and `group_size` to `nncf.compress_weights` as they are. The names a
scheme accepts are those of the NNCF function it calls (`nncf.compress_weights` for the weight
schemes, `nncf.quantize` for `int8-static`), read from its signature, so a new NNCF parameter
works without a change here and a typo fails at once, naming the valid ones.

In a config file (`to_dict`), an enum is kept by its name (`"INT4_ASYM"`) and a dataclass
(`IgnoredScope`, `AdvancedCompressionParameters`) as a dict of its fields; both are rebuilt from
the parameter's annotation when the config is read. `dataset` is data, as `calibration` is, and
is never written.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import typing
from typing import Any

__all__ = ["nncf_function", "check_options", "options_to_json", "options_from_json", "DATA_OPTIONS"]

#: the arguments that are data, not settings: left out of `to_dict`
DATA_OPTIONS = ("dataset",)
#: arguments hfexport fills itself
_OWN = {"model", "calibration_dataset"}


def nncf_function(scheme: str):
    """The NNCF function a scheme calls: `nncf.quantize` for `int8-static`, else `nncf.compress_weights`."""
    import nncf

    return nncf.quantize if scheme == "int8-static" else nncf.compress_weights


def _parameters(scheme: str) -> dict[str, inspect.Parameter]:
    function = nncf_function(scheme)
    return {name: p for name, p in inspect.signature(function).parameters.items() if name not in _OWN}


def _annotation(scheme: str, name: str) -> Any:
    """The annotation of `name` with `None` stripped off (`X | None` -> `X`)."""
    annotation = _parameters(scheme)[name].annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if len(args) == 1 else annotation


def check_options(owner: str, scheme: str, options: dict[str, Any]) -> dict[str, Any]:
    """`options` checked against the NNCF function of `scheme`: unknown names raise naming the
    valid ones; enum names (`"INT4_ASYM"`) and dicts for dataclass parameters become the objects.
    Without options nothing is imported (a quantizer stays a plain object until it runs)."""
    if not options:
        return {}
    valid = _parameters(scheme)
    unknown = sorted(set(options) - set(valid))
    function = nncf_function(scheme).__name__
    if unknown:
        raise ValueError(f"{owner}({scheme!r}) got unknown NNCF parameters {unknown} for nncf.{function}; "
                         f"valid: {', '.join(valid)}")
    return {name: options_from_json(scheme, name, value) for name, value in options.items()}


def options_from_json(scheme: str, name: str, value: Any) -> Any:
    """`value` of NNCF parameter `name` as NNCF takes it (an enum from its name, a dataclass from a dict)."""
    kind = _annotation(scheme, name)
    if _is_enum_name(kind, value):
        try:
            return kind[value]
        except KeyError:
            raise ValueError(f"NNCF parameter {name}={value!r} is not a {kind.__name__}; "
                             f"choose one of {', '.join(kind.__members__)}") from None
    if isinstance(kind, type) and dataclasses.is_dataclass(kind) and isinstance(value, dict):
        return _dataclass_from_json(kind, value)
    return value


def _is_enum_name(kind: Any, value: Any) -> bool:
    """Whether `value` is the name of a member of the enum `kind` rather than a member (NNCF's
    enums are `str` enums, so a member is a `str` too)."""
    return (isinstance(kind, type) and issubclass(kind, enum.Enum) and isinstance(value, str)
            and not isinstance(value, enum.Enum))


def _dataclass_from_json(kind: type, data: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(kind)
    fields = {}
    for name, value in data.items():
        hint = hints.get(name)
        args = [a for a in typing.get_args(hint) if a is not type(None)] if hint is not None else []
        hint = args[0] if len(args) == 1 else hint
        if _is_enum_name(hint, value):
            value = hint[value]
        elif isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = _dataclass_from_json(hint, value)
        fields[name] = value
    return kind(**fields)


def options_to_json(options: dict[str, Any]) -> dict[str, Any]:
    """`options` as JSON holds them: enums by name, dataclasses as dicts; data (`dataset`) left out."""
    return {name: _to_json(value) for name, value in options.items() if name not in DATA_OPTIONS}


def _to_json(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_json(v) for k, v in value.items()}
    return value
