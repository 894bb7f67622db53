"""ExecuTorch artifacts on disk: `HfExecutorchProgram` (an `ExecutorchProgramManager` whose `save`
writes its `.ptd` too), its files written, and a saved `.pte` read back for the runner."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from executorch.exir import ExecutorchProgramManager

from ...capture.record import record_of
from ...folder.manifest import FileBytes
from ...folder.storage import checked_destination, fingerprint, staged_files
from .compat import data_payloads
from .external import write_ptd

__all__ = ["HfExecutorchProgram", "PteBuffer", "write_executorch"]


class HfExecutorchProgram(ExecutorchProgramManager):
    """An `ExecutorchProgramManager` (the same object, same API) made by `ExecutorchExporter`,
    whose `save` writes the program's weights file beside it when its weights live outside it."""

    @classmethod
    def wrap(cls, program: ExecutorchProgramManager) -> HfExecutorchProgram:
        """`program` itself, as an `HfExecutorchProgram` (its class changed: lowering it again to
        build a new manager would serialize the whole program a second time)."""
        program.__class__ = cls
        return program

    def save(self, path: str | os.PathLike, *, overwrite: bool = True) -> list[Path]:
        """Write the program to `path` (`model.pte`) and, when its weights live outside it
        (`ExecutorchConfig(external_weights=True)`), their named-data file `model.ptd` beside it,
        atomically (nothing is left when a write fails, and what was there stays); return the
        files written.

        A program already at `path` is replaced, as `ExecutorchProgramManager.save` does; so is its
        `model.ptd`, which is removed when this program keeps its weights inside (it held the
        previous program's weights). Nothing else in the folder is touched.

        A `.pte` with a `.ptd` loads with both: `_load_for_executorch("model.pte",
        data_path="model.ptd")` (`executorch.extension.pybindings.portable_lib`) or the C++
        `Module("model.pte", "model.ptd")`; executorch 1.4.1's `Runtime.load_program` takes no data file.

        Args:
            overwrite: `True` (the default) replaces an existing program, as the runtime's own
                `save` does; `False` refuses an existing `path` (or `.ptd`) with `SerializationError`,
                for a caller that must not lose a file. Kept from hfexport's first version, which
                refused by default.
        """
        if Path(path).suffix != ".pte":
            raise ValueError(f"an ExecuTorch program is saved as a .pte file; got {Path(path).name!r} (save it as "
                             f"{Path(path).with_suffix('.pte').name!r})")
        pte = checked_destination(path, overwrite=overwrite, what="the ExecuTorch program")
        with staged_files(pte, overwrite=overwrite, companions=(pte.with_suffix(".ptd").name,)) as staging:
            written = write_executorch(self, staging / pte.stem)
        return [pte.parent / file.name for file in written]


def write_executorch(program: Any, stem: Path) -> list[Path]:
    """Write `program` as `<stem>.pte`, streamed to its file, and, when its weights live outside it,
    `<stem>.ptd` (its name and fingerprint go in the program's record, hence the manifest), in a
    folder the caller stages; return the files."""
    written = [write_pte(program, stem.with_suffix(".pte"))]
    if data_payloads(program):
        ptd = write_ptd(program, stem.with_suffix(".ptd"))
        record_of(program).details["external_weights"].update(file=ptd.name, **fingerprint(ptd))
        written.append(ptd)
    return written


class PteBuffer:
    """A saved `.pte` program, as the runner loads it (`buffer`, like `ExecutorchProgramManager`),
    read once; when its weights live outside it, private copies of the program and its `.ptd`
    (`data_path`), written from the checked bytes, which the runtime maps (an export folder's
    `.ptd` of many GB is not held whole in memory beside the weights XNNPACK packs from it).

    Args:
        buffer: the program's bytes.
        path: the `.pte` it was read from (for messages).
        data_path: the private copy of the `.ptd` holding its weights (the program's copy beside
            it), or None where the program keeps its weights.
        copies: the private folder holding the copies (removed when the buffer is collected).
    """

    def __init__(self, buffer: bytes, path: Path | None = None, data_path: Path | None = None, copies: Any = None):
        self.buffer = buffer
        self.path = path
        self.data_path = data_path
        self._copies = copies

    @classmethod
    def of(cls, files: list[FileBytes]) -> PteBuffer:
        """The program in `files` (the `.pte` first, its `.ptd` among the others when it has one)."""
        import tempfile

        program = files[0]
        data = next((f for f in files[1:] if f.path.suffix == ".ptd"), None)
        if data is None:
            return cls(program.data, program.path)
        copies = tempfile.TemporaryDirectory(prefix="hfexport-executorch-")
        (Path(copies.name) / program.name).write_bytes(program.data)
        return cls(program.data, program.path, data.copy_to(Path(copies.name)), copies)

    @property
    def program_copy(self) -> Path | None:
        """The private copy of the program beside `data_path` (None without a `.ptd`)."""
        return self.data_path.parent / self.path.name if self.data_path is not None and self.path else None


def write_pte(program: Any, path: Path) -> Path:
    """Write `program` (an `ExecutorchProgramManager`) to `path` in a folder the caller stages."""
    with open(path, "wb") as stream:
        program.write_to_file(stream)
    return path
