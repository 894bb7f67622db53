"""Workarounds for upstream export bugs: reversible patches and FX fixes, each a record with a reason.

```python
@register_patch("executorch", "torch.split",
                reason="XNNPACK has no kernel for aten.split_copy with dynamic sizes",
                upstream="pytorch/executorch#1234", seen_with={"executorch": "1.4.1"},
                remove_when="executorch>1.4.1")
def patch_torch_split(original): ...
```

# NOTE: a workaround is a record, not a bare function: it says why it exists, which upstream bug
# it works around, the versions it was seen with, and `remove_when`, a requirement on an installed
# package (`"torch>=2.14"`) that a program checks (`due_for_removal`): once the installed versions
# meet it, the workaround is to be tried without (its "still needed" test says whether it is). A
# patch whose target does not resolve while its package is installed fails loudly at registration,
# so an upstream rename cannot silently turn a workaround off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from ..errors import RegistryError
from ..extensions import format_names
from ..registry import Registry

__all__ = ["Patch", "FxFix", "PatchSession", "PATCHES", "FX_NODE_FIXES", "FX_PROGRAM_FIXES", "register_patch",
           "register_fx_node_fix", "register_fx_program_fix", "applied_patches", "ordered_fixes",
           "all_workarounds", "due_for_removal"]

logger = logging.getLogger("hfexport")


def _removal_requirement(remove_when: str | None, who: str) -> Requirement | None:
    """`remove_when` parsed: a requirement on one package with a version specifier."""
    if remove_when is None:
        return None
    try:
        requirement = Requirement(remove_when)
    except InvalidRequirement as error:
        raise RegistryError(f"{who}: remove_when={remove_when!r} is not a requirement a program can check ({error})",
                            remedy='write it as "<package><specifier>", e.g. "torch>=2.14"') from None
    if not requirement.specifier:
        raise RegistryError(f"{who}: remove_when={remove_when!r} names no version",
                            remedy='add a version specifier, e.g. "torch>=2.14"')
    return requirement


@dataclasses.dataclass
class _Workaround:
    """What every workaround records (see the module note)."""

    name: str
    formats: tuple[str, ...]
    reason: str
    upstream: str | None
    seen_with: dict[str, str]
    remove_when: str | None

    @property
    def is_due_for_removal(self) -> bool:
        """Whether the installed version of the package `remove_when` names meets it."""
        requirement = _removal_requirement(self.remove_when, self.name)
        if requirement is None:
            return False
        from .._versions import installed_version

        installed = installed_version(requirement.name)
        return installed is not None and requirement.specifier.contains(installed, prereleases=True)


@dataclasses.dataclass
class Patch(_Workaround):
    """A reversible swap of one or more attributes for the duration of an export."""

    targets: tuple[str, ...] = ()
    factory: Callable[[Any], Any] = lambda original: original
    is_available: bool = True  # False when the package owning a target is not installed
    #: "export": swapped in for the whole export; "quantize": only while an FX-graph quantizer runs
    stage: str = "export"

    def describe(self) -> str:
        """One line: name, targets, reason and upstream bug."""
        bug = f" ({self.upstream})" if self.upstream else ""
        return f"{self.name}: {', '.join(self.targets)} — {self.reason}{bug}"


@dataclasses.dataclass
class FxFix(_Workaround):
    """A rewrite of the traced graph: per node (`kind="node"`) or per program (`kind="program"`).

    The function returns whether it changed the graph; a node fix that does not fire for a
    reason worth knowing logs it at debug level.
    """

    kind: str = "node"
    fn: Callable[..., bool] = lambda _: False

    def describe(self) -> str:
        """One line: name, kind, reason and upstream bug."""
        bug = f" ({self.upstream})" if self.upstream else ""
        return f"{self.name} [{self.kind}]: {self.reason}{bug}"


def _check_formats(formats: str | tuple[str, ...] | list[str], who: str) -> tuple[str, ...]:
    names = (formats,) if isinstance(formats, str) else tuple(formats)
    known = format_names()
    for name in names:
        if str(name) not in known:
            raise RegistryError(f"{who}: unknown export format {name!r}; registered: {', '.join(known)}",
                                remedy="register the format first (register_backend), or fix the name")
    return tuple(str(n) for n in names)


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
_STAGES = ("export", "quantize")
FX_NODE_FIXES: Registry[FxFix] = Registry("FX node fix")
FX_PROGRAM_FIXES: Registry[FxFix] = Registry("FX program fix")


def register_patch(
    formats: str | tuple[str, ...] | list[str],
    *dotted_paths: str,
    reason: str,
    upstream: str | None = None,
    seen_with: dict[str, str] | None = None,
    remove_when: str | None = None,
    stage: str = "export",
    override: bool = False,
) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Register a patch: `factory(original)` replaces each target for the export's duration.

    Args:
        formats: the export format(s) the patch applies to (called `backend` before 0.2).
        dotted_paths: the attributes to swap (`"torch.split"`, `"pkg.mod.Class.method"`).
        reason: why the patch exists (one sentence).
        upstream: the upstream bug (`"owner/repo#N"`), or where the behaviour lives upstream.
        seen_with: the versions it was needed with (`{"torch": "2.13.0"}`).
        remove_when: the requirement under which to try without it (`"torch>=2.14"`).
        stage: `"export"` (the whole export) or `"quantize"` (only while an FX-graph quantizer
            runs: its targets are resolved when that stage applies them, so registering it imports
            nothing of the quantizer's packages).
        override: replace a patch of the same name.

    Returns:
        A decorator that registers the factory and returns it unchanged.
    """
    names = _check_formats(formats, "register_patch")
    if stage not in _STAGES:
        raise RegistryError(f"register_patch: unknown stage {stage!r}", remedy=f"use one of {', '.join(_STAGES)}")
    if not dotted_paths:
        raise RegistryError("register_patch needs at least one dotted path to patch",
                            remedy='name the attribute to swap, e.g. register_patch("onnx", "torch.split", ...)')

    def decorate(factory: Callable[[Any], Any]) -> Callable[[Any], Any]:
        _removal_requirement(remove_when, factory.__name__)
        available = all(_package_installed(p) for p in dotted_paths)
        if available and stage == "export":
            for path in dotted_paths:
                _resolve(path)  # fails loudly if upstream renamed it
        patch = Patch(factory.__name__, names, reason, upstream, dict(seen_with or {}), remove_when,
                      tuple(dotted_paths), factory, available, stage)
        PATCHES.add(patch.name, patch, override=override)
        return factory

    return decorate


class PatchSession:
    """The patches swapped in for one export, and which of them the export reached (a patched
    function called at least once)."""

    def __init__(self, patches: list[Patch]):
        self.patches = patches
        self._reached: set[str] = set()

    def reached(self) -> list[str]:
        """The names of the patches whose targets the export executed, in application order."""
        return [p.name for p in self.patches if p.name in self._reached]

    def names(self) -> list[str]:
        """Every patch swapped in."""
        return [p.name for p in self.patches]

    def __iter__(self) -> Iterator[Patch]:
        return iter(self.patches)

    def _tracked(self, patch: Patch, replacement: Any, original: Any) -> Any:
        """`replacement` with its functions marking `patch` reached when called (classes and
        other objects are swapped in as they are)."""
        def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(fn)
            def called(*args: Any, **kwargs: Any) -> Any:
                # not while TorchDynamo traces (ExecuTorch's XNNPACK partitioner traces its SDPA
                # pattern through the patched function): a set mutated there is a traced side effect;
                # once reached, nothing is added (a hot patched function is called a million times)
                if patch.name not in self._reached and not _dynamo_tracing():
                    self._reached.add(patch.name)
                return fn(*args, **kwargs)

            return called

        if inspect.isfunction(replacement):
            return mark(replacement)
        if isinstance(replacement, dict) and isinstance(original, dict):  # a mapping with some entries replaced
            return {key: mark(value) if inspect.isfunction(value) and original.get(key) is not value else value
                    for key, value in replacement.items()}
        return replacement


def _dynamo_tracing() -> bool:
    import torch

    return bool(torch.compiler.is_dynamo_compiling())


@contextlib.contextmanager
def applied_patches(export_format: str, *, stage: str = "export",
                    extra: tuple[Patch, ...] = ()) -> Iterator[PatchSession]:
    """Swap in every available patch registered for `export_format` and `stage` (sorted by name)
    and `extra`; always restore. Yields the `PatchSession`, which tells which patches were reached."""
    patches = sorted((p for p in PATCHES.values()
                      if export_format in p.formats and p.stage == stage and p.is_available),
                     key=lambda p: p.name)
    session = PatchSession([*patches, *extra])
    undo: list[tuple[Any, str, Any, bool]] = []
    try:
        for patch in session.patches:
            for path in patch.targets:
                owner, attr, original = _resolve(path)
                had_own = attr in vars(owner) if hasattr(owner, "__dict__") else True
                setattr(owner, attr, session._tracked(patch, patch.factory(original), original))
                undo.append((owner, attr, original, had_own))
            logger.debug("patch %s applied", patch.name)
        yield session
    finally:
        for owner, attr, original, had_own in reversed(undo):
            if had_own:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)


def _fix_decorator(kind: str, registry: Registry[FxFix]) -> Callable[..., Any]:
    def register(
        formats: str | tuple[str, ...] | list[str],
        *,
        reason: str,
        upstream: str | None = None,
        seen_with: dict[str, str] | None = None,
        remove_when: str | None = None,
        override: bool = False,
    ) -> Callable[[Callable[..., bool]], Callable[..., bool]]:
        names = _check_formats(formats, f"register_fx_{kind}_fix")

        def decorate(fn: Callable[..., bool]) -> Callable[..., bool]:
            _removal_requirement(remove_when, fn.__name__)
            fix = FxFix(fn.__name__, names, reason, upstream, dict(seen_with or {}), remove_when, kind, fn)
            registry.add(fix.name, fix, override=override)
            return fn

        return decorate

    return register


register_fx_node_fix = _fix_decorator("node", FX_NODE_FIXES)
register_fx_node_fix.__doc__ = """Register `fn(node) -> bool`, run on every node of the traced graph for `formats`
(same keywords as `register_patch`)."""
register_fx_program_fix = _fix_decorator("program", FX_PROGRAM_FIXES)
register_fx_program_fix.__doc__ = """Register `fn(exported_program) -> bool`, run once on the traced program for
`formats` (same keywords as `register_patch`)."""


def ordered_fixes(registry: Registry[FxFix], export_format: str, order: tuple[str, ...]) -> list[FxFix]:
    """The fixes of `registry` for `export_format`: first those named in `order`, in that order,
    then the rest (extensions registered by users) sorted by name — never in import order."""
    mine = {f.name: f for f in registry.values() if export_format in f.formats}
    ranked = [mine.pop(name) for name in order if name in mine]
    return ranked + [mine[name] for name in sorted(mine)]


def all_workarounds() -> list[_Workaround]:
    """Every registered patch and FX fix (load the built-in ones first: `builtins.load_workarounds`)."""
    return [*PATCHES.values(), *FX_PROGRAM_FIXES.values(), *FX_NODE_FIXES.values()]


def due_for_removal() -> list[_Workaround]:
    """The workarounds whose `remove_when` the installed versions already meet."""
    return [w for w in all_workarounds() if w.is_due_for_removal]
