"""One registry type for every extension point: backends, patches and FX fixes.

A `Registry` is used through decorators, checks keys when an entry is added (an unknown backend
name fails at import, not at export), refuses duplicates unless `override=True`, and lists itself
(`hfexport patches`).

# NOTE: patches and fixes are records, not bare functions: each says why it exists, which upstream
# bug it works around, the versions it was seen with, and when to remove it. A patch whose target
# does not resolve while its package is installed fails loudly at registration, so an upstream
# rename cannot silently turn a workaround off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import logging
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from .errors import RegistryError

__all__ = [
    "Registry",
    "BackendEntry",
    "Patch",
    "FxFix",
    "BACKENDS",
    "PATCHES",
    "FX_NODE_FIXES",
    "FX_PROGRAM_FIXES",
    "register_backend",
    "register_patch",
    "register_fx_node_fix",
    "register_fx_program_fix",
    "applied_patches",
    "ordered_fixes",
    "backend_names",
]

logger = logging.getLogger("hfexport")

E = TypeVar("E")


class Registry(Generic[E]):
    """A named collection of entries keyed by string.

    Args:
        kind: what the entries are, for messages (`"backend"`, `"patch"`).
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, E] = {}

    def add(self, key: str, entry: E, *, override: bool = False) -> E:
        if not isinstance(key, str) or not key:
            raise RegistryError(f"a {self.kind} needs a non-empty string name, got {key!r}")
        if key in self._entries and not override:
            raise RegistryError(
                f"a {self.kind} named {key!r} is already registered",
                remedy="pick another name, or pass override=True to replace it",
            )
        self._entries[key] = entry
        return entry

    def remove(self, key: str) -> E:
        return self._entries.pop(key)

    def get(self, key: str) -> E:
        try:
            return self._entries[key]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "none"
            raise RegistryError(f"no {self.kind} named {key!r}; registered: {known}") from None

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[str, E]]:
        return list(self._entries.items())

    def values(self) -> list[E]:
        return list(self._entries.values())


# -- Backends ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BackendEntry:
    """A registered export format: its config class, its exporter and the extra that installs it."""

    name: str
    config_class: type
    exporter: type | str  # a class, or "module:Class" imported on first use
    runner: type | str | None = None  # runs the artifact for validation; same forms as `exporter`
    extra: str | None = None

    def exporter_class(self) -> type:
        return _load(self.exporter)

    def runner_class(self) -> type:
        if self.runner is None:
            raise RegistryError(f"backend {self.name!r} registered no runner; its artifacts cannot be validated")
        return _load(self.runner)


def _load(target: type | str) -> type:
    if isinstance(target, str):
        module_name, _, class_name = target.partition(":")
        return getattr(importlib.import_module(module_name), class_name)
    return target


BACKENDS: Registry[BackendEntry] = Registry("backend")


def _ensure_builtin_backends() -> None:
    from . import backends  # noqa: F401  (registers the four built-in formats)


def backend_names() -> list[str]:
    _ensure_builtin_backends()
    return list(BACKENDS)


def register_backend(
    name: str,
    config_class: type,
    exporter: type | str,
    *,
    runner: type | str | None = None,
    extra: str | None = None,
    override: bool = False,
) -> BackendEntry:
    """Register a new export format.

    Args:
        name: the `export_format` string (`"tflite"`).
        config_class: an `ExportConfig` subclass whose `export_format` is `name`.
        exporter: an `HfExporter` subclass, or `"module:Class"` to import it on first use.
        runner: a `Runner` subclass (or `"module:Class"`) that runs the artifact, for validation.
        extra: the `hfexport[extra]` that installs what the backend needs, if any.
        override: replace an existing registration.
    """
    from .config import ExportConfig

    if not (isinstance(config_class, type) and issubclass(config_class, ExportConfig)):
        raise RegistryError(f"register_backend({name!r}): config_class must subclass ExportConfig")
    if config_class.export_format != name:
        raise RegistryError(
            f"register_backend({name!r}): {config_class.__name__}.export_format is "
            f"{config_class.export_format!r}, not {name!r}"
        )
    return BACKENDS.add(name, BackendEntry(name, config_class, exporter, runner, extra), override=override)


def _check_backends(backend: str | tuple[str, ...] | list[str], who: str) -> tuple[str, ...]:
    names = (backend,) if isinstance(backend, str) else tuple(backend)
    known = backend_names()
    for name in names:
        if str(name) not in known:
            raise RegistryError(f"{who}: unknown backend {name!r}; registered backends: {', '.join(known)}")
    return tuple(str(n) for n in names)


# -- Patches -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Patch:
    """A reversible swap of one or more attributes for the duration of an export."""

    name: str
    backends: tuple[str, ...]
    targets: tuple[str, ...]
    factory: Callable[[Any], Any]
    reason: str
    upstream: str | None = None
    seen_with: dict[str, str] = dataclasses.field(default_factory=dict)
    remove_when: str | None = None
    is_available: bool = True  # False when the package owning a target is not installed

    def describe(self) -> str:
        bug = f" ({self.upstream})" if self.upstream else ""
        return f"{self.name}: {', '.join(self.targets)} — {self.reason}{bug}"


def _resolve(path: str) -> tuple[Any, str, Any]:
    """Resolve `a.b.C.attr` to `(owner, "attr", current value)`, importing the longest module prefix."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        try:
            for part in parts[split:-1]:
                owner = getattr(owner, part)
            return owner, parts[-1], getattr(owner, parts[-1])
        except AttributeError:
            break
    raise RegistryError(
        f"patch target {path!r} does not resolve",
        remedy="the upstream package renamed or removed it: update or delete the patch",
    )


def _package_installed(path: str) -> bool:
    return importlib.util.find_spec(path.split(".")[0]) is not None


PATCHES: Registry[Patch] = Registry("patch")


def register_patch(
    backend: str | tuple[str, ...] | list[str],
    *dotted_paths: str,
    reason: str,
    upstream: str | None = None,
    seen_with: dict[str, str] | None = None,
    remove_when: str | None = None,
    override: bool = False,
) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Register a patch: `factory(original)` replaces each target for the export's duration.

    Args:
        backend: the backend name(s) the patch applies to.
        dotted_paths: the attributes to swap (`"torch.split"`, `"pkg.mod.Class.method"`).
        reason: why the patch exists (one sentence).
        upstream: the upstream bug (`"owner/repo#N"`).
        seen_with: the versions it was needed with (`{"torch": "2.13.0"}`).
        remove_when: the condition under which it can go (`"torch>=2.14"`).
        override: replace a patch of the same name.
    """
    backends = _check_backends(backend, "register_patch")
    if not dotted_paths:
        raise RegistryError("register_patch needs at least one dotted path to patch")

    def decorate(factory: Callable[[Any], Any]) -> Callable[[Any], Any]:
        available = all(_package_installed(p) for p in dotted_paths)
        if available:
            for path in dotted_paths:
                _resolve(path)  # fails loudly if upstream renamed it
        patch = Patch(
            factory.__name__, backends, tuple(dotted_paths), factory, reason, upstream,
            dict(seen_with or {}), remove_when, available,
        )
        PATCHES.add(patch.name, patch, override=override)
        return factory

    return decorate


@contextlib.contextmanager
def applied_patches(backend: str, *, extra: tuple[Patch, ...] = ()) -> Iterator[list[Patch]]:
    """Swap in every available patch registered for `backend` (sorted by name); always restore."""
    patches = sorted(
        (p for p in PATCHES.values() if backend in p.backends and p.is_available), key=lambda p: p.name
    )
    patches.extend(extra)
    undo: list[tuple[Any, str, Any, bool]] = []
    try:
        for patch in patches:
            for path in patch.targets:
                owner, attr, original = _resolve(path)
                had_own = attr in vars(owner) if hasattr(owner, "__dict__") else True
                setattr(owner, attr, patch.factory(original))
                undo.append((owner, attr, original, had_own))
            logger.debug("patch %s applied", patch.name)
        yield patches
    finally:
        for owner, attr, original, had_own in reversed(undo):
            if had_own:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)


# -- FX fixes ----------------------------------------------------------------------------------


@dataclasses.dataclass
class FxFix:
    """A rewrite of the traced graph: per node (`kind="node"`) or per program (`kind="program"`).

    The function returns whether it changed the graph; a node fix that does not fire for a
    reason worth knowing logs it at debug level.
    """

    name: str
    kind: str
    backends: tuple[str, ...]
    fn: Callable[..., bool]
    reason: str
    upstream: str | None = None
    seen_with: dict[str, str] = dataclasses.field(default_factory=dict)
    remove_when: str | None = None

    def describe(self) -> str:
        bug = f" ({self.upstream})" if self.upstream else ""
        return f"{self.name} [{self.kind}]: {self.reason}{bug}"


FX_NODE_FIXES: Registry[FxFix] = Registry("FX node fix")
FX_PROGRAM_FIXES: Registry[FxFix] = Registry("FX program fix")


def _fix_decorator(kind: str, registry: Registry[FxFix]):
    def register(
        backend: str | tuple[str, ...] | list[str],
        *,
        reason: str,
        upstream: str | None = None,
        seen_with: dict[str, str] | None = None,
        remove_when: str | None = None,
        override: bool = False,
    ) -> Callable[[Callable[..., bool]], Callable[..., bool]]:
        backends = _check_backends(backend, f"register_fx_{kind}_fix")

        def decorate(fn: Callable[..., bool]) -> Callable[..., bool]:
            fix = FxFix(fn.__name__, kind, backends, fn, reason, upstream, dict(seen_with or {}), remove_when)
            registry.add(fix.name, fix, override=override)
            return fn

        return decorate

    return register


register_fx_node_fix = _fix_decorator("node", FX_NODE_FIXES)
register_fx_node_fix.__doc__ = """Register `fn(node) -> bool`, run on every node of the traced graph for `backend`."""
register_fx_program_fix = _fix_decorator("program", FX_PROGRAM_FIXES)
register_fx_program_fix.__doc__ = """Register `fn(exported_program) -> bool`, run once on the traced program for `backend`."""


def ordered_fixes(registry: Registry[FxFix], backend: str, order: tuple[str, ...]) -> list[FxFix]:
    """The fixes of `registry` for `backend`: first those named in `order`, in that order, then the
    rest (extensions registered by users) sorted by name — never in import order."""
    mine = {f.name: f for f in registry.values() if backend in f.backends}
    ranked = [mine.pop(name) for name in order if name in mine]
    return ranked + [mine[name] for name in sorted(mine)]


def load_builtin_workarounds() -> None:
    """Import every module that registers built-in patches and fixes (for listing them)."""
    _ensure_builtin_backends()
    for entry in BACKENDS.values():
        module = f"hfexport.backends.{entry.name}.patches"
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)
    importlib.import_module("hfexport.models")
    if importlib.util.find_spec("executorch") is not None:
        importlib.import_module("hfexport.quantization.patches")
