"""`Registry`: the one container type of every extension point (formats, quantizers, patches, FX fixes).

A registry is filled through its owners' decorators and functions (`register_backend`,
`register_patch`, ...), refuses a duplicate unless asked to override, says what it holds when a
name is missing, and lists itself (`hfexport patches`). It imports nothing: the built-in entries
are registered by `hfexport.builtins`, and an entry may name its class as `"module:Class"`, imported
only when it is used (`load_object`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from .errors import RegistryError

__all__ = ["Registry", "load_object", "lazy_names"]

E = TypeVar("E")


class Registry(Generic[E]):
    """A named collection of entries keyed by string.

    Args:
        kind: what the entries are, for messages (`"export format"`, `"patch"`).
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, E] = {}

    def add(self, key: str, entry: E, *, override: bool = False) -> E:
        """Register `entry` under `key`; a taken key is an error unless `override`."""
        if not isinstance(key, str) or not key:
            raise RegistryError(f"a {self.kind} needs a non-empty string name, got {key!r}",
                                remedy="pass the name as a string")
        if key in self._entries and not override:
            raise RegistryError(
                f"a {self.kind} named {key!r} is already registered",
                remedy="pick another name, or pass override=True to replace it",
            )
        self._entries[key] = entry
        return entry

    def remove(self, key: str) -> E:
        """Take the entry `key` out and return it."""
        return self._entries.pop(key)

    def get(self, key: str) -> E:
        """The entry `key`; a `RegistryError` listing what is registered otherwise."""
        try:
            return self._entries[key]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "none"
            raise RegistryError(f"no {self.kind} named {key!r}; registered: {known}",
                                remedy=f"use one of the registered names, or register the {self.kind} first") from None

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[str, E]]:
        """`(name, entry)` pairs, in registration order."""
        return list(self._entries.items())

    def values(self) -> list[E]:
        """The entries, in registration order."""
        return list(self._entries.values())


def load_object(target: Any) -> Any:
    """`target` itself, or the object a `"module:Name"` string names (imported now)."""
    if not isinstance(target, str):
        return target
    module_name, _, name = target.partition(":")
    if not name:
        raise RegistryError(f"{target!r} does not name an object", remedy='write it as "package.module:Name"')
    return getattr(importlib.import_module(module_name), name)


def lazy_names(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`(__getattr__, __dir__)` for `package`, whose documented `names` (`{name: defining module}`)
    are imported on first use and then kept in its namespace: `import package` stays cheap."""
    def getattr_(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return getattr_, dir_
