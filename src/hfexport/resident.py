"""Clean pages of mapped files out of this process's resident set, between two runs that each need
a model's weights: eager PyTorch's (a checkpoint transformers mapped) and a runtime's (a file the
runtime mapped).

# NOTE: why. Validation and the runner check run the eager model and the export one after the
# other, and each maps its weights from a file: safetensors maps the checkpoint (private, read
# only in practice), ONNX Runtime the external data `scratch.scratch_model` wrote. Once touched,
# both sets of pages stay in the resident set, so the export's peak RSS held the weights twice
# over (3.1 GB for a 1.25 GB Llama's ONNX package, the onnxruntime-genai builder 2.0 GB:
# bench/RESULTS.md). A clean page of a file mapping is the file's: `madvise(MADV_DONTNEED)` takes
# it out of the process's page tables and the next touch maps it again from the page cache (a
# minor fault; from the disk only if the kernel reclaimed it meanwhile), so the weights are
# resident once at a time. A mapping with a page this process wrote (a private mapping's written
# page is its own copy, counted as `Anonymous` in smaps) is never advised: DONTNEED would drop the
# write. A page of the page cache not yet written back to the file (`Private_Dirty` of a file ONNX
# Runtime maps right after hfexport wrote it) is the page cache's, kept. Linux only
# (`/proc/self/maps`, and `/proc/self/pagemap` or `smaps` for the written pages); elsewhere nothing
# is dropped.
#
# Whether a mapping holds a written page is read from `/proc/self/pagemap` for that mapping's
# range alone: `smaps` walks every mapping of the process (~70 ms once a 1.25 GB checkpoint is
# resident, and validation drops pages 8 times an export).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["drop_clean_pages", "weight_storages"]

logger = logging.getLogger("hfexport")

_MADV_DONTNEED = 4


@dataclasses.dataclass
class _Mapping:
    start: int
    end: int
    path: str
    written: bool  # a page of it is this process's copy, not the file's (never advised)


def _mappings(*, with_pages: bool) -> list[_Mapping]:
    """This process's file mappings, in address order: from `/proc/self/maps` (a cheap read), or
    from `/proc/self/smaps` with whether a page of each was written (`with_pages`; ~15 ms with
    torch and ONNX Runtime loaded)."""
    found: list[_Mapping] = []
    current: _Mapping | None = None
    with open("/proc/self/smaps" if with_pages else "/proc/self/maps") as table:
        for line in table:
            head = line.split(None, 5)
            if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                start, end = (int(part, 16) for part in head[0].split("-"))
                path = head[5].strip() if len(head) == 6 else ""
                current = _Mapping(start, end, path, False) if path.startswith("/") else None
                if current is not None:
                    found.append(current)
            elif current is not None and head[0] == "Anonymous:" and int(head[1]) > 0:
                current.written = True
    return found


#: `/proc/self/pagemap` entry bits (the kernel's Documentation/admin-guide/mm/pagemap.rst)
_PRESENT, _SWAPPED, _FILE_OR_SHARED = 1 << 63, 1 << 62, 1 << 61
#: page-table entries read at once (8 bytes each: 8 MB, 4 GB of mapping with 4 KiB pages)
_ENTRIES_AT_ONCE = 1 << 20


def _has_written_page(mapping: _Mapping) -> bool | None:
    """Whether a page of `mapping` is this process's own (written: a present page that is not the
    file's, or one swapped out), from its page-table entries in `/proc/self/pagemap`; None where
    that file cannot be read."""
    import mmap

    import numpy as np

    page = mmap.PAGESIZE
    first, count = mapping.start // page, (mapping.end - mapping.start) // page
    try:
        with open("/proc/self/pagemap", "rb", buffering=0) as table:
            for at in range(0, count, _ENTRIES_AT_ONCE):
                table.seek((first + at) * 8)
                want = min(_ENTRIES_AT_ONCE, count - at) * 8
                raw = table.read(want)
                if len(raw) != want:
                    return None
                entries = np.frombuffer(raw, dtype="<u8")
                own = (entries & np.uint64(_PRESENT | _FILE_OR_SHARED)) == np.uint64(_PRESENT)
                if own.any() or (entries & np.uint64(_SWAPPED)).any():
                    return True
    except OSError:
        return None
    return False


def weight_storages(module: Any) -> list[tuple[int, int]]:
    """`(address, bytes)` of the storages of `module`'s parameters and buffers (CPU tensors)."""
    spans = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        if tensor.device.type != "cpu":
            continue
        try:
            storage = tensor.untyped_storage()
            spans[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, NotImplementedError, TypeError):  # a wrapper subclass (torchao's) has no data of its own
            continue
    return [(address, size) for address, size in spans.items() if address and size]


def drop_clean_pages(*, spans: Iterable[tuple[int, int]] = (), paths: Iterable[str | os.PathLike] = ()) -> int:
    """Take out of the resident set the pages of the file mappings that hold any of `spans`
    (`(address, bytes)`, e.g. `weight_storages(model)`) or map one of `paths`, each mapping whole,
    where no page of it was written (see the module note); return the bytes advised (0 off Linux,
    or where nothing is a clean file mapping)."""
    if not sys.platform.startswith("linux"):
        return 0
    spans, names = list(spans), {os.path.realpath(p) for p in paths}
    if not spans and not names:
        return 0
    def wanted(mapping: _Mapping) -> bool:
        return mapping.path in names or any(mapping.start <= address < mapping.end for address, _ in spans)

    try:  # most calls find nothing mapped (a model built in memory): the cheap table first
        chosen = [m for m in _mappings(with_pages=False) if wanted(m)]
        if not chosen:
            return 0
        written = [_has_written_page(m) for m in chosen]
        if None in written:  # no page table to read here: smaps says it for every mapping
            chosen = [m for m in _mappings(with_pages=True) if wanted(m)]
        else:
            for mapping, was_written in zip(chosen, written):
                mapping.written = was_written
    except OSError:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    dropped = 0
    for mapping in chosen:
        if mapping.written:
            continue
        if libc.madvise(ctypes.c_void_p(mapping.start), mapping.end - mapping.start, _MADV_DONTNEED) == 0:
            dropped += mapping.end - mapping.start
        else:
            logger.debug("madvise(DONTNEED) on %s failed: errno %d", mapping.path, ctypes.get_errno())
    return dropped
