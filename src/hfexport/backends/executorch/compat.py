"""The ExecuTorch names outside its public API that this backend uses, in one place.

Each was read from executorch 1.4.1; `tests/backends/executorch/test_external_weights.py` fails the
day one of them disappears.
"""

from __future__ import annotations

from typing import Any

__all__ = ["data_payloads", "load_module"]


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

