"""`AutoExportConfig` and `AutoHfExporter`: pick the config / exporter class from `export_format`."""

from __future__ import annotations

from typing import Any

from .config import ExportConfig
from .extensions import FORMATS, FormatEntry, format_names, register_backend

__all__ = ["AutoExportConfig", "AutoHfExporter", "register_backend"]


def _entry(fmt: Any) -> FormatEntry:
    names = format_names()
    fmt = str(fmt.value if hasattr(fmt, "value") else fmt) if fmt is not None else None
    if fmt not in names:
        raise ValueError(f"unknown export_format {fmt!r}; registered formats: {', '.join(names)}")
    return FORMATS.get(fmt)


class AutoExportConfig:
    """Builds the config class registered for `export_format`.

    ```python
    config = AutoExportConfig.from_dict({"export_format": "onnx", "dynamic": True})  # OnnxConfig
    ```
    """

    def __init__(self) -> None:
        raise TypeError("AutoExportConfig is not instantiated; use AutoExportConfig.from_dict(...)")

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ExportConfig:
        """Return the config for `data["export_format"]`, built from the rest of `data`."""
        if "export_format" not in data:
            raise ValueError(f"the dict needs an 'export_format' key, one of: {', '.join(format_names())}")
        return _entry(data["export_format"]).config_class().from_dict(data)

    @staticmethod
    def from_json(text: str) -> ExportConfig:
        """Return the config a JSON object (as `ExportConfig.to_json` writes it) describes."""
        import json

        return AutoExportConfig.from_dict(json.loads(text))


class AutoHfExporter:
    """Builds the exporter registered for a config's format.

    ```python
    exporter = AutoHfExporter.from_config(config)        # a config object, or
    exporter = AutoHfExporter.from_config({"export_format": "dynamo"})  # its dict
    ```
    """

    def __init__(self) -> None:
        raise TypeError("AutoHfExporter is not instantiated; use AutoHfExporter.from_config(...)")

    @staticmethod
    def from_config(config: ExportConfig | dict[str, Any]):
        """The exporter for `config`'s format (a config object or its dict)."""
        if isinstance(config, dict):
            config = AutoExportConfig.from_dict(config)
        if not isinstance(config, ExportConfig):
            raise TypeError(f"from_config expects an ExportConfig or a dict, got {type(config).__name__}")
        return _entry(config.export_format).exporter_class()()

    @staticmethod
    def from_format(export_format: str):
        """The exporter registered for `export_format` (`"onnx"`, ...), e.g. to `load` a saved artifact."""
        return _entry(export_format).exporter_class()()
