"""The extension points that name things: export formats and quantizers, each a `Registry`.

An entry names where its classes live (`"module:Class"`) and they are imported on first use, so
registering a format or a quantizer imports nothing; `hfexport.builtins` registers the built-in
ones when `hfexport` is imported. Patches and FX fixes have their own module (`workarounds`).

```python
from hfexport import register_backend

register_backend("tflite", TFLiteConfig, "my_pkg.exporter:TFLiteExporter", runner="my_pkg.runner:TFLiteRunner")
```
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .errors import RegistryError
from .registry import Registry, load_object

__all__ = ["FormatEntry", "QuantizerEntry", "FORMATS", "QUANTIZERS", "register_backend", "register_quantizer",
           "format_names", "quantizer_class"]


@dataclasses.dataclass(frozen=True)
class FormatEntry:
    """A registered export format: its config class, exporter and runner (classes or
    `"module:Class"`), and the `hfexport[extra]` that installs what it needs."""

    name: str
    config: type | str
    exporter: type | str
    runner: type | str | None = None
    extra: str | None = None

    def config_class(self) -> type:
        """The format's `ExportConfig` subclass (imported on first use)."""
        cls = load_object(self.config)
        if getattr(cls, "export_format", None) != self.name or not hasattr(cls, "from_dict"):
            raise RegistryError(f"format {self.name!r}: {cls!r} is not an ExportConfig whose export_format is "
                                f"{self.name!r}", remedy="register the format with its own config class")
        return cls

    def exporter_class(self) -> type:
        """The format's `HfExporter` subclass (imported on first use)."""
        return load_object(self.exporter)

    def runner_class(self) -> type:
        """The `Runner` subclass that runs the format's artifacts (imported on first use)."""
        if self.runner is None:
            raise RegistryError(f"format {self.name!r} registered no runner; its artifacts cannot be validated",
                                remedy="pass runner= to register_backend")
        return load_object(self.runner)


@dataclasses.dataclass(frozen=True)
class QuantizerEntry:
    """A registered quantizer: the name its `to_dict()` writes and its class (or `"module:Class"`)."""

    name: str
    quantizer: type | str

    def quantizer_class(self) -> type:
        """The `ExportQuantizer` subclass (imported on first use)."""
        return load_object(self.quantizer)


FORMATS: Registry[FormatEntry] = Registry("export format")
QUANTIZERS: Registry[QuantizerEntry] = Registry("quantizer")


def register_backend(name: str, config_class: type | str, exporter: type | str, *, runner: type | str | None = None,
                     extra: str | None = None, override: bool = False) -> FormatEntry:
    """Register a new export format.

    Args:
        name: the `export_format` string (`"tflite"`).
        config_class: an `ExportConfig` subclass whose `export_format` is `name` (or `"module:Class"`).
        exporter: an `HfExporter` subclass, or `"module:Class"` to import it on first use.
        runner: a `Runner` subclass (or `"module:Class"`) that runs the artifact, for validation.
        extra: the `hfexport[extra]` that installs what the format needs, if any.
        override: replace an existing registration.

    Returns:
        The registered entry.
    """
    if isinstance(config_class, type) and getattr(config_class, "export_format", None) != name:
        raise RegistryError(f"register_backend({name!r}): {config_class.__name__}.export_format is "
                            f"{getattr(config_class, 'export_format', None)!r}, not {name!r}",
                            remedy=f"set export_format = {name!r} on the config class")
    return FORMATS.add(name, FormatEntry(name, config_class, exporter, runner, extra), override=override)


def register_quantizer(name: str, quantizer: type | str, *, override: bool = False) -> QuantizerEntry:
    """Register a quantizer under the name its `to_dict()` writes (`{"quantizer": name, ...}`),
    so a config file naming it can be read back (`ExportConfig.from_dict`)."""
    return QUANTIZERS.add(name, QuantizerEntry(name, quantizer), override=override)


def format_names() -> list[str]:
    """The registered export formats, built-in ones first."""
    return list(FORMATS)


def quantizer_class(name: Any) -> type:
    """The quantizer class registered as `name` (a `ValueError` listing the known names otherwise)."""
    if name not in QUANTIZERS:
        raise ValueError(f"unknown quantizer {name!r}; known: {', '.join(QUANTIZERS) or 'none'}")
    return QUANTIZERS.get(name).quantizer_class()
