"""`manifest.json`: what an export folder holds, written with the export and read back with suspicion.

```
{"hfexport_manifest": 4, "kind": "generation", "format": "onnx",
 "files": {"decode.onnx": {"bytes": 1234, "sha256": "..."}, "config.json": {...}, ...},
 "components": {"decode": {"files": ["decode.onnx", "decode.onnx.data"], "inputs": [...], ...}},
 "runtime_package": {"runner": "onnxruntime-genai", "ready": true, "why": null,
                     "files": ["genai_config.json", "decode.onnx", ...], "settings": {}}, ...}
```
`files` lists every file the export wrote (all but the manifest itself) by its path relative to the
folder, with its size and full SHA-256. `runtime_package` says, in one shape for every backend,
whether the runtime's own runner (`RUNNERS`) opens the folder, its files and why not
(`runtime_package_entry` writes it, `runtime_package` reads it). `read_manifest` is the one
reader: it refuses an oversized, too deeply nested, damaged or incomplete manifest, a newer version
and one older than 3 (which records no hashes), and any path that is absolute, climbs out with
`..` or leads out of the folder through a link, each in one line naming the file; it reads version
3's runtime package entries as `runtime_package`. `ListedFiles` hands out the listed files
(`FileBytes`) to whoever runs them, each checked on the bytes read, so that the bytes checked are
the bytes run. `owned_files` tells the output-folder rules which files an earlier export in a
folder wrote (`output_folder.py`: `--overwrite` replaces nothing else); `upgrade_manifest` records
the hashes an older manifest lacks, or rewrites version 3 as 4 (`hfexport verify --upgrade`).

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
import errno
import functools
import hashlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from ..errors import ExportFolderError

__all__ = ["MANIFEST", "MANIFEST_VERSION", "MAX_MANIFEST_BYTES", "RUNNERS", "FileBytes", "ListedFiles",
           "file_table", "listed_path", "owned_files", "parse_json", "read_manifest", "runtime_package",
           "runtime_package_entry", "sha256_of", "upgrade_manifest", "write_manifest"]

MANIFEST = "manifest.json"
#: 1: a generation export, no `kind`; 2: `kind`; 3: `files`, every file's size and full SHA-256;
#: 4: `runtime_package`, one entry for every runtime's package (version 3 had five shapes, which
#: `read_manifest` still reads: `_legacy_runtime_package`).
MANIFEST_VERSION = 4
#: The first version that records every file's hash: older ones are refused (`read_manifest`).
_HASHED_VERSION = 3
#: The runtimes' own runners an export folder can be the package of (`runtime_package.runner`),
#: with the format whose folders each opens.
RUNNERS = {"onnxruntime-genai": "onnx", "LLMPipeline": "openvino", "VLMPipeline": "openvino",
           "WhisperPipeline": "openvino", "TextLLMRunner": "executorch", "MultimodalRunner": "executorch"}
#: The `runtime_package.settings` that name a file of the folder (`models`: several), each of which
#: must be listed: a runner is handed them by name.
_PACKAGE_FILE_SETTINGS = ("program", "data", "model")
#: Version 3's entries that `runtime_package` replaces (`_legacy_runtime_package`).
_LEGACY_PACKAGE_KEYS = ("onnxruntime_genai", "openvino_genai", "openvino_genai_vlm", "executorch_multimodal_runner")
#: What hfexport wrote beside the components before version 3 listed every file (`owned_files`).
_LEGACY_OWN_FILES = frozenset({
    MANIFEST, "report.json", "export_config.json", "config.json", "generation_config.json", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "vocab.json",
    "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "genai_config.json", "openvino_tokenizer.xml",
    "openvino_tokenizer.bin", "openvino_detokenizer.xml", "openvino_detokenizer.bin"})
_REMEDY_DAMAGED = "copy the export folder again, whole, from where it was written, or export again"
#: The largest `manifest.json` read. An 8-layer LLM package's is 40 KB and a 30-layer image-text
#: model's under 1 MB; the cap is checked on the open file before a byte is parsed, so that a
#: crafted manifest costs neither the seconds nor the memory of parsing it.
MAX_MANIFEST_BYTES = 8 << 20


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


def read_manifest(folder: str | os.PathLike, *, verify: bool = True, older: bool = False) -> dict[str, Any]:
    """The manifest of the export in `folder`, checked: its size (before it is parsed), its nesting,
    its version, its shape, every path it lists (inside the folder), and with `verify` every listed
    file's size and SHA-256.

    A manifest older than version 3 lists no file's hash, so nothing in its folder can be checked:
    it is refused, naming the remedy, unless `older` (what `owned_files` reads to know what an
    earlier export in an output folder wrote; never a folder to open).

    Raises:
        ExportFolderError: one line naming `manifest.json` (or the file) and what is wrong.
    """
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file() and not path.is_symlink():
        what = ("holds no " + MANIFEST if folder.is_dir() else "is not a folder" if folder.exists()
                else "does not exist")
        raise ExportFolderError(f"{folder} {what}: it is not an hfexport export",
                                 remedy="pass a folder written by `hfexport export` (or hfexport.save_folder)")
    manifest = parse_json(_read_whole(path, folder, limit=MAX_MANIFEST_BYTES), path)
    _check_shape(folder, manifest)
    version = manifest["hfexport_manifest"]
    if version < _HASHED_VERSION:
        if older:
            return manifest
        raise ExportFolderError(
            f"{path} was written by hfexport 0.3 or older (manifest version {version}), which recorded no hash of "
            "its files: nothing in it can be checked, so it is not opened",
            remedy="export the model again, or, on a copy you trust, `hfexport verify --upgrade DIR` records the "
                   "hashes of the files it holds now")
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
    if version < 4 and (legacy := _legacy_runtime_package(manifest)) is not None:
        manifest["runtime_package"] = legacy
    for key in _LEGACY_PACKAGE_KEYS:  # read as `runtime_package` only
        manifest.pop(key, None)
    _check_runtime_package(folder, manifest)
    if verify:
        _each(lambda item: check_file(folder / item[0], item[1], folder=folder), list(files.items()))
    return manifest


def runtime_package_entry(runner: str, *, files: list[str] | tuple[str, ...] = (), why: str | None = None,
                          settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest's `{"runtime_package": ...}` entry of an export folder that `runner` (one of
    `RUNNERS`) opens, with its `files` (the model files it loads and those written for it; it
    reads the folder's configs and tokenizer files beside them, as the deploy pages list), or,
    given `why`, does not open (`ready` false), and the runner's own `settings` (the compile
    properties `LLMPipeline` is given, the methods of a `MultimodalRunner` program)."""
    if runner not in RUNNERS:
        raise ValueError(f"unknown runtime runner {runner!r}; one of {', '.join(RUNNERS)}")
    return {"runtime_package": {"runner": runner, "ready": why is None, "why": why,
                                "files": sorted(dict.fromkeys(files)), "settings": dict(settings or {})}}


def runtime_package(manifest: dict[str, Any], runner: str | None = None) -> dict[str, Any] | None:
    """The `runtime_package` entry of a manifest `read_manifest` returned, or None where the
    folder is no runtime's package (a single model, a dynamo export); with `runner`, None unless
    the entry is that runner's."""
    entry = manifest.get("runtime_package")
    return entry if entry is not None and (runner is None or entry["runner"] == runner) else None


def parse_json(data: bytes, path: Path) -> Any:
    """`data` (the bytes of `path`, a JSON file of an export folder) parsed, or `ExportFolderError`
    naming the file: not JSON, or nested deeper than Python's parser recurses (a crafted file
    200,000 levels deep; an export's manifest nests 6)."""
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        where = f" at line {error.lineno} column {error.colno}" if isinstance(error, json.JSONDecodeError) else ""
        raise ExportFolderError(f"{path} is not valid JSON ({getattr(error, 'msg', error)}{where}): truncated or "
                                 "damaged", remedy=_REMEDY_DAMAGED) from None
    except RecursionError:
        raise ExportFolderError(f"{path} nests its JSON deeper than Python's parser reads (an export's files nest "
                                 "a few levels): it is not a file hfexport wrote", remedy=_REMEDY_DAMAGED) from None


def check_file(path: Path, entry: dict[str, Any], *, folder: Path) -> None:
    """`ExportFolderError` unless `path` holds the bytes the manifest of `folder` records (`entry`)."""
    with _open_listed(path, folder) as stream:
        size = os.fstat(stream.fileno()).st_size
        _check_size(path, size, entry)
        digest = hashlib.file_digest(stream, "sha256").hexdigest()
    _check_digest(path, digest, entry)


class FileBytes:
    """A file to hand a runtime, read once: its bytes (`data`, read whole at first use), or a
    private copy of them (`copy_to`), each checked against the size and SHA-256 its export folder's
    manifest records (`expected`; a file a caller names without a manifest is not checked). The
    runtime is given these bytes or this copy, never the path in the folder: a file swapped on disk
    after its check is never read again.

    Args:
        path: where the file lies (messages and names: what a model names it by is `name`).
        expected: its manifest entry (`{"bytes", "sha256"}`), or None.
        folder: the export folder it is listed in (its links and parents are checked on opening).
        verify: check the SHA-256 too (`--no-verify` checks the size only).
    """

    def __init__(self, path: str | os.PathLike, expected: dict[str, Any] | None = None, *, folder: Path | None = None,
                 verify: bool = True):
        self.path = Path(path)
        self.expected, self.folder, self.verify = expected, folder, verify

    @property
    def name(self) -> str:
        """The file's name (what a model names it by: an ONNX external-data location, a `.bin`)."""
        return self.path.name

    @classmethod
    def read(cls, path: str | os.PathLike) -> FileBytes:
        """A file a caller names (no manifest: read once, not checked)."""
        return cls(path)

    @functools.cached_property
    def data(self) -> bytes:
        """The file's bytes, read whole and checked."""
        with self._open() as stream:
            data = stream.read() if self.expected is None else stream.read(self.expected["bytes"] + 1)
        self._check(len(data), lambda: hashlib.sha256(data).hexdigest())
        return data

    def copy_to(self, folder: Path) -> Path:
        """Write the file's bytes to `folder / name` (a private folder of the caller's), checked
        as they are copied, without holding them whole in memory: for a runtime that maps its
        weights from a path (ONNX Runtime, ExecuTorch's data file). Return the copy."""
        target = Path(folder) / self.name
        digest, size = hashlib.sha256(), 0
        with self._open() as stream, open(target, "xb") as copy:
            while chunk := stream.read(1 << 24):
                digest.update(chunk)
                copy.write(chunk)
                size += len(chunk)
        try:
            self._check(size, digest.hexdigest)
        except ExportFolderError:
            target.unlink()
            raise
        return target

    def _open(self) -> Any:
        if self.expected is None:
            return open(self.path, "rb")
        stream = _open_listed(self.path, self.folder or self.path.parent)
        try:
            _check_size(self.path, os.fstat(stream.fileno()).st_size, self.expected)
        except ExportFolderError:
            stream.close()
            raise
        return stream

    def _check(self, size: int, digest: Callable[[], str]) -> None:
        if self.expected is not None:
            _check_size(self.path, size, self.expected)  # it changed while read
            if self.verify:
                _check_digest(self.path, digest(), self.expected)

    def __repr__(self) -> str:
        return f"FileBytes({str(self.path)!r})"


class ListedFiles:
    """The files `manifest` lists in `folder`, each handed out as a `FileBytes` checked against
    the manifest as it is read (size, and with `verify` SHA-256), so that whoever runs a file runs
    the bytes that were checked.

    # NOTE: why bytes (or private copies) and not paths. Checking a file, then letting a runtime
    # open it again by its path, runs whatever the path holds by then (a file swapped after the
    # check, on a folder someone else can still write). ONNX Runtime, OpenVINO, torch and
    # ExecuTorch load from memory; where holding a large weights file in memory beside the
    # runtime's own copy would double the load's peak (ONNX Runtime, ExecuTorch's `.ptd`), a
    # private copy written from the checked bytes is what the runtime maps instead
    # (docs/trust.md: where that is and what it costs).
    """

    def __init__(self, folder: Path, manifest: dict[str, Any], *, verify: bool = True):
        self.folder = Path(folder)
        self.entries: dict[str, dict[str, Any]] = manifest["files"]
        self.verify = verify

    def read(self, relative: str) -> FileBytes:
        """The listed file `relative`, to be read (and checked as read) by whoever runs it;
        `ExportFolderError` naming it when it is not listed, or not a plain path inside the folder."""
        path = listed_path(self.folder, relative)
        entry = self.entries.get(relative)
        if entry is None:
            raise ExportFolderError(f"{path} is not a file {MANIFEST} lists: an export reads only its own files",
                                     remedy=_REMEDY_DAMAGED)
        return FileBytes(path, entry, folder=self.folder, verify=self.verify)

    def check_others(self, skipped: set[str]) -> None:
        """Check every listed file but those in `skipped` (sizes; SHA-256s with `verify`), side by
        side, without keeping their bytes: a damaged file is refused when the folder is opened,
        whether or not anything reads it later (what reads it then checks it again, `read`)."""
        unread = [(relative, entry) for relative, entry in self.entries.items() if relative not in skipped]
        if self.verify:
            _each(lambda item: check_file(self.folder / item[0], item[1], folder=self.folder), unread)
            return
        for relative, entry in unread:
            with _open_listed(self.folder / relative, self.folder) as stream:
                _check_size(self.folder / relative, os.fstat(stream.fileno()).st_size, entry)


def _open_listed(path: Path, folder: Path) -> Any:
    """`path` (a listed file of `folder`) opened for reading, or `ExportFolderError` naming it when
    it is missing, a link, or not a plain file. The file itself is opened without following a
    link (`O_NOFOLLOW`), and every folder between it and `folder` is checked to be no link."""
    for parent in path.relative_to(folder).parents:
        if parent != Path(".") and (folder / parent).is_symlink():
            raise ExportFolderError(f"{folder / parent} is a link; an export folder holds plain folders and files",
                                     remedy=_REMEDY_DAMAGED)
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ExportFolderError(f"{path} is missing from the export in {folder} ({MANIFEST} lists it)",
                                 remedy=_REMEDY_DAMAGED) from None
    except OSError as error:
        if error.errno == errno.ELOOP or path.is_symlink():
            raise ExportFolderError(f"{path} is a link, not the file the export wrote; an export folder holds "
                                     "plain files", remedy=_REMEDY_DAMAGED) from None
        raise ExportFolderError(f"{path} cannot be read: {error.strerror}", remedy=_REMEDY_DAMAGED) from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise ExportFolderError(f"{path} is not a plain file (a folder, a device or a pipe); {MANIFEST} lists a "
                                 "file there", remedy=_REMEDY_DAMAGED)
    return os.fdopen(descriptor, "rb")


def _read_whole(path: Path, folder: Path, *, limit: int) -> bytes:
    """The bytes of `path`, opened as a listed file is (`_open_listed`), refused over `limit` bytes
    before any is read."""
    with _open_listed(path, folder) as stream:
        size = os.fstat(stream.fileno()).st_size
        if size > limit:
            raise ExportFolderError(f"{path} is {size:,} bytes; hfexport reads at most {limit:,} (an export's "
                                     f"{path.name} is far smaller): it is not a file hfexport wrote",
                                     remedy=_REMEDY_DAMAGED)
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise ExportFolderError(f"{path} grew past {limit:,} bytes while it was read", remedy=_REMEDY_DAMAGED)
    return data


def _check_size(path: Path, size: int, entry: dict[str, Any]) -> None:
    if size != entry["bytes"]:
        raise ExportFolderError(f"{path} is not the file this export wrote: {size:,} bytes, {MANIFEST} records "
                                 f"{entry['bytes']:,} (truncated, replaced or copied from another export)",
                                 remedy=_REMEDY_DAMAGED)


def _check_digest(path: Path, digest: str, entry: dict[str, Any]) -> None:
    if digest != entry["sha256"]:
        raise ExportFolderError(f"{path} is not the file this export wrote: its SHA-256 differs from the one "
                                 f"{MANIFEST} records (damaged in a copy, or changed since)", remedy=_REMEDY_DAMAGED)


def owned_files(folder: Path) -> tuple[set[str] | None, str | None]:
    """`(the files the hfexport export in `folder` wrote, None)`, or `(None, why it is not one)`:
    what `--overwrite` may replace there. Version 3 lists them; older ones are their components'
    files and the names hfexport wrote beside (`_LEGACY_OWN_FILES`)."""
    if not (folder / MANIFEST).is_file():
        return None, f"no {MANIFEST}"
    try:
        manifest = read_manifest(folder, verify=False, older=True)
    except ExportFolderError as error:
        return None, str(error).split("\n")[0].removeprefix(f"[{error.step}] ")
    if manifest["hfexport_manifest"] >= 3:
        return set(manifest["files"]) | {MANIFEST}, None
    components = {f for entry in manifest["components"].values() for f in entry["files"]}
    return components | _LEGACY_OWN_FILES, None


def upgrade_manifest(folder: str | os.PathLike) -> int | None:
    """Rewrite the manifest of an export written by hfexport 0.3 or older (version 1-2, no hashes)
    as version 3, listing the files it names that `folder` holds now with their hashes; return
    the version upgraded from, or None when it is version 3 already. For a copy the caller trusts:
    the hashes prove the files stay as they are now, not that they are what was exported.

    Raises:
        ExportFolderError: the manifest is damaged, a component's file is missing or is a link.
    """
    from .storage import atomic_file, fingerprint

    folder = Path(folder)
    manifest = read_manifest(folder, verify=False, older=True)
    version = manifest["hfexport_manifest"]
    if version >= _HASHED_VERSION:
        if version >= MANIFEST_VERSION:
            return None
        manifest = read_manifest(folder, verify=True)  # version 3: its files checked, its entries rewritten
        with atomic_file(folder / MANIFEST) as stream:
            stream.write(json.dumps({**manifest, "hfexport_manifest": MANIFEST_VERSION}, indent=2))
        return version
    components = {f for entry in manifest["components"].values() for f in entry["files"]}
    for entry in manifest["components"].values():  # what 0.3 recorded of a weights file: its size and ends
        for name, expected in (entry.get("fingerprints") or {}).items():
            if name in components and (folder / name).is_file() and fingerprint(folder / name) != expected:
                raise ExportFolderError(f"{folder / name} is not the file this export wrote: its size or the ends "
                                         "of its bytes differ from what the manifest records", remedy=_REMEDY_DAMAGED)
    present = {name for name in _LEGACY_OWN_FILES - {MANIFEST} if (folder / name).is_file()
               and not (folder / name).is_symlink()}
    files = {}
    for relative in sorted(components | present):
        path = listed_path(folder, relative)
        with _open_listed(path, folder) as stream:
            files[relative] = {"bytes": os.fstat(stream.fileno()).st_size,
                               "sha256": hashlib.file_digest(stream, "sha256").hexdigest()}
    body = {k: v for k, v in manifest.items() if k not in ("hfexport_manifest", "files")}
    if (legacy := _legacy_runtime_package({**body, "files": files})) is not None:
        body["runtime_package"] = legacy
    body = {k: v for k, v in body.items() if k not in _LEGACY_PACKAGE_KEYS}
    with atomic_file(folder / MANIFEST) as stream:
        stream.write(json.dumps({"hfexport_manifest": MANIFEST_VERSION, **body, "files": files}, indent=2))
    return version


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
    required = {"format": str, "components": dict, **({"files": dict} if version >= _HASHED_VERSION else {})}
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
        if not all(isinstance(i, dict) and isinstance(i.get("name"), str) and isinstance(i.get("shape"), list)
                   and isinstance(i.get("dtype", ""), str) for i in component["inputs"]):
            raise _damaged(folder, f"gives component {name!r} an input without a name, a shape list and a dtype")
        if not all(isinstance(o, str) for o in component["outputs"]):
            raise _damaged(folder, f"gives component {name!r} an output that is not a name")
        for relative in component["files"]:
            listed_path(folder, relative)


def _check_runtime_package(folder: Path, manifest: dict[str, Any]) -> None:
    """Refuse a `runtime_package` entry of another shape than `runtime_package_entry` writes, of a
    runner that does not open the manifest's format, or naming a file the manifest does not list."""
    entry = manifest.get("runtime_package")
    if entry is None:
        return
    shape = {"runner": str, "ready": bool, "why": (str, type(None)), "files": list, "settings": dict}
    if not isinstance(entry, dict) or set(entry) != set(shape) or not all(
            isinstance(entry[key], kind) for key, kind in shape.items()):
        raise _damaged(folder, "has a 'runtime_package' entry of another shape than hfexport writes")
    if RUNNERS.get(entry["runner"]) != manifest["format"]:
        raise _damaged(folder, f"names {entry['runner']!r} as the runner of a {manifest['format']} export")
    if entry["ready"] == (entry["why"] is not None):
        raise _damaged(folder, "has a 'runtime_package' entry that is ready and says why not, or neither")
    settings = entry["settings"]
    named = [settings.get(key) for key in _PACKAGE_FILE_SETTINGS if settings.get(key) is not None]
    models = settings.get("models", {})
    named += list(models.values()) if isinstance(models, dict) else [models]
    unlisted = [f for f in [*entry["files"], *named] if not isinstance(f, str) or f not in manifest["files"]]
    if unlisted:
        raise _damaged(folder, f"names {', '.join(map(repr, unlisted))} for its runtime package without listing "
                       "it under 'files'")


def _legacy_runtime_package(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The `runtime_package` entry of a version-3 manifest, from the five shapes it wrote instead:
    `onnxruntime_genai`, `openvino_genai`, `openvino_genai_vlm`, `executorch_multimodal_runner`
    and ExecuTorch's `cache: "program"` (whose refusals were in `report.json` only). Nothing is
    trusted by it: the entry it returns is checked as a version-4 one is."""
    def entry(runner: str, files: list[Any], why: Any, settings: dict[str, Any]) -> dict[str, Any]:
        listed = sorted(dict.fromkeys(f for f in files if isinstance(f, str) and f))
        return {"runner": runner, "ready": why is None, "why": why if why is None else str(why),
                "files": listed if why is None else [],
                "settings": settings}

    def model_files(stem: Any) -> list[Any]:
        return [stem, stem[: -len(".xml")] + ".bin"] if isinstance(stem, str) and stem.endswith(".xml") else [stem]

    if isinstance(old := manifest.get("onnxruntime_genai"), dict):
        decode = manifest["components"].get("decode", {}).get("files", [])
        return entry("onnxruntime-genai", [old.get("config"), *decode],
                     None if old.get("config") else old.get("reason", "no genai_config.json"), {})
    if isinstance(old := manifest.get("openvino_genai"), dict):
        return entry("LLMPipeline", [*model_files(old.get("model")), *(old.get("tokenizer") or [])],
                     None if old.get("llm_pipeline") else old.get("why", "not an LLMPipeline folder"),
                     {**({"model": old["model"]} if "model" in old else {}), "properties": old.get("properties") or {}})
    if isinstance(old := manifest.get("openvino_genai_vlm"), dict):
        models = old.get("models") or {}
        files = [f for stem in models.values() for f in model_files(stem)]
        return entry("VLMPipeline", [*files, *(old.get("tokenizer") or []), old.get("image_processor")],
                     None if old.get("vlm_pipeline") else old.get("why", "not a VLMPipeline folder"),
                     {"models": models, "properties": old.get("properties") or {}})
    if isinstance(old := manifest.get("executorch_multimodal_runner"), dict):
        settings = {k: old[k] for k in ("program", "data", "methods", "image", "image_token_id", "max_cache_len")
                    if k in old}
        return entry("MultimodalRunner", [old.get("program"), old.get("data"), old.get("tokenizer")],
                     None if old.get("multimodal_runner") else old.get("why", "not a MultimodalRunner folder"),
                     settings)
    if manifest.get("cache") == "program":
        files = [f for f in ("decode.pte", "decode.ptd", "tokenizer.json") if f in manifest["files"]]
        why = (None if "tokenizer.json" in files
               else "the export was given no tokenizer: TextLLMRunner needs tokenizer.json")
        return entry("TextLLMRunner", files, why, {"program": "decode.pte",
                                                    "data": "decode.ptd" if "decode.ptd" in files else None})
    return None


def _damaged(folder: Path, what: str) -> ExportFolderError:
    return ExportFolderError(f"{folder / MANIFEST} {what}", remedy=_REMEDY_DAMAGED)
