"""Crafting a hostile `.pt2` the way an attacker would: take a real one hfexport saved and rewrite
its zip members (names, bytes, the program's JSON, a cache's tree-spec context). Shared by the
archive, pytree and export-folder tests."""

from __future__ import annotations

import io
import json
import os
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch

Members = list[tuple[str, bytes]]


class Touches:
    """Pickles as a call of `pathlib.Path(path).touch()`: what a hostile file does when unpickled."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return Path.touch, (Path(self.path),)


def touch_expression(marker: Path) -> str:
    """Python that creates `marker` when evaluated (what `sympify` does with an `expr_str`)."""
    return f"__import__('pathlib').Path({str(marker)!r}).touch()"


def pickled(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def rewrite(source: Path, target: Path, change: Callable[[Members], Members]) -> Path:
    """Copy the archive `source` to `target` with its members (names relative to the archive's root
    folder, and bytes) passed through `change`; the root folder is kept."""
    with zipfile.ZipFile(source) as old:
        root = old.namelist()[0].split("/", 1)[0]
        members = [(item.filename.split("/", 1)[1], old.read(item)) for item in old.infolist()]
    with zipfile.ZipFile(target, "w") as new, warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Duplicate name", UserWarning)  # a duplicate is an attack too
        for name, data in change(members):
            new.writestr(f"{root}/{name}", data)
    return target


def renamed(old: str, new: str, data: bytes | None = None) -> Callable[[Members], Members]:
    """Member `old` under the name `new` (with `data` instead of its bytes, if given)."""
    return lambda members: [(new, data if data is not None else d) if n == old else (n, d) for n, d in members]


def added(name: str, data: bytes, after: str | None = None) -> Callable[[Members], Members]:
    """A new member `name` at the end, or right after the member `after`."""
    if after is None:
        return lambda members: [*members, (name, data)]
    return lambda members: [item for member in members
                            for item in ([member, (name, data)] if member[0] == after else [member])]


def replaced(name: str, data: bytes) -> Callable[[Members], Members]:
    return lambda members: [(n, data if n == name else d) for n, d in members]


def program_edited(edit: Callable[[dict], Any], member: str = "models/model.json") -> Callable[[Members], Members]:
    """The program's JSON (`models/model.json`) passed through `edit` (which changes it in place)."""
    def change(members: Members) -> Members:
        out = []
        for name, data in members:
            if name == member:
                tree = json.loads(data)
                edit(tree)
                data = json.dumps(tree).encode()
            out.append((name, data))
        return out
    return change


def first_expression(tree: Any) -> dict:
    """The first `{"expr_str": ...}` object in the program's JSON."""
    if isinstance(tree, dict):
        if "expr_str" in tree:
            return tree
        values = tree.values()
    elif isinstance(tree, list):
        values = tree
    else:
        return {}
    for value in values:
        if found := first_expression(value):
            return found
    return {}


def cache_context_edited(edit: Callable[[list], Any]) -> Callable[[Members], Members]:
    """The first cache's tree-spec context in the program's input spec (as the list `{"t": [...]}`
    holds: class, has layers, layer specs, sub-caches, tensor names, state) passed through `edit`."""
    def edit_program(tree: dict) -> None:
        signature = tree["graph_module"]["module_call_graph"][0]["signature"]
        protocol, spec = json.loads(signature["in_spec"])

        def visit(node: dict) -> bool:
            if node["type"] and "cache_utils" in node["type"]:
                context = json.loads(node["context"])
                edit(context["t"])
                node["context"] = json.dumps(context)
                return True
            return any(visit(child) for child in node["children_spec"])

        assert visit(spec), "the program's inputs hold no cache"
        signature["in_spec"] = json.dumps([protocol, spec])
    return program_edited(edit_program)


def state(fields: list[tuple[str, Any]]) -> dict:
    """A state as `_dump_value` writes it: `(name, value)` pairs."""
    return {"t": [{"t": [name, value]} for name, value in fields]}


def file_closer(victim: Path) -> Callable[[list], None]:
    """Make the cache's first layer a `tempfile._TemporaryFileCloser` (reached through
    `transformers.utils.hub`'s `tempfile`) whose state deletes `victim` when it is collected."""
    def edit(context: list) -> None:
        context[2]["t"][0] = {"t": [{"class": "transformers.utils.hub:tempfile._TemporaryFileCloser"}, {"t": []},
                                    state([("file", 1), ("name", os.fspath(victim)), ("delete", True),
                                           ("close_called", False)])]}
    return edit


def refresh_manifest(folder: Path) -> None:
    """Rewrite `folder`'s manifest so that every file "checks" again (size and SHA-256 of what is
    there now): what an attacker who changed a file does too."""
    from hfexport.folder.manifest import MANIFEST, write_manifest

    manifest = json.loads((folder / MANIFEST).read_text())
    write_manifest(folder, manifest)
