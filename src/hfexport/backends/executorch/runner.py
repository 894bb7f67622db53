"""`ExecutorchRunner`: runs a program in the ExecuTorch Python runtime, inputs in dict order."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from ...runner import Runner

__all__ = ["ExecutorchRunner"]


class ExecutorchRunner(Runner):
    runtime = "ExecuTorch runtime (Python bindings)"

    def __init__(self, artifact, record):
        super().__init__(artifact, record)
        from executorch.runtime import Runtime

        program = Runtime.get().load_program(artifact.buffer)
        self.method = program.load_method("forward")

    @property
    def precision(self) -> str:
        return "f32 (as exported)"

    def run(self, inputs: dict[str, Any]) -> list[torch.Tensor]:
        leaves = [leaf.contiguous() for leaf in pytree.tree_leaves(inputs) if isinstance(leaf, torch.Tensor)]
        return [out if isinstance(out, torch.Tensor) else torch.as_tensor(out) for out in self.method.execute(leaves)]
