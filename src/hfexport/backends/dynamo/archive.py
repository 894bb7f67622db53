"""What a `.pt2` may hold before `torch.export.load` opens it: `check_archive`.

# NOTE: a reader that accepts only what hfexport writes, rather than a list of what is dangerous.
# torch 2.13's `torch.export.load` runs code a file names (read in torch/export/pt2_archive/_package.py
# and torch/_export/serde/serialize.py): pickles it unpickles without the weights-only check (example
# inputs that fail it, `use_pickle` payloads, opaque and script constants, the layout of torch < 2.8),
# an AOTInductor shared library, size expressions it `eval`s, guards it `exec`s. It finds members
# through miniz, case-insensitively and under whatever root folder the first member names
# (`models/model.JSON` is read as `models/model.json`). So `check_archive`:
# - refuses a compressed member: torch.export.save stores each as is, so none unpacks to more bytes
#   than the file holds (a zip bomb's member would);
# - lists the members with Python's zipfile and with torch's own reader (`PT2ArchiveReader`, what
#   `torch.export.load` uses), refuses the file unless both list the same names, all under one root
#   folder, no two of them one name to miniz (case folded), each exactly one of `_MEMBERS` or
#   `_NUMBERED`: what `torch.export.save` writes for one program, nothing else (no AOTInductor, old
#   layout, extra file, custom object);
# - reads every member it checks through torch's reader, so it checks the bytes torch will read;
# - refuses a payload config naming anything but the raw tensor members listed, or `use_pickle`;
# - imports the transformers modules the program's tree specs name by `tree_specs.py`'s rule only,
#   then registers the cache classes (a modeling module may define one), then refuses a program
#   JSON that `program_json.py`'s walk of torch's schema refuses: size expressions and guards
#   outside `expressions.py`'s grammar, operators outside the namespaces hfexport writes, names
#   that are not identifiers, tree specs naming types or classes outside the table, a field or
#   kind hfexport never writes;
# - refuses example inputs the weights-only unpickler refuses (that unpickler imports and calls only
#   its allowlist, so a pickle it accepts calls nothing else when loaded again), or that do not nest
#   as the checked input spec says (torch writes their paths into guard source).
# The check guards hfexport's own load (`read_program`); a plain `torch.export.load` of the same
# file does none of it.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.utils._pytree as pytree

from ...errors import RefusedFileError
from .program_json import payload_config_fault, program_fault
from .tree_specs import import_output_modules

__all__ = ["check_archive"]

#: Every member `torch.export.save` (torch 2.13) writes for one program, by its name under the
#: archive's root folder, with what its text must be (None: checked on its own below).
_MEMBERS: dict[str, re.Pattern | None] = {
    "archive_format": re.compile(r"pt2"),
    "archive_version": re.compile(r"0"),
    ".data/version": re.compile(r"[0-9]+\n?"),
    ".data/serialization_id": re.compile(r"[0-9]*"),
    "byteorder": re.compile(r"little|big"),
    "models/model.json": None,
    "data/sample_inputs/model.pt": None,
    "data/weights/model_weights_config.json": None,
    "data/constants/model_constants_config.json": None,
}
#: The tensor payloads, by their folder and file-name prefix: raw bytes, named by a payload config.
_NUMBERED = {"data/weights/": "weight_", "data/constants/": "tensor_"}
_INDEX = re.compile(r"0|[1-9][0-9]*")
#: The archive's root folder, as torch.export.save names it (the file's stem).
_ROOT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_DO_NOT_LOAD = "load only a .pt2 that hfexport wrote, or export the model again; otherwise do not load it"


def check_archive(source: str | Path | bytes, *, name: str | None = None) -> None:
    """Refuse (`RefusedFileError`, a `RuntimeLoadError`) a `.pt2` that holds anything but what hfexport writes, before
    `torch.export.load` opens it: see this module's note for what is checked and why.

    Args:
        source: the file's bytes (as `read_program` checks them), or its path (read once).
        name: what to call the file in a refusal (default: the path's name, or "the .pt2").
    """
    from ...capture.pytree import register_cache_pytree_nodes

    data, name = _read(source, name)
    members = _members(data, name)
    program = _json(name, "models/model.json", members["models/model.json"])
    import_output_modules(program)
    register_cache_pytree_nodes()  # after the imports: a modeling module may define a cache class
    if fault := program_fault(program):
        _refuse(name, f"its models/model.json: {fault}")
    for folder, prefix in _NUMBERED.items():
        member = f"{folder}model_{'weights' if prefix == 'weight_' else 'constants'}_config.json"
        config = _json(name, member, members[member])
        if fault := payload_config_fault(config):
            _refuse(name, f"its {member}: {fault}")
        _check_payloads(name, config, folder, prefix, members)
    _check_example_inputs(name, members["data/sample_inputs/model.pt"], program)


def _json(name: str, member: str, data: bytes | None) -> Any:
    try:
        return json.loads(data or b"")
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        _refuse(name, f"its {member} is not JSON ({str(error)[:120]})")


def _read(source: str | Path | bytes, name: str | None) -> tuple[bytes, str]:
    if isinstance(source, bytes):
        return source, name or "the .pt2"
    return Path(source).read_bytes(), name or Path(source).name


def _members(data: bytes, name: str) -> dict[str, bytes | None]:
    """`{member: bytes}` for every member of the archive `data` (None for the tensor payloads, which
    are not read), read through torch's reader, once each name is one hfexport writes."""
    from torch.export.pt2_archive import PT2ArchiveReader  # torch.export.load's reader, read from torch 2.13

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            items = archive.infolist()
    except zipfile.BadZipFile as error:
        _refuse(name, f"it is not a zip archive ({error})")
    full_names = [item.filename for item in items]
    for item in items:  # stored as is, so no member reads as more bytes than the file holds
        if item.compress_type != zipfile.ZIP_STORED or item.file_size != item.compress_size:
            _refuse(name, f"its member {item.filename!r} is compressed; torch.export.save stores every member as is "
                          "(a compressed member may unpack to any size)")
    root = full_names[0].partition("/")[0] if full_names else ""
    if not _ROOT.fullmatch(root):
        _refuse(name, f"its first member {full_names[0] if full_names else None!r} is not in a root folder")
    names = []
    for full in full_names:
        folder, slash, member = full.partition("/")
        if folder != root or not slash:
            _refuse(name, f"its member {full!r} is outside the archive's root folder {root}/")
        names.append(member)
    folded: dict[str, str] = {}
    for member in names:
        if member.lower() in folded:
            _refuse(name, f"its members {folded[member.lower()]!r} and {member!r} are one name to torch's reader, "
                          "which ignores case")
        folded[member.lower()] = member
    for member in names:
        if not _is_allowed(member):
            _refuse(name, f"its member {member!r} is not one that torch.export.save writes for an hfexport program")
    missing = [member for member in _MEMBERS if member not in names]
    if missing:
        _refuse(name, f"it has no {missing[0]!r}: it is not a .pt2 that torch.export.save wrote")
    try:
        reader = PT2ArchiveReader(io.BytesIO(data))
        listed = reader.get_file_names()
        members = {m: None if _numbered(m) else reader.read_bytes(m) for m in names}
    except Exception as error:  # noqa: BLE001 (whatever torch's reader refuses, it says why)
        _refuse(name, f"torch's reader refuses it ({str(error).splitlines()[0][:200]})")
    if sorted(listed) != sorted(names):
        _refuse(name, "torch's reader and Python's zipfile do not find the same members in it")
    for member, text in _MEMBERS.items():
        if text is not None and not text.fullmatch(members[member].decode("ascii", errors="replace")):
            _refuse(name, f"its {member} holds {members[member][:40]!r}, not what torch.export.save writes there")
    return members


def _numbered(member: str) -> bool:
    folder, _, file = member.rpartition("/")
    prefix = _NUMBERED.get(folder + "/")
    return prefix is not None and file.startswith(prefix) and bool(_INDEX.fullmatch(file[len(prefix):]))


def _is_allowed(member: str) -> bool:
    """Whether `member` is exactly (case included) a name `torch.export.save` writes for one program."""
    return member in _MEMBERS or _numbered(member)


def _check_payloads(name: str, config: Any, folder: str, prefix: str, members: dict[str, bytes | None]) -> None:
    """Refuse a payload config (weights or constants) unless every entry is a raw tensor in a listed
    `folder/prefix<N>` member, not pickled, and every such member is one an entry names."""
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        _refuse(name, f"its {folder}model_*_config.json is not a payload config")
    named = set()
    for fqn, payload in entries.items():
        path = payload.get("path_name") if isinstance(payload, dict) else None
        if not (isinstance(path, str) and _numbered(folder + path) and path.startswith(prefix)
                and folder + path in members):
            _refuse(name, f"its {fqn!r} is stored as {str(path)[:80]!r}, not a raw tensor {folder}{prefix}N of the "
                          "archive (a pickled object, a script or opaque constant?)")
        if payload.get("use_pickle") is not False:
            _refuse(name, f"its {fqn!r} ({folder}{path}) is marked use_pickle, which torch.export.load unpickles "
                          "without the weights-only check")
        named.add(folder + path)
    unnamed = sorted(m for m in members if m.startswith(folder) and _numbered(m) and m not in named)
    if unnamed:
        _refuse(name, f"its member {unnamed[0]!r} is named by no entry of its payload config")


def _check_example_inputs(name: str, data: bytes | None, program: Any) -> None:
    """Refuse example inputs (a `torch.save` pickle) unless `torch.load(weights_only=True)` takes
    them and they nest exactly as the program's own (checked) input spec says.

    # NOTE: torch 2.13 writes the paths of the example inputs' leaves into the source of the guard
    # function `ExportedProgram.module()` execs (`_unlift.py` `_convert_guards_code_to_fn`, a
    # path's first key unquoted): a weights-only pickle of a cache whose attribute is named
    # `" + <code> + "` ran that code on the program's first call. With the structure of the checked
    # in_spec, every key is one `program_json.py` accepted.
    """
    if not data:  # a program saved without example inputs: torch reads none
        return
    member = "data/sample_inputs/model.pt"
    try:
        inputs = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:  # noqa: BLE001 (any refusal of the weights-only unpickler)
        reason = str(error).splitlines()
        found = next((line for line in reason if "GLOBAL" in line), reason[0] if reason else type(error).__name__)
        _refuse(name, f"its {member} is a pickle that needs more than the weights-only unpickler allows "
                      f"({found.strip()[:200]}); torch.export.load would unpickle it without that check",
                "if you trust the file and the classes it names are plain data, allow them with "
                "torch.serialization.add_safe_globals before loading; otherwise do not load it")
    entries = program["graph_module"]["module_call_graph"]
    signature = entries[0].get("signature") if entries else None
    try:
        matches = signature is not None and pytree.tree_structure(inputs) == pytree.treespec_loads(
            signature["in_spec"])
    except Exception:  # noqa: BLE001 (inputs that do not even flatten do not match)
        matches = False
    if not matches:
        _refuse(name, f"its {member} does not nest as the program's inputs do (its in_spec); torch writes the "
                      "paths of its leaves into the guard code the loaded program runs")


def _refuse(name: str, why: str, remedy: str = _DO_NOT_LOAD) -> NoReturn:
    raise RefusedFileError(f"refused to load {name}: {why}".replace("\n", " "), remedy=remedy)
