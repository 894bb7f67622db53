"""`ExecutorchRunner`: runs a program in the ExecuTorch Python runtime, inputs in dict order.

A program whose weights live in a `.ptd` (`ExecutorchConfig.external_weights`) is opened with its
data file, both mapped: loaded from disk, from private copies of both files written from the
checked bytes (`PteBuffer`), after `external.check_data_file` has checked the `.ptd` is the one its
export wrote; in memory (validation before saving), from a scratch copy of both files.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from ...runner import Runner

__all__ = ["ExecutorchRunner"]


class ExecutorchRunner(Runner):
    """Runs a `.pte` program's `forward` method in ExecuTorch's Python runtime, inputs in the program's order."""
    runtime = "ExecuTorch runtime (Python bindings)"

    def __init__(self, artifact, record):
        super().__init__(artifact, record)
        from executorch.runtime import Runtime

        _register_kernels(record)
        if record.details.get("external_weights") is None:
            program = Runtime.get().load_program(artifact.buffer)
            self.method = program.load_method(record.details.get("method", "forward"))
        else:
            self.method = _forward_with_data(artifact, record)

    @property
    def precision(self) -> str:
        return "the program's own dtypes (as exported)"

    def run_flat(self, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
        return self._user_outputs(self.method.execute([leaf.contiguous() for leaf in leaves]))

    def bind_named(self, feed: dict[str, torch.Tensor]) -> Callable[[], dict[str, torch.Tensor]] | None:
        """`Runner.bind_named`: `execute` on the same list of `feed`'s tensors each call (the
        method reads them at each call; contiguous ones only, as `run_flat` would pass them)."""
        leaves = [feed[name] for name in self.record.input_names]
        if not all(leaf.is_contiguous() for leaf in leaves):
            return None
        execute, names, outputs_of = self.method.execute, self.record.output_names, self._user_outputs
        return lambda: dict(zip(names, outputs_of(execute(leaves))))

    def _user_outputs(self, outputs: list[Any]) -> list[torch.Tensor]:
        """The method's outputs in `record.output_names` order.

        A method whose graph writes into its inputs (a static cache) returns those writes first:
        [written cache x N, logits, cache x N] (the README's static-cache section). The user
        outputs are the last ones; a None output (an empty `hidden_states` entry) has no tensor.
        """
        skip = self.record.details.get("input_mutations", 0)
        return [out if isinstance(out, torch.Tensor) else torch.as_tensor(out) for out in outputs[skip:]
                if out is not None]


class _ModuleForward:
    """The `forward` method of an `ExecuTorchModule` (a program opened with its data file), called
    like `executorch.runtime.Method.execute`; `scratch` holds the files the module maps."""

    def __init__(self, module: Any, scratch: tempfile.TemporaryDirectory | None = None, method: str = "forward"):
        self.module = module
        self._scratch = scratch
        self.name = method

    def execute(self, inputs: list[Any]) -> list[Any]:
        """Run the method on `inputs`; its outputs, copied out of the runtime's memory."""
        return self.module.run_method(self.name, inputs)


def _forward_with_data(artifact: Any, record) -> _ModuleForward:
    """`forward` of a program whose weights live in a `.ptd`: a `PteBuffer` read from disk, opened
    from the private copies of the program and its `.ptd` (checked as copied, and against the
    record), or an `ExecutorchProgramManager` still in memory, written to a scratch folder first;
    either way the runtime maps the weights (the pybindings' in-memory loader takes the data as
    one `bytes`: a copy of every weight)."""
    from .artifact import PteBuffer, write_pte
    from .compat import load_module
    from .external import check_data_file, write_ptd

    if isinstance(artifact, PteBuffer):
        check_data_file(artifact, record.details["external_weights"], record.model_class)
        return _ModuleForward(load_module(str(artifact.program_copy), str(artifact.data_path)),
                              method=record.details.get("method", "forward"))
    scratch = tempfile.TemporaryDirectory(prefix="hfexport-executorch-")
    folder = Path(scratch.name)
    program, data = write_pte(artifact, folder / "model.pte"), write_ptd(artifact, folder / "model.ptd")
    return _ModuleForward(load_module(str(program), str(data)), scratch, record.details.get("method", "forward"))


#: Kernel libraries outside ExecuTorch's portable set, by the op namespace a program calls them in.
KERNEL_LIBRARIES = {"quantized_decomposed": "executorch.kernels.quantized",
                    "llama": "executorch.extension.llm.custom_ops.custom_ops"}


def _register_kernels(record) -> None:
    """Load the kernel libraries the program's ops need into the runtime (`record.details["kernel_libraries"]`).

    # NOTE: the Python runtime registers only the portable kernels; a quantized embedding
    # (`quantized_decomposed::embedding_4bit`) or ExecuTorch's LLM ops (`llama::custom_sdpa`)
    # load ("Missing operator", error 0x14) once their library's module is imported, which
    # registers its kernels (executorch 1.4.1). A C++ runner links the same libraries.
    """
    import importlib

    from ...errors import RuntimeLoadError

    for namespace in record.details.get("kernel_libraries", ()):
        if namespace not in KERNEL_LIBRARIES:  # a record from elsewhere: only the libraries hfexport names
            raise RuntimeLoadError(f"the program's record names the kernel library {namespace!r}, which is none of "
                                   f"hfexport's ({', '.join(KERNEL_LIBRARIES)})", model=record.model_class,
                                   remedy="export the model again with this hfexport")
        importlib.import_module(KERNEL_LIBRARIES[namespace])
