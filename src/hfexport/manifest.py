"""`manifest.json`: what an export folder holds, written with the export and read back with suspicion.

```
{"hfexport_manifest": 3, "kind": "generation", "format": "onnx",
 "files": {"decode.onnx": {"bytes": 1234, "sha256": "..."}, "config.json": {...}, ...},
 "components": {"decode": {"files": ["decode.onnx", "decode.onnx.data"], "inputs": [...], ...}}, ...}
```
`files` lists every file the export wrote (all but the manifest itself) by its path relative to the
folder, with its size and full SHA-256. `read_manifest` is the one reader: it refuses a damaged or
incomplete manifest, a newer version, and any path that is absolute, climbs out with `..` or leads
out of the folder through a link, and (by default) any file whose bytes differ from what was
written, each in one line naming the file. `owned_files` tells the output-folder rules which files
an earlier export in a folder wrote (`output_folder.py`: `--overwrite` replaces nothing else).

# NOTE: why every file's full hash, checked on every load. An export folder is made to be copied
# between machines and people; a weights file damaged in transit (a flipped byte in the middle of
# a multi-GB `.onnx.data`) loaded and generated without a word when only the size and the ends
# were checked. A full SHA-256 costs 0.74 s per GiB on this 2-CPU machine (`bench/manifest_hash.py`,
# bench/RESULTS.md), small beside loading the same bytes into a runtime; `verify=False` (`--no-verify`) skips it for a
# folder the caller wrote or trusts, and never the path checks. The hash is integrity, not
# authenticity: whoever can write the files can write the manifest too (docs/trust.md).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from .errors import ExportFolderError

__all__ = ["MANIFEST", "MANIFEST_VERSION", "file_table", "listed_path", "owned_files", "read_manifest",
           "sha256_of", "write_manifest"]

logger = logging.getLogger("hfexport")

MANIFEST = "manifest.json"
#: 1: a generation export, no `kind`; 2: `kind`; 3: `files`, every file's size and full SHA-256.
MANIFEST_VERSION = 3
#: What hfexport wrote beside the components before version 3 listed every file (`owned_files`).
_LEGACY_OWN_FILES = frozenset({
    MANIFEST, "report.json", "export_config.json", "config.json", "generation_config.json", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "vocab.json",
    "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "genai_config.json", "openvino_tokenizer.xml",
    "openvino_tokenizer.bin", "openvino_detokenizer.xml", "openvino_detokenizer.bin"})
_REMEDY_DAMAGED = "copy the export folder again, whole, from where it was written, or export again"


def sha256_of(path: Path) -> str:
    """The SHA-256 of the whole file at `path`, as hex."""
    with open(path, "rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def file_table(folder: Path, known: dict[str, dict[str, Any]] | None = None,
               changed: frozenset[str] = frozenset()) -> dict[str, dict[str, Any]]:
    """`{relative path: {"bytes", "sha256"}}` of every file under `folder` but the manifest, in
    sorted order (what `write_manifest` records); a file in `known` and not in `changed` keeps
    its entry there instead of being hashed again."""
    paths = [p for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()
             and p.relative_to(folder).as_posix() != MANIFEST]
    known = {k: v for k, v in (known or {}).items() if k not in changed}
    fresh = [p for p in paths if p.relative_to(folder).as_posix() not in known]
    hashed = dict(zip(fresh, _each(sha256_of, fresh)))
    return {p.relative_to(folder).as_posix(): known.get(p.relative_to(folder).as_posix())
            or {"bytes": p.stat().st_size, "sha256": hashed[p]} for p in paths}


def write_manifest(folder: Path, manifest: dict[str, Any], *, changed: frozenset[str] | None = None) -> dict[str, Any]:
    """Write `manifest` to `folder/manifest.json` with `files` listing every file now in `folder`;
    return what was written. With `changed`, the manifest's own `files` are kept for every file
    but those named there (and files new since): a manifest rewritten after one file changed
    does not hash the weights again."""
    known = manifest.get("files") if changed is not None else None
    body = {k: v for k, v in manifest.items() if k not in ("hfexport_manifest", "files")}
    manifest = {"hfexport_manifest": MANIFEST_VERSION, **body,
                "files": file_table(folder, known, frozenset(changed or ()))}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    return manifest


def listed_path(folder: Path, relative: Any) -> Path:
    """`folder / relative` for a path a manifest lists, or `ExportFolderError` when it is not a
    plain relative path inside `folder` (absolute, a drive, `..`, a link leading out)."""
    if not isinstance(relative, str) or not relative or "\\" in relative or "\0" in relative:
        raise _damaged(folder, f"lists the path {relative!r}, which is not a relative path")
    posix, windows = PurePosixPath(relative), PureWindowsPath(relative)
    if posix.is_absolute() or windows.is_absolute() or windows.drive or ".." in posix.parts:
        raise _damaged(folder, f"lists {relative!r}, a path outside the folder; an export lists only its own files")
    path = folder / relative
    if not path.resolve().is_relative_to(folder.resolve()):
        raise _damaged(folder, f"lists {relative!r}, which is a link leading out of the folder")
    return path


def read_manifest(folder: str | os.PathLike, *, verify: bool = True) -> dict[str, Any]:
    """The manifest of the export in `folder`, checked: its version, its shape, every path it lists
    (inside the folder), and with `verify` every listed file's size and SHA-256.

    Raises:
        ExportFolderError: one line naming `manifest.json` (or the file) and what is wrong.
    """
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise ExportFolderError(f"{folder} holds no {MANIFEST}: it is not an hfexport export",
                                 remedy="pass a folder written by `hfexport export` (or save_export / "
                                 "save_generation_export)")
    try:
        manifest = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        where = f" at line {error.lineno} column {error.colno}" if isinstance(error, json.JSONDecodeError) else ""
        raise _damaged(folder, f"is not valid JSON ({getattr(error, 'msg', error)}{where}): truncated or "
                       "damaged") from None
    _check_shape(folder, manifest)
    version = manifest["hfexport_manifest"]
    if version < MANIFEST_VERSION:
        logger.warning("%s was written by an older hfexport (manifest version %d): its files are checked by size "
                       "and the ends of their bytes only; export again for a full check of every file", path, version)
        return manifest
    files = manifest["files"]
    for relative, entry in files.items():
        listed_path(folder, relative)
        if not (isinstance(entry, dict) and isinstance(entry.get("bytes"), int)
                and isinstance(entry.get("sha256"), str)):
            raise _damaged(folder, f"gives no size and sha256 for {relative!r}")
    for name, component in manifest["components"].items():
        unlisted = [f for f in component["files"] if f not in files]
        if unlisted:
            raise _damaged(folder, f"names {', '.join(map(repr, unlisted))} for component {name!r} without listing "
                           "it under 'files'")
    if verify:
        _each(lambda item: check_file(folder / item[0], item[1], folder=folder), list(files.items()))
    return manifest


def check_file(path: Path, entry: dict[str, Any], *, folder: Path) -> None:
    """`ExportFolderError` unless `path` holds the bytes the manifest of `folder` records (`entry`)."""
    if path.is_symlink() or not path.is_file():
        raise ExportFolderError(f"{path} is missing from the export in {folder} ({MANIFEST} lists it)",
                                 remedy=_REMEDY_DAMAGED)
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise ExportFolderError(f"{path} is not the file this export wrote: {size:,} bytes, {MANIFEST} records "
                                 f"{entry['bytes']:,} (truncated, replaced or copied from another export)",
                                 remedy=_REMEDY_DAMAGED)
    if sha256_of(path) != entry["sha256"]:
        raise ExportFolderError(f"{path} is not the file this export wrote: its SHA-256 differs from the one "
                                 f"{MANIFEST} records (damaged in a copy, or changed since)", remedy=_REMEDY_DAMAGED)


def owned_files(folder: Path) -> tuple[set[str] | None, str | None]:
    """`(the files the hfexport export in `folder` wrote, None)`, or `(None, why it is not one)`:
    what `--overwrite` may replace there. Version 3 lists them; older ones are their components'
    files and the names hfexport wrote beside (`_LEGACY_OWN_FILES`)."""
    if not (folder / MANIFEST).is_file():
        return None, f"no {MANIFEST}"
    try:
        manifest = read_manifest(folder, verify=False)
    except ExportFolderError as error:
        return None, str(error).split("\n")[0].removeprefix(f"[{error.step}] ")
    if manifest["hfexport_manifest"] >= 3:
        return set(manifest["files"]) | {MANIFEST}, None
    components = {f for entry in manifest["components"].values() for f in entry["files"]}
    return components | _LEGACY_OWN_FILES, None


def _each(work: Any, items: list) -> list:
    """`[work(item) for item in items]`, the files hashed on several threads (hashlib lets go of
    the GIL while it hashes): an export's weights files are checked side by side. The first
    error, in the items' order, is raised."""
    if len(items) < 2:
        return [work(item) for item in items]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(items), os.cpu_count() or 1, 8)) as pool:
        return list(pool.map(work, items))


def _check_shape(folder: Path, manifest: Any) -> None:
    if not isinstance(manifest, dict):
        raise _damaged(folder, f"holds a JSON {type(manifest).__name__}, not an object")
    version = manifest.get("hfexport_manifest", 1 if "components" in manifest else None)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _damaged(folder, f"has no valid 'hfexport_manifest' version ({version!r})")
    if version > MANIFEST_VERSION:
        raise ExportFolderError(
            f"{folder / MANIFEST} was written by a newer hfexport (manifest version {version}; this one reads "
            f"versions 1-{MANIFEST_VERSION})", remedy="upgrade hfexport (pip install -U hfexport) to open it")
    manifest.setdefault("hfexport_manifest", version)
    required = {"format": str, "components": dict, **({"files": dict} if version >= 3 else {})}
    for key, kind in required.items():
        if not isinstance(manifest.get(key), kind):
            what = "lacks" if key not in manifest else f"has a {type(manifest[key]).__name__} as"
            raise _damaged(folder, f"{what} {key!r} (expected a JSON {'string' if kind is str else 'object'})")
    for name, component in manifest["components"].items():
        if not isinstance(component, dict) or not isinstance(component.get("files"), list) or not all(
                isinstance(f, str) for f in component["files"]):
            raise _damaged(folder, f"gives component {name!r} no list of files")
        for key in ("inputs", "outputs"):
            if not isinstance(component.get(key), list):
                raise _damaged(folder, f"gives component {name!r} no {key!r} list")
        for relative in component["files"]:
            listed_path(folder, relative)


def _damaged(folder: Path, what: str) -> ExportFolderError:
    return ExportFolderError(f"{folder / MANIFEST} {what}", remedy=_REMEDY_DAMAGED)
