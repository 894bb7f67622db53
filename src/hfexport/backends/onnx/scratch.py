"""An export's ONNX weights written to disk once: the fusions' load check, validation's session and
the folder's `.data` file all take the same scratch file.

Before, each of the three wrote the model's weights again (`onnx_ir.save` tensor by tensor): on the
1.25 GB Llama, 16 s of a profiled 48 s CLI export (`bench/RESULTS.md`, "Weights written once").
Here a tensor written once is remembered (by identity, for as long as it lives) with the place it
was written to; a later scratch model writes only its proto beside those files, and the folder
links the file (`os.link`; copied where the folder is on another file system) when it holds exactly
the model's external weights.

Nothing about the model changes: its tensors stay what they were (torch's, in memory or mapped
from the checkpoint). The proto written for ONNX Runtime names `ir.ExternalTensor`s in place of the
tensors only while it is written. A scratch file is removed when the last tensor written to it is
gone, and the folder holding them when the process exits.

# NOTE: an `ir.Tensor` is immutable, but torch.onnx's `TorchTensor` (torch 2.13) wraps the model's
# own parameter, which a caller may change in place between the export and `save` (the program
# then holds the new values, as torch.onnx's own `save` would write them). Such a tensor is taken
# from its scratch file only while its torch version counter and data pointer are the ones it was
# written with: an in-place op under `no_grad` or on a `detach()`ed alias bumps the counter, so the
# tensor is written again. A write through `.data` is invisible to the counter (torch's documented
# escape from autograd's tracking) and is not seen.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["scratch_model", "scratch_files", "save_linked", "sweep_abandoned"]

logger = logging.getLogger("hfexport")

#: `onnx_ir.save`'s `size_threshold_bytes`: a tensor of more bytes is external, smaller ones stay in
#: the proto (onnx_ir 1.1.0, `external_data.unload_from_model`: `nbytes > size_threshold_bytes`)
THRESHOLD = 256
#: what the writer holds in memory at once (tensors materialised for writing)
_IN_FLIGHT = 64 * 2**20
#: the most bytes of a strided tensor copied at once to be written (`_Contiguous`).
# NOTE: 4 MB blocks wrote the 1.25 GB Llama's scratch file faster (1.36-1.40 s against 1.87-2.21 s)
# but made onnxruntime-genai's load of the folder in the same process, the runner check, 0.4-0.6 s
# slower (its system time 0.2 -> 0.6-0.9 s: page faults; the same in a process of its own); the
# whole export's wall time came out the same or 0.1 s longer. Measured, not explained further than
# the allocator's state the blocks leave (glibc's mmap threshold follows the largest block freed).
_BLOCK = 16 * 2**20

_lock = threading.Lock()
_root: str | None = None
_names = itertools.count()
#: id(tensor) -> (the `ir.ExternalTensor` naming where that tensor was written, its `_stamp` then)
_written: dict[int, tuple[Any, Any]] = {}
#: scratch file name -> how many living tensors it holds
_holders: dict[str, int] = {}


@contextlib.contextmanager
def scratch_model(model: Any) -> Iterator[str]:
    """A context giving the path of `model` (an ONNX IR model) written for ONNX Runtime to open,
    its weights external: those written before are named where they are, the rest written now to
    one new file. The proto is removed on leaving the context (ONNX Runtime reads it when the session
    is made, and maps the weights, which stay). Open it with `scratch_session_options()`
    (`artifact.py`): prepacking off, so the weights stay mapped rather than copied."""
    import onnx_ir as ir

    external = _external_values(model)
    _write_missing([value.const_value for value in external])
    path = os.path.join(_folder(), f"model-{next(_names)}.onnx")
    with _named_external(external, lambda written: written):
        ir.save(model, path)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def scratch_files(model: Any) -> tuple[str, ...]:
    """The scratch files holding `model`'s weights (what ONNX Runtime maps for a scratch model)."""
    written = [_remembered(value.const_value) for value in _external_values(model)]
    return tuple(sorted({str(tensor.path) for tensor in written if tensor is not None}))


def save_linked(model: Any, path: Path) -> list[Path] | None:
    """Save `model` to `path` with its weights in `<path>.data` taken from its scratch file (linked,
    or copied where `path` is on another file system) and return the two files, when one scratch
    file holds exactly the weights the model saves externally, laid end to end; None otherwise (the
    caller writes them)."""
    import onnx_ir as ir

    source = _linked_source(model)
    if source is None:
        return None
    external = _external_values(model)
    data = path.with_name(f"{path.name}.data")
    _link_or_copy(source, data)
    try:
        with _named_external(external, lambda tensor: _renamed(tensor, data)):
            ir.save(model, path)
    except BaseException:
        data.unlink(missing_ok=True)
        raise
    return [path, data]


def _linked_source(model: Any) -> str | None:
    """The scratch file `save_linked` takes as `model`'s `.data`: the one file holding exactly the
    weights `model` saves externally, laid end to end; None where there is none."""
    written = [_remembered(value.const_value) for value in _external_values(model)]
    if not written or any(tensor is None for tensor in written):
        return None
    source = {str(tensor.path) for tensor in written}
    spans = sorted({(tensor.offset, tensor.length) for tensor in written})
    if len(source) != 1 or len(spans) != len({id(t) for t in written}) or not _end_to_end(spans, next(iter(source))):
        return None
    return next(iter(source))


def _external_values(model: Any) -> list[Any]:
    """The initializers `onnx_ir.save` would write to an external file (every graph's, as its
    `unload_from_model` takes them)."""
    return [value for graph in model.graphs() for value in graph.initializers.values()
            if value.const_value is not None and value.const_value.nbytes > THRESHOLD]


def _write_missing(tensors: list[Any]) -> None:
    """Write the `tensors` not yet in a scratch file to a new one, and remember where each went."""
    from onnx_ir.external_data import convert_tensors_to_external

    missing = list({id(t): t for t in tensors if _remembered(t) is None}.values())
    if not missing:
        return
    name = f"weights-{next(_names)}.data"
    # `_Contiguous.tofile` reads a read-only view through torch, which warns of it: silenced once
    # around the writer (`catch_warnings` sets the process's filters, not a thread's)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        placed = convert_tensors_to_external([_Contiguous.of(t) for t in missing], _folder(), name,
                                             max_in_flight_bytes=_IN_FLIGHT)
    with _lock:
        _holders[name] = len(missing)
        for tensor, external in zip(missing, placed, strict=True):
            # a tensor written again (changed in place) keeps its count in the older file too, whose
            # finalizer (registered then) takes it off when the tensor goes
            _written[id(tensor)] = (external, _stamp(tensor))
            weakref.finalize(tensor, _forget, id(tensor), name)


class _Contiguous:
    """A tensor as the writer takes it, whose values are a strided numpy view (onnxscript's folded
    `Transpose` of a weight is `array.T`): its bytes laid out by torch's copy before `tofile`.

    numpy's `tofile` of a transposed view walks it element by element: 0.30 s for a 64 MB fp32
    matrix against 0.05 s for torch's `contiguous()` copy (the 1.25 GB Llama's write 4.9 -> 3.3 s).
    The bytes written are the same (`ir.Tensor.tofile` writes `numpy()`'s, C order, for the plain
    dtypes taken here; packed and non-native ones go as they are).

    A block of a transposed matrix's rows is a slab of the matrix's columns: torch copies a strided
    block element by element (1.3-1.5 ms a MB for a 5632 x 2048 or 32000 x 2048 fp32 weight), and
    its blocked transpose only takes a whole transposed matrix. So such a block is copied as the
    matrix's rows first (numpy, a short run of bytes a row) and then transposed whole by torch:
    0.44-0.57 ms a MB (measured on this project's 2-CPU machine, `bench/RESULTS.md`)."""

    #: numpy dtypes `torch.from_numpy` takes, written by `ir.Tensor` unpacked (one value an item)
    _PLAIN = frozenset("?bBhHiIlLqefd")

    def __init__(self, tensor: Any) -> None:
        self._tensor = tensor

    @classmethod
    def of(cls, tensor: Any) -> Any:
        """`tensor`, wrapped where its values are a strided view of a plain dtype."""
        import numpy as np

        raw = getattr(tensor, "raw", None)
        if (isinstance(raw, np.ndarray) and raw.ndim and not raw.flags.c_contiguous
                and raw.dtype.char in cls._PLAIN and raw.dtype.isnative and raw.nbytes == tensor.nbytes):
            return cls(tensor)
        return tensor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tensor, name)

    def tofile(self, file: Any) -> None:
        import numpy as np
        import torch

        raw = self._tensor.raw
        # in blocks of rows (C order is the blocks' bytes end to end), so that a 250 MB head is not
        # copied whole beside the model
        rows = max(1, _BLOCK // max(1, raw[:1].nbytes))
        transposed = raw.ndim == 2 and rows < len(raw) and raw.T.flags.c_contiguous
        for start in range(0, len(raw), rows):
            block = raw[start:start + rows]
            if transposed:  # the matrix's column slab as its rows, then torch's blocked transpose
                block = torch.from_numpy(np.ascontiguousarray(block.T)).t()
            else:  # a read-only view is only read (`_write_missing` silences torch's warning of it)
                block = torch.from_numpy(block)
            block.contiguous().numpy().tofile(file)


def _stamp(tensor: Any) -> Any:
    """What changes when a torch tensor behind `tensor` is written in place (see the module note)."""
    raw = getattr(tensor, "raw", None)
    version = getattr(raw, "_version", None)
    return None if version is None else (version, raw.data_ptr())


def _remembered(tensor: Any) -> Any:
    """The `ir.ExternalTensor` where `tensor` was written, if it holds its values still; else None."""
    entry = _written.get(id(tensor))
    if entry is None or entry[1] != _stamp(tensor):
        return None
    return entry[0]


def _forget(key: int, name: str) -> None:
    """A written tensor is gone: forget it, and remove its file when it held the last one."""
    with _lock:
        entry = _written.get(key)
        if entry is not None and Path(entry[0].path).name == name:
            del _written[key]
        _holders[name] -= 1
        last = _holders[name] == 0
        if last:
            del _holders[name]
    if last and _root is not None:
        with contextlib.suppress(OSError):
            os.remove(os.path.join(_root, name))


@contextlib.contextmanager
def _named_external(values: list[Any], name: Any) -> Iterator[None]:
    """`values` hold `name(where each tensor was written)` while the block runs, their own tensors after."""
    tensors = [value.const_value for value in values]
    try:
        for value, tensor in zip(values, tensors):
            value.const_value = name(_written[id(tensor)][0])
        yield
    finally:
        for value, tensor in zip(values, tensors):
            value.const_value = tensor


def _renamed(tensor: Any, data: Path) -> Any:
    """`tensor` (an `ir.ExternalTensor`) at the same offset of `data`."""
    import onnx_ir as ir

    return ir.ExternalTensor(data.name, tensor.offset, tensor.length, tensor.dtype, shape=tensor.shape,
                             name=tensor.name, base_dir=str(data.parent))


def _end_to_end(spans: list[tuple[int, int]], path: str) -> bool:
    """Whether the (offset, length) `spans` cover the file at `path` exactly, without gaps."""
    end = 0
    for offset, length in spans:
        if offset != end:
            return False
        end = offset + length
    return end == os.path.getsize(path)


def _link_or_copy(source: str, destination: Path) -> None:
    """`destination` as a second name of `source` (no bytes written), or a copy where the two are on
    different file systems (or one without hard links); never over a file already there
    (`FileExistsError`: the callers write into a folder they staged, where none can be).

    A hard link shares the inode: safe here because a scratch file is never written again (a new
    write is a new file), and removing the scratch name leaves the folder's."""
    try:
        os.link(source, destination)
    except FileExistsError:
        raise
    except OSError:
        with open(source, "rb") as read, open(destination, "xb") as write:
            shutil.copyfileobj(read, write, 16 * 2**20)


#: the scratch folders' name prefix, in the system's temporary folder
_PREFIX = "hfexport-onnx-weights-"
#: the file each process holds locked (`flock`) in its scratch folder for as long as it lives
_LOCK = ".owner.lock"
#: what a scratch folder holds besides its lock: the weights files, the protos written beside them,
#: and a weights file's write in progress (onnx_ir 1.1.0 writes `.<name>.<random>/<name>`, then moves it)
_OURS = re.compile(r"(weights-\d+\.data|model-\d+\.onnx|\.weights-\d+\.data\.\w+)\Z")
#: this process's lock, open (and so held) until it exits
_held: Any = None


def _folder() -> str:
    """The process's scratch folder, made on first use and removed at exit; the folders of processes
    that died without their exit (killed: a multi-GB weights file each) removed first."""
    global _root, _held
    with _lock:
        if _root is None:
            sweep_abandoned()
            _root = tempfile.mkdtemp(prefix=_PREFIX)
            _held = _locked(_root)
            atexit.register(_remove, _root, _held)
        return _root


def _remove(folder: str, lock: Any) -> None:
    """At exit: the scratch `folder` removed, then its `lock` closed (held until the folder is gone;
    left to the interpreter's teardown, the open file was reported as a ResourceWarning)."""
    shutil.rmtree(folder, ignore_errors=True)
    if lock is not None:
        lock.close()


def _abandoned_contents(folder: str) -> list[str] | None:
    """What a sweep removes from the scratch `folder`, its lock last: every entry is one hfexport
    writes there (a regular file named as ours, or onnx_ir's in-progress folder holding only the
    weights file it was writing); None where anything else is there, or the lock is not."""
    names = os.listdir(folder)
    if _LOCK not in names:
        return None
    doomed: list[str] = []
    for name in names:
        path = os.path.join(folder, name)
        if name == _LOCK or (_OURS.match(name) and not name.startswith(".")):
            if not stat.S_ISREG(os.lstat(path).st_mode):
                return None
            if name != _LOCK:
                doomed.append(path)
        elif _OURS.match(name) and stat.S_ISDIR(os.lstat(path).st_mode):
            written = name[1:].rsplit(".", 1)[0]  # `.weights-N.data.<random>` holds `weights-N.data`
            inner = os.listdir(path)
            if inner == [written] and stat.S_ISREG(os.lstat(os.path.join(path, written)).st_mode):
                doomed.append(os.path.join(path, written))
            elif inner:
                return None
            doomed.append(path)
        else:
            return None
    return [*doomed, os.path.join(folder, _LOCK)]


def _locked(folder: str) -> Any:
    """`folder`'s lock file, open and locked for this process (`flock`: released when the process
    dies, however it dies); None where the platform has no `flock` (the folder is then never swept).
    Locked under another name, then renamed: a sweep never finds the lock free before it is taken."""
    try:
        import fcntl
    except ImportError:  # Windows
        return None
    taking = os.path.join(folder, f"{_LOCK}.taking")  # not a name a sweep removes
    handle = open(taking, "a")  # noqa: SIM115 - held open for the process's life
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(taking, os.path.join(folder, _LOCK))
    return handle


def sweep_abandoned(root: str | None = None) -> list[str]:
    """Remove the scratch folders under `root` (the temporary folder) that a dead process left: a
    folder is removed only when it is this user's, named as hfexport names them, holds its lock file
    and nothing but what hfexport writes there, and its lock is free (its process is gone: a live
    one holds it, in any PID namespace on this machine). Return the folders removed.

    # NOTE: why. The folder is removed at exit (`atexit`); a process killed (SIGKILL, a batch's
    # timeout, the OOM killer) leaves it, with the export's weights in it: tens of GB for an 8B model,
    # in /tmp, found by nobody. Folders without the lock (hfexport before it) are left as they are.
    """
    try:
        import fcntl
    except ImportError:
        return []
    root = root or tempfile.gettempdir()
    removed = []
    try:
        entries = [entry for entry in os.scandir(root) if entry.name.startswith(_PREFIX)]
    except OSError:
        return []
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            doomed = _abandoned_contents(entry.path)
            if doomed is None:
                continue
            with open(os.path.join(entry.path, _LOCK)) as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # its process lives
                for path in doomed:  # the files first, then the folders they were in
                    (os.rmdir if os.path.isdir(path) else os.remove)(path)
            os.rmdir(entry.path)
            removed.append(entry.path)
        except OSError as error:  # another process sweeping it, a file added meanwhile: left
            logger.debug("scratch folder %s left: %s", entry.path, error)
    return removed
