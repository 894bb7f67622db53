"""The ExecuTorch names outside its public API that this backend uses, in one place.

Each was read from executorch 1.4.1; `tests/backends/executorch/test_external_weights.py` fails the
day one of them disappears.
"""

from __future__ import annotations

from typing import Any

__all__ = ["data_payloads", "load_module", "load_module_from_bytes"]


def data_payloads(program: Any) -> dict[str, Any]:
    """The named-data files `program` (an `ExecutorchProgramManager`) keeps outside its `.pte`,
    as `{tag: Cord}` (empty when its data all live in the `.pte`).

    Read from executorch 1.4.1 `exir/program/_program.py`: `ExecutorchProgramManager.__init__`
    serializes the `.ptd` payloads into `_tensor_data` (`serialize_for_executorch`); the only public
    reader is `write_tensor_data_to_file(outdir)`, which writes them (it asserts they exist).
    """
    return dict(getattr(program, "_tensor_data", None) or {})


def load_module(program_path: str, data_path: str) -> Any:
    """An `ExecuTorchModule` of the `.pte` at `program_path` with its weights in the `.ptd` at
    `data_path`, both memory-mapped.

    # NOTE: executorch 1.4.1's `executorch.runtime.Runtime.load_program` takes no data file (its
    # `Program.load_method` passes no `NamedDataMap`); `Runtime.load_program(..., data_path=...)`
    # came after 1.4.1 (pytorch/executorch#21982). Until then the pybindings' `_load_for_executorch`
    # (`extension/pybindings/pybindings.cpp`: `MmapDataLoader` for both files) is the Python entry
    # point ExecuTorch documents for a `.ptd`.
    """
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    return _load_for_executorch(program_path, data_path=data_path)


def load_module_from_bytes(program: bytes, data: bytes) -> Any:
    """An `ExecuTorchModule` of the program `program` with its weights in the `.ptd` bytes `data`:
    what a saved export is opened from, so that the bytes checked are the bytes run.

    # NOTE: executorch 1.4.1's pybindings (`extension/pybindings/pybindings.cpp`,
    # `_load_for_executorch_from_buffer(buffer, data_map_buffer)`): a `BufferDataLoader` over each
    # `bytes`, kept alive by the module.
    """
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    return _load_for_executorch_from_buffer(program, data_map_buffer=data)
