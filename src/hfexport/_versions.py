"""The tested set of upstream versions, the extras that install them, and the checks built on both.

# NOTE: this module is the one place that records which versions hfexport was validated with.
# `constraints.txt` pins the same numbers (what CI installs) and `pyproject.toml` declares ranges
# around them, so that installing hfexport keeps the user's torch and transformers; `hfexport env`
# prints installed and tested. We warn on drift rather than refuse: a patch release inside the range
# usually still works, and a warning naming what differs says where to look first.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import threading
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

logger = logging.getLogger("hfexport")

#: Distribution name -> the version the test suite was validated with.
TESTED_VERSIONS: dict[str, str] = {
    "torch": "2.13.0",
    "transformers": "5.24.0",
    "onnx": "1.23.2",
    "onnxscript": "0.7.2",
    "onnxruntime": "1.32.0",
    "onnxruntime-genai": "0.18.0",
    "executorch": "1.4.1",
    "openvino": "2026.4.1",
    "openvino-genai": "2026.4.1.0",
    "openvino-tokenizers": "2026.4.1.0",
    "nncf": "3.4.0",
    "torchao": "0.18.0",
    "ray": "2.58.0",
    "gguf": "0.19.0",
    "accelerate": "1.15.0",
    "pillow": "13.0.0",
    "soundfile": "0.14.0",
    "scipy": "1.17.1",
}

#: Extra name -> distributions it installs (mirrors `[project.optional-dependencies]`).
EXTRAS: dict[str, tuple[str, ...]] = {
    "dynamo": (),
    "onnx": ("onnx", "onnxscript", "onnxruntime"),
    "executorch": ("executorch",),
    "openvino": ("openvino",),
    # runs an ONNX generation export as onnxruntime-genai's Generator does (its genai_config.json)
    "genai": ("onnx", "onnxscript", "onnxruntime", "onnxruntime-genai"),
    # runs and tokenizes an OpenVINO generation export as OpenVINO GenAI's LLMPipeline does
    "openvino-genai": ("openvino", "openvino-genai", "openvino-tokenizers"),
    "quantization": ("nncf", "torchao"),
    "ray": ("ray",),
    # reads GGUF checkpoints (`hfexport export model.gguf`): transformers' GGUF support needs both
    "gguf": ("gguf", "accelerate"),
    # reads image files for an image-text export (`hfexport generate --image`) with its saved processor
    "vision": ("pillow",),
    # reads audio files for a speech export (`hfexport generate --audio`), resampled for its saved feature extractor
    "audio": ("soundfile", "scipy"),
}

#: Distribution name -> top-level import name, where they differ.
_IMPORT_NAMES = {"onnxruntime": "onnxruntime", "onnxruntime-genai": "onnxruntime_genai", "openvino-genai": "openvino_genai",
                 "openvino-tokenizers": "openvino_tokenizers",
                 "pillow": "PIL"}


@dataclass(frozen=True)
class PackageStatus:
    """What is installed of one distribution, against the tested version."""

    name: str
    tested: str
    installed: str | None

    @property
    def is_installed(self) -> bool:
        """Whether the distribution is installed."""
        return self.installed is not None

    @property
    def has_drift(self) -> bool:
        """Whether the installed version differs from the tested one (release numbers compared)."""
        if self.installed is None:
            return False
        try:
            return Version(self.installed).base_version != Version(self.tested).base_version
        except InvalidVersion:
            return self.installed != self.tested


def installed_version(name: str) -> str | None:
    """Return the installed version of distribution `name`, or `None`; imports nothing."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_status(name: str) -> PackageStatus:
    """The `PackageStatus` of distribution `name` (one of `TESTED_VERSIONS`)."""
    return PackageStatus(name, TESTED_VERSIONS[name], installed_version(name))


def is_importable(name: str) -> bool:
    """Whether the top-level module of distribution `name` can be found, without importing it."""
    return importlib.util.find_spec(_IMPORT_NAMES.get(name, name)) is not None


def pip_line(extra: str) -> str:
    """The `pip install "hfexport[extra]"` line that installs `extra`."""
    return f'pip install "hfexport[{extra}]"'


def require_extra(extra: str, *, purpose: str) -> None:
    """Raise `ImportError` naming the pip line when a package of `extra` is missing.

    Args:
        extra: the extra that installs what is needed (`onnx`, `openvino`, ...).
        purpose: what needs it, for the message (`"OnnxExporter"`).
    """
    missing = [name for name in EXTRAS[extra] if not is_importable(name)]
    if missing:
        pins = " ".join(f'"{name}=={TESTED_VERSIONS[name]}"' for name in missing)
        raise ImportError(
            f"{purpose} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed. "
            f"Install it with: {pip_line(extra)}   (or: pip install {pins})"
        )


#: Distributions already named in a drift warning in this process (exports may run on threads).
_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_on_drift(extra: str, *, owner: str) -> list[PackageStatus]:
    """Log one warning naming each package of `extra` (plus torch and transformers) whose installed
    version differs from the tested one, with both versions; a package is named once per process.

    Args:
        extra: the extra `owner` needs (`"dynamo"` for the core alone).
        owner: who checks, for the message (`"OnnxExporter"`).

    Returns:
        Every drifted package of `extra`, named before or not.
    """
    names = ("torch", "transformers", *EXTRAS[extra])
    drifted = [status for status in map(package_status, dict.fromkeys(names)) if status.has_drift]
    with _warned_lock:
        unnamed = [status for status in drifted if status.name not in _warned]
        _warned.update(status.name for status in unnamed)
    if unnamed:
        listing = ", ".join(f"{s.name} {s.installed} (tested {s.tested})" for s in unnamed)
        pins = " ".join(f'"{s.name}=={s.tested}"' for s in unnamed)
        logger.warning(
            "%s was validated with another version of: %s. Exports usually still work; if one fails, "
            "try the tested versions first: pip install %s",
            owner,
            listing,
            pins,
        )
    return drifted
