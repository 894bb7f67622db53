"""The folder an export is written to: one writer at a time, and nothing replaced that hfexport did not write.

```
with claimed_folder(target, overwrite=..., source=...):   # lock .NAME.hfexport-lock, check, clean stale staging
    ... the slow part: load, export, validate ...
    with staged_folder(target, overwrite=...) as staging:  # .NAME.partial-PID-xxxx beside target
        ... write the export into staging ...
    # on success staging takes target's place; the earlier export's own files are deleted, nothing else
```
The rules (`check_output_folder`), checked before any work and again under the lock at the end:
- a new or empty folder takes the export;
- a folder holding files takes it only with `overwrite`, and only when it holds an hfexport export
  (its `manifest.json`) and nothing that export did not write (`manifest.owned_files`);
- never, whatever it holds: the working folder, the home folder, a filesystem root, an ancestor of
  any of them, and the model's own folder (and its ancestors);
- never a path nothing can be written at (`check_writable`, which every output path of hfexport
  goes through): under a file, a link to nothing, a folder you cannot write in, a file in its place.

# NOTE: why a lock file beside the target rather than in a temporary folder: two machines writing
# one shared folder see the same lock where the filesystem supports locks, and two exports to
# different folders of one parent do not wait for each other (`export-many` writes DIR/model/format).
# Why our own lock (`_FolderLock`, POSIX `flock`) rather than filelock's: filelock 4.3 leaves its
# lock file behind, and an export that failed would leave a file in the user's folder. The lock
# file is deleted while still held, and a writer that took the lock checks that the file it locked
# is still the one at that path (a releasing writer may have deleted it in between), the usual
# protocol for removable lock files. Where there is no `fcntl` (Windows) filelock's lock is used and
# its file stays. A staging folder is named with its writer's PID, so the next writer (holding the
# lock) removes those of dead processes (a SIGKILL).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from ..errors import OutputFolderError
from .manifest import owned_files
from .storage import current_umask

__all__ = ["WRITES", "check_output_folder", "check_writable", "claimed_folder", "folder_entries", "listing",
           "model_folder", "staged_folder"]

logger = logging.getLogger("hfexport")

#: The folders this process holds, each with the thread that holds it: a job claims its folder and
#: `bundle.save_folder` inside it claims it again (the same thread); another thread is refused as another
#: process would be.
_CLAIMS: dict[Path, int] = {}
_SHOWN = 5


def model_folder(model: object) -> Path | None:
    """The local folder a model spec (a path, a `.gguf` file) or a loaded model came from, if any."""
    spec = model if isinstance(model, (str, os.PathLike)) else getattr(getattr(model, "config", None),
                                                                       "_name_or_path", None)
    if not isinstance(spec, (str, os.PathLike)) or not str(spec) or not os.path.exists(spec):
        return None
    path = Path(spec).resolve()
    return path if path.is_dir() else path.parent


def check_output_folder(target: Path, *, overwrite: bool, source: Path | None = None,
                        example: str | None = None) -> None:
    """Refuse, with `OutputFolderError`, an output folder the export may not write (the module's rules)."""
    given, target = target, Path(target).resolve()
    new_folder = f"name a new folder for the export (e.g. -o {example or target / 'export'})"
    if why := _never_replaced(target, source):
        raise OutputFolderError(f"{target} is {why}: an export is written into a folder of its own and never "
                                "replaces this one", remedy=new_folder)
    check_writable(given, "the export", writes="folder", new_name=Path(example).name if example else "export")
    if not target.exists() or not any(target.iterdir()):
        return
    owned, why_not = owned_files(target)
    if owned is None:
        raise OutputFolderError(f"{target} holds files that are not an hfexport export "
                                f"({listing(folder_entries(target))}; {why_not}); hfexport never deletes files it "
                                "did not write",
                                remedy=f"{new_folder}; --overwrite replaces only an earlier hfexport export")
    others = folder_entries(target) - owned - _folders_of(owned)
    if others:
        raise OutputFolderError(f"{target} holds an earlier hfexport export and files it did not write "
                                f"({listing(others)}); hfexport never deletes files it did not write",
                                remedy=f"move those files out of {target}, or {new_folder}")
    if not overwrite:
        raise OutputFolderError(f"{target} already holds an earlier hfexport export "
                                f"({listing(folder_entries(target))})",
                                remedy=f"pass --overwrite (overwrite=True) to replace it, or {new_folder}")


#: What `check_writable` checks a path for: a file or a folder put in its place by a rename (the
#: folder it is in must be writable), a file written at its end (itself, once it exists), or a
#: folder that files are written into (itself, once it exists).
WRITES = ("file", "folder", "appended file", "into folder")


def check_writable(path: str | os.PathLike, what: str, *, writes: str, new_name: str, option: str = "-o") -> None:
    """Refuse, with `OutputFolderError`, a `path` where `what` cannot be written, before any work: a
    path under a file, a link to nothing (there or above), a folder you cannot write it in, a file
    where a folder is wanted or a folder where a file is, a file whose folder does not exist (a
    folder's missing parents are created).

    Args:
        writes: one of `WRITES`: what is written at `path`.
        new_name: the name to suggest in a remedy instead of the refused one (`llama-dynamo`, `coverage.md`).
        option: the command-line option that named `path`.
    """
    if writes not in WRITES:
        raise ValueError(f"writes is one of {WRITES}; got {writes!r}")
    path = Path(os.path.abspath(path))  # not resolved: a link at the path is what is checked
    problem, remedy = _path_problem(path, writes, new_name, option)
    if problem:
        raise OutputFolderError(f"cannot write {what} at {path}: {problem}", remedy=remedy)


def _path_problem(path: Path, writes: str, new_name: str, option: str) -> tuple[str | None, str | None]:
    """`(what is wrong with `path` for `check_writable`, the remedy)`, or `(None, None)`."""
    elsewhere = f"name another path ({option})"
    for place in (path, *path.parents):  # nearest first: the first link to nothing, or what exists
        if os.path.islink(place) and not os.path.exists(place):
            return (f"{place} is a link to {os.readlink(place)}, which does not exist",
                    f"create what the link points to, remove the link, or {elsewhere}")
        if os.path.exists(place):  # False, not an error, where a folder above cannot be searched
            break
    if place != path and not place.is_dir():
        return (f"{place} is a file, not a folder",
                f"name a path outside that file ({option} {place.parent / path.name})")
    is_file = writes in ("file", "appended file")
    if place != path.parent and place != path and is_file:  # a file's folder is not created for it
        return f"folder {path.parent} does not exist", f"create it first, or {elsewhere}"
    if place == path and is_file and path.is_dir():
        return "it is a folder", f"name a file in it ({option} {path / new_name})"
    if place == path and not is_file and not path.is_dir():
        return "it is a file, not a folder", f"name a new folder ({option} {path.parent / new_name})"
    if place != path:  # to be created in `place`
        needed = [place]
    elif writes in ("into folder", "appended file"):
        needed = [path]
    else:  # put in place by a rename in its folder; an existing file or folder is itself written
        needed = [path.parent, path]
    for folder in needed:
        if not os.access(folder, os.W_OK | (os.R_OK | os.X_OK if folder.is_dir() else 0)):
            return (f"you cannot write {'in ' if folder.is_dir() else ''}{folder}",
                    f"{elsewhere} where you can write, or get write access to {folder}")
    return None, None


@contextlib.contextmanager
def claimed_folder(target: Path, *, overwrite: bool, source: Path | None = None,
                   example: str | None = None) -> Iterator[Path]:
    """Hold `target` as this process's output folder: check it (`check_output_folder`), create its
    missing parents, take its lock (another process writing it is an `OutputFolderError` at once)
    and remove its stale staging folders; on exit release the lock and, after a failure, remove the
    parents it created. A second claim by the thread that holds the folder (`bundle.save_folder` inside
    the export job) passes through.

    Yields:
        `target`, resolved.
    """
    given, target = target, Path(target).resolve()  # the path as given: a link there is checked
    if _CLAIMS.get(target) == threading.get_ident():
        yield target
        return
    busy = OutputFolderError(f"another hfexport export is writing {target} now", remedy="wait for it to finish, or "
                             "name another folder (-o)")
    if target in _CLAIMS:
        raise busy
    check_output_folder(given, overwrite=overwrite, source=source, example=example)
    created = _make_parents(target.parent)
    lock = _FolderLock(target.parent / f".{target.name}.hfexport-lock")
    try:
        if not lock.acquire():  # flock: refused to another process, and to another thread of this one
            raise busy
        try:
            _CLAIMS[target] = threading.get_ident()
            check_output_folder(target, overwrite=overwrite, source=source, example=example)  # under the lock
            _remove_stale_staging(target)
            yield target
        finally:
            _CLAIMS.pop(target, None)
            lock.release()
    except BaseException:
        for folder in reversed(created):  # only the folders this claim made, and only while empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


@contextlib.contextmanager
def staged_folder(target: Path, *, overwrite: bool, source: Path | None = None) -> Iterator[Path]:
    """Yield a new staging folder beside `target` (claimed for the duration); when the block ends
    without error it takes `target`'s place, an earlier export there is removed file by file (only
    what it wrote), and the staging folder is gone either way."""
    with claimed_folder(target, overwrite=overwrite, source=source) as target:
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-{os.getpid()}-", dir=target.parent))
        try:
            yield staging
            _move_into_place(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _move_into_place(staging: Path, target: Path) -> None:
    os.chmod(staging, target.stat().st_mode & 0o7777 if target.is_dir() else 0o777 & ~current_umask())
    if not target.exists():
        staging.rename(target)
        return
    # a last check under the lock: files may have appeared in target while the export ran
    check_output_folder(target, overwrite=True)
    owned = owned_files(target)[0] or set()
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-{os.getpid()}-", dir=target.parent))
    target.rename(old / "export")
    try:
        staging.rename(target)
    except BaseException:  # the earlier export goes back where it was
        (old / "export").rename(target)
        old.rmdir()
        raise
    _remove_owned(old / "export", owned, target)
    with contextlib.suppress(OSError):
        old.rmdir()


class _FolderLock:
    """An exclusive, non-blocking lock on the file `path`, created when taken and deleted when
    released (the module's NOTE)."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None
        self._fallback = None

    def acquire(self) -> bool:
        """Take the lock; False when another process holds it."""
        try:
            import fcntl
        except ImportError:  # no flock: filelock's lock, whose file stays
            from filelock import FileLock, Timeout

            self._fallback = FileLock(self.path, timeout=0)
            try:
                self._fallback.acquire()
            except Timeout:
                return False
            return True
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    self._fd = fd
                    return True
            except FileNotFoundError:
                pass
            os.close(fd)  # locked a file its holder deleted on release: take the new one

    def release(self) -> None:
        """Delete the lock file, then let go of the lock."""
        if self._fallback is not None:
            self._fallback.release()
            return
        if self._fd is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None


def _remove_owned(folder: Path, owned: set[str], target: Path) -> None:
    """Delete the files `owned` names in `folder`, then the folders left empty; keep anything else
    (with a warning naming where it is)."""
    for relative in owned:
        with contextlib.suppress(FileNotFoundError):
            (folder / relative).unlink()
    for path in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir()
    try:
        folder.rmdir()
    except OSError:
        logger.warning("%s holds files the earlier export in %s did not write (they appeared while the new export "
                       "ran); they were kept there", folder, target)


def _never_replaced(target: Path, source: Path | None) -> str | None:
    """Why `target` must never be an export's folder, or None."""
    named = {Path.cwd().resolve(): "the working folder", Path.home().resolve(): "your home folder"}
    if source is not None:
        named[Path(source).resolve()] = "the model's own folder"
    if target == Path(target.anchor):
        return "a filesystem root"
    for folder, what in named.items():
        if target == folder:
            return what
        if folder.is_relative_to(target):
            return f"an ancestor of {what} ({folder})"
    return None


def folder_entries(folder: Path) -> set[str]:
    """Every file, link and empty folder under `folder`, by relative path."""
    found = set()
    for path in folder.rglob("*"):
        if not path.is_dir() or path.is_symlink() or not any(path.iterdir()):
            found.add(path.relative_to(folder).as_posix())
    return found


def _folders_of(files: set[str]) -> set[str]:
    return {parent.as_posix() for f in files for parent in Path(f).parents if parent != Path(".")}


def listing(names: set[str]) -> str:
    """The first few of `names`, sorted, and how many more: what a refusal shows of a folder."""
    shown = sorted(names)[:_SHOWN]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more else "")


def _make_parents(folder: Path) -> list[Path]:
    """Create `folder` and its missing parents; return those created, outermost first."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()][::-1]
    for path in missing:
        with contextlib.suppress(FileExistsError):
            path.mkdir()
    return missing


def _remove_stale_staging(target: Path) -> None:
    """Remove the staging folders of dead processes beside `target` (a SIGKILL mid-save); say where
    an earlier export was left when a process died between its two renames."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(partial|old)-(\d+)-")
    for path in target.parent.iterdir():
        match = pattern.match(path.name)
        if not match or not path.is_dir() or _alive(int(match.group(2))):
            continue
        if match.group(1) == "partial":
            shutil.rmtree(path, ignore_errors=True)
        else:
            logger.warning("%s holds what an interrupted export left of the earlier export in %s; it was kept",
                           path, target)


def _alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill(pid, 0) ends the process there: count every writer as alive
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
