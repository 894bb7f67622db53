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
