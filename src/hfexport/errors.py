"""Errors raised by hfexport, one class per step of an export.

Every message names the model (or component), the step, and ends with one concrete remedy.
"""

from __future__ import annotations

__all__ = [
    "ExportError",
    "PrepareError",
    "TaskError",
    "DtypeRefusedError",
    "CaptureError",
    "ConversionError",
    "QuantizationError",
    "SerializationError",
    "OutputFolderError",
    "ExportFolderError",
    "RuntimeLoadError",
    "ValidationError",
    "RegistryError",
    "OptionError",
]


class ExportError(Exception):
    """Base class of every error hfexport raises about an export."""

    step = "export"

    def __init__(self, message: str, *, model: str | None = None, remedy: str | None = None):
        self.model = model
        self.remedy = remedy
        where = f"{model}: " if model else ""
        text = f"[{self.step}] {where}{message}"
        if remedy:
            text += f"\nWhat to do: {remedy}"
        super().__init__(text)


class PrepareError(ExportError, ValueError):
    """The model or inputs cannot be exported as given (attention implementation, bad inputs)."""

    step = "prepare"


class TaskError(ExportError, ValueError):
    """The task asked for contradicts the generation options given with it, or the model
    (`hfexport.generation.tasks.resolve_task`). Raised before any export (the CLI exits 2 for the options)."""

    step = "task"


class OptionError(ValueError):
    """An option's value refused where the options are built (`JobOptions`' groups), before any
    model is loaded or folder claimed; the message says what to pass (the CLI exits 2)."""


class DtypeRefusedError(PrepareError):
    """The format's runtime cannot run the dtype asked (`--dtype`); raised before the export, naming
    the dtypes it can (the CLI exits 2)."""


class CaptureError(ExportError):
    """`torch.export` could not trace the model."""

    step = "capture"


class ConversionError(ExportError):
    """The traced program could not be converted for the target runtime."""

    step = "convert"


class QuantizationError(ExportError):
    """The quantizer could not be applied."""

    step = "quantize"


class SerializationError(ExportError):
    """The artifact could not be written (or would overwrite something)."""

    step = "save"


class OutputFolderError(SerializationError):
    """The output folder cannot take the export: it holds files hfexport did not write, it is a
    folder an export must never replace (the working folder, home, the model's own), or another
    export is writing it. Raised before any work (the CLI exits 2)."""

    step = "output"


class ExportFolderError(SerializationError):
    """A saved export folder cannot be opened: no manifest, a damaged, incomplete or newer one, a
    path outside the folder, or a file missing or not the one the export wrote."""

    step = "open"


class RuntimeLoadError(ExportError):
    """The artifact could not be loaded or run in its runtime."""

    step = "run"


class RefusedFileError(RuntimeLoadError):
    """A file from an export folder holds what hfexport never writes (a `.pt2` member, expression,
    tree spec or class outside the allowlists of `backends/dynamo/archive.py` and
    `capture/pytree.py`): refused before its runtime loads it, as a damaged folder is (the CLI
    exits 2)."""

    step = "open"


class ValidationError(ExportError):
    """The artifact's outputs differ from eager PyTorch beyond the tolerance."""

    step = "validate"


class RegistryError(ExportError, ValueError):
    """A registry entry is malformed: unknown backend, unresolvable patch target, duplicate name."""

    step = "register"


_BOILERPLATE = ("Check '", "Exception from src/", "FrontEnd API failed", "Model wasn't fully converted",
                "Summary:", "[96m", "This is step")


def summarize(error: BaseException, limit: int = 400) -> str:
    """One line saying what went wrong: the deepest cause's type and the informative part of its
    message (upstream wrappers and C++ check locations dropped)."""
    root = error
    while root.__cause__ is not None:
        root = root.__cause__
    lines = [line.strip(" -") for line in str(root).splitlines()]
    kept = [line for line in lines if line and not line.startswith(_BOILERPLATE) and "This is step" not in line]
    text = " | ".join(kept) or type(root).__name__
    return f"{type(root).__name__}: {text}"[:limit]


def first_line(error: BaseException) -> str:
    """`Type: message` of `error`, its first non-empty line (300 characters at most)."""
    text = f"{type(error).__name__}: {error}".strip()
    return next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)[:300]
