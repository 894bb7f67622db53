"""`ExecutorchRunner`: runs a program in the ExecuTorch Python runtime, inputs in dict order."""

from __future__ import annotations

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
        program = Runtime.get().load_program(artifact.buffer)
        self.method = program.load_method("forward")

    @property
    def precision(self) -> str:
        return "f32 (as exported)"

    def run_flat(self, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
        outputs = self.method.execute([leaf.contiguous() for leaf in leaves])
        # A method whose graph writes into its inputs (a static cache) returns those writes first:
        # [written cache x N, logits, cache x N] (the README's static-cache section). The user outputs are the last ones.
        skip = self.record.details.get("input_mutations", 0)
        return [out if isinstance(out, torch.Tensor) else torch.as_tensor(out) for out in outputs[skip:]
                if out is not None]  # a None output (an empty `hidden_states` entry) has no tensor


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

    for namespace in record.details.get("kernel_libraries", ()):
        importlib.import_module(KERNEL_LIBRARIES[namespace])
