"""Files that appear only when complete, for every format.

Everything is written to a temporary file (or folder) beside the target and renamed into place at
the end; an error or Ctrl-C removes the temporary one, so nothing half-written is left behind.
An artifact's own `save(path)` stages its files itself (`staged_files`); a whole export folder is
staged by `output_folder.staged_folder`, which also decides what an export may replace.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ..errors import SerializationError

__all__ = ["atomic_file", "checked_destination", "current_umask", "fingerprint", "staged_files"]


@contextlib.contextmanager
def atomic_file(target: Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Yield a stream to a temporary file beside `target`, renamed onto it on success and removed
    on failure: `target` is never half-written. The file gets the mode of the one it replaces, or
    that of a new file (`0o666` less the umask), not the temporary file's private `0o600`."""
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.partial-", dir=target.parent)
    try:
        with os.fdopen(handle, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as stream:
            os.chmod(temporary, target.stat().st_mode & 0o7777 if target.is_file() else 0o666 & ~current_umask())
            yield stream
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def current_umask() -> int:
    """The process's umask (read from `/proc` where it can be: setting it to read it races other threads)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii") as status:
            return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def checked_destination(destination: str | os.PathLike, *, overwrite: bool, what: str) -> Path:
    """`destination` as a path, or `SerializationError` when it cannot be written as asked (no
    such folder, a folder in its place, or a file already there without `overwrite`); `what` names
    it in the message."""
    path = Path(destination)
    if not path.parent.exists():
        raise SerializationError(f"cannot save {what} to {path}: folder {path.parent} does not exist",
                                 remedy=f"create {path.parent} first")
    if path.is_dir():
        raise SerializationError(f"cannot save {what} to {path}: it is a folder", remedy="name a file in it")
    if path.exists() and not overwrite:
        raise SerializationError(f"{path} already exists", remedy="pass overwrite=True, or choose another path")
    return path


@contextlib.contextmanager
def staged_files(destination: Path, *, overwrite: bool, companions: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yield a temporary folder beside `destination` (a file path); on success every file written
    there is moved into `destination`'s folder (an artifact and its companions: `model.onnx` and
    `model.onnx.data`, `model.xml` and `model.bin`). A file already there is an error unless
    `overwrite`; on failure nothing is moved.

    Args:
        companions: the names of the files that belong to the artifact at `destination` besides
            it (`model.onnx.data`): one already there that this save did not write is removed
            with `overwrite`, as it belonged to the artifact saved there before and would now be
            taken for this one's. No other file in the folder is touched.
    """
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.partial-", dir=destination.parent))
    try:
        yield staging
        produced = sorted(staging.iterdir())
        for file in produced:
            if (destination.parent / file.name).exists() and not overwrite:
                raise SerializationError(f"{destination.parent / file.name} already exists", remedy="pass overwrite=True")
        for file in produced:
            os.replace(file, destination.parent / file.name)
        if overwrite:
            for name in set(companions) - {file.name for file in produced}:
                (destination.parent / name).unlink(missing_ok=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


#: How much of each end of a file its fingerprint reads: cheap for a weights file of many GB, and
#: a file of the same size from another export (other weights, same shapes) differs there.
_FINGERPRINT_BYTES = 1 << 20


def fingerprint(path: Path | bytes) -> dict[str, Any]:
    """`{"bytes": size, "sha256_ends": digest}` of `path` (a file, or a file's bytes already read):
    its size and a SHA-256 of its first and last MiB (what the manifest records of each file, and
    a runner checks a weights file by)."""
    import hashlib

    digest = hashlib.sha256()
    if isinstance(path, (bytes, bytearray, memoryview)):
        data = memoryview(path)
        digest.update(data[:_FINGERPRINT_BYTES])
        if len(data) > _FINGERPRINT_BYTES:
            digest.update(data[max(_FINGERPRINT_BYTES, len(data) - _FINGERPRINT_BYTES):])
        return {"bytes": len(data), "sha256_ends": digest.hexdigest()}
    size = path.stat().st_size
    with open(path, "rb") as stream:
        digest.update(stream.read(_FINGERPRINT_BYTES))
        if size > _FINGERPRINT_BYTES:
            stream.seek(max(_FINGERPRINT_BYTES, size - _FINGERPRINT_BYTES))
            digest.update(stream.read(_FINGERPRINT_BYTES))
    return {"bytes": size, "sha256_ends": digest.hexdigest()}
