"""`ExportConfig`, the options every backend shares, and their dict/JSON form.

Each backend's config (`DynamoConfig`, `OnnxConfig`, ...) is a dataclass deriving from
`ExportConfig` in `hfexport/backends/<format>/config.py`; it adds that backend's own fields.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any, ClassVar

from .extensions import quantizer_class

__all__ = ["ExportFormat", "BUILTIN_FORMATS", "ExportConfig"]


class ExportFormat(str, enum.Enum):
    """The built-in export formats (more can be added with `register_backend`)."""

    DYNAMO = "dynamo"
    ONNX = "onnx"
    EXECUTORCH = "executorch"
    OPENVINO = "openvino"

    def __str__(self) -> str:
        return self.value


#: The names of the built-in export formats, in the order reports list them.
BUILTIN_FORMATS: tuple[str, ...] = tuple(fmt.value for fmt in ExportFormat)

#: Weights above this many bytes go to a file of their own beside the program when a config's
#: external-weights option is left at `None` (ONNX's `.data`, ExecuTorch's `.ptd`): they are then
#: written tensor by tensor, where one serialized message holds the whole model twice more at
#: the save's peak (measured, ONNX on the 134 MB Llama: 3.5x the weights inline, 1.35x external,
#: `bench/export_cost.py`; protobuf refuses a message over 2 GiB at all), and the program file
#: stays small enough to read without its weights.
EXTERNAL_WEIGHTS_BYTES = 64 * 2**20


def check_choice(owner: str, field: str, value: Any, allowed: tuple) -> None:
    """Refuse `value` for option `owner.field` (`ValueError`) unless it is one of `allowed`."""
    if value not in allowed:
        raise ValueError(f"{owner}.{field} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def check_type(owner: str, field: str, value: Any, types: type | tuple[type, ...]) -> None:
    """Refuse `value` for option `owner.field` (`ValueError`) unless it is of `types` (a bool is not an int)."""
    if not isinstance(value, types) or (types is int and isinstance(value, bool)):
        names = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise ValueError(f"{owner}.{field} must be a {names}; got {value!r} ({type(value).__name__})")


# -- Dims in JSON: {"__dim__": "batch", "min": 1, "max": 32} or {"__dim__": "AUTO"} --------------


def _dim_to_json(value: Any) -> Any:
    import torch

    if isinstance(value, dict):
        return {str(k): _dim_to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_dim_to_json(v) for v in value]
    if value is None or isinstance(value, (int, str)):
        return value
    for name in ("AUTO", "STATIC", "DYNAMIC"):
        if value is getattr(torch.export.Dim, name, object()):
            return {"__dim__": name}
    if hasattr(value, "__name__") and hasattr(value, "min") and hasattr(value, "max"):
        return {"__dim__": value.__name__, "min": int(value.min), "max": int(value.max)}
    raise ValueError(f"dynamic_shapes holds {value!r}, which has no JSON form; use torch.export.Dim values")


def _dim_from_json(value: Any) -> Any:
    import torch

    if isinstance(value, list):
        return [_dim_from_json(v) for v in value]
    if isinstance(value, dict):
        if "__dim__" in value:
            name = value["__dim__"]
            if name in ("AUTO", "STATIC", "DYNAMIC") and "min" not in value:
                return getattr(torch.export.Dim, name)
            return torch.export.Dim(name, min=value["min"], max=value["max"])
        return {(int(k) if k.isdigit() else k): _dim_from_json(v) for k, v in value.items()}
    return value


def _quantizer_from_dict(data: Any) -> Any:
    """A quantizer rebuilt from its `to_dict()` (`{"quantizer": "nncf", "scheme": "int4-weights"}`),
    its class looked up by name among the registered quantizers. Calibration data are not part of
    a config file: pass them to the quantizer object."""
    if not isinstance(data, dict):
        return data  # a quantizer object already
    options = dict(data)
    return quantizer_class(options.pop("quantizer", None))(**options)


@dataclasses.dataclass
class ExportConfig:
    """Options shared by every exporter.

    Args:
        dynamic: mark every dimension of every tensor input, cache leaves included, as dynamic
            (`Dim.AUTO`); the artifact then accepts inputs of any size. Size-1 sample dimensions
            (a batch of one) stay dynamic too.
        dynamic_shapes: explicit `dynamic_shapes` keyed by input name, passed to
            `torch.export.export`; wins over `dynamic`. Inputs it leaves out are static; a name
            that is not an input is an error listing the inputs.
        prefer_deferred_runtime_asserts_over_guards: turn data-dependent guards into runtime
            asserts instead of failing the export (passed to `torch.export.export`).
        strict: trace with TorchDynamo (`strict=True`) rather than the default non-strict mode.
        quantizer: a quantizer applied during export (see the quantization docs).
        allow_size_one_specialization: with `dynamic=True`, accept a program that fixes (or
            bounds to 1..2) dimensions whose sample size is 1, and when tracing with size-1
            dimensions kept dynamic fails, retry with torch.export's default, which fixes every
            such dimension; the record lists the axes (`specialized_size_one`). Off by default:
            the export raises instead, naming each axis.
        validate: after exporting, run the artifact in its runtime against eager on the sample
            inputs and on inputs of other sizes (`hfexport.validate`), raise `ValidationError` when
            an output differs; the report is in the record (`details["validation"]`).
    """

    export_format: ClassVar[str] = ""
    #: The dtypes (`--dtype`) this format's runtime cannot run, each with why; `dtype_refusal` reads it.
    refused_dtypes: ClassVar[dict[str, str]] = {}

    dynamic: bool = False
    dynamic_shapes: Any = None
    prefer_deferred_runtime_asserts_over_guards: bool = False
    strict: bool = False
    quantizer: Any = None
    allow_size_one_specialization: bool = False
    validate: bool = False

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for name in ("dynamic", "prefer_deferred_runtime_asserts_over_guards", "strict", "allow_size_one_specialization",
                     "validate"):
            check_type(owner, name, getattr(self, name), bool)
        if self.dynamic_shapes is not None and not isinstance(self.dynamic_shapes, (dict, list, tuple)):
            raise ValueError(
                f"{owner}.dynamic_shapes must be a dict (or tuple) like torch.export's; "
                f"got {type(self.dynamic_shapes).__name__}"
            )
        self._validate()

    def _validate(self) -> None:
        """Check backend-specific fields; subclasses override."""

    @classmethod
    def dtype_refusal(cls, dtype: str) -> str | None:
        """Why this format cannot export a model in `dtype` (`"float16"`), or `None` when it can."""
        return cls.refused_dtypes.get(dtype)

    @classmethod
    def dtypes(cls) -> list[str]:
        """The dtypes this format exports and validates (`float32` always)."""
        return [dtype for dtype in ("float32", "float16", "bfloat16") if dtype not in cls.refused_dtypes]

    def generation_options(self) -> list[str]:
        """The options set on this config that only a generation export can honour (the export
        job refuses them on a single-graph export); subclasses override."""
        return []

    # -- dict / JSON ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-compatible dict, with `export_format` first; `from_dict` reverses it."""
        out: dict[str, Any] = {"export_format": self.export_format}
        for field in dataclasses.fields(self):
            if field.name.startswith("_"):  # set by hfexport for the export in hand (`OnnxConfig._in_folder`)
                continue
            value = getattr(self, field.name)
            if field.name == "dynamic_shapes" and value is not None:
                value = _dim_to_json(value)
            elif field.name == "quantizer" and value is not None:
                if not hasattr(value, "to_dict"):
                    raise ValueError(f"quantizer {value!r} has no to_dict(); it cannot be serialized")
                value = value.to_dict()
            out[field.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExportConfig:
        """Build a config of this class from `data` (as written by `to_dict`)."""
        data = dict(data)
        fmt = data.pop("export_format", cls.export_format)
        if cls.export_format and fmt != cls.export_format:
            raise ValueError(f"{cls.__name__} is for export_format={cls.export_format!r}, got {fmt!r}")
        known = {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{cls.__name__} has no field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if data.get("dynamic_shapes") is not None:
            data["dynamic_shapes"] = _dim_from_json(data["dynamic_shapes"])
        if data.get("quantizer") is not None:
            data["quantizer"] = _quantizer_from_dict(data["quantizer"])
        return cls(**data)

    def to_json(self, **kwargs: Any) -> str:
        """The config as JSON (`to_dict`); `json.dumps` keywords pass through."""
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> ExportConfig:
        """The config a JSON object (as `to_json` writes it) describes."""
        return cls.from_dict(json.loads(text))

    def replace(self, **changes: Any) -> ExportConfig:
        """A copy with the given fields changed (checked like a new config)."""
        return dataclasses.replace(self, **changes)
