"""`DynamoRunner`: runs an `ExportedProgram` through `.module()`."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from ...runner import Runner

__all__ = ["DynamoRunner"]


class DynamoRunner(Runner):
    """Runs an `ExportedProgram` through `.module()`, as a PyTorch user does."""
    runtime = "torch.export ExportedProgram.module()"

    def __init__(self, artifact, record):
        super().__init__(artifact, record)
        self.module = artifact.module()

    @property
    def precision(self) -> str:
        return "as exported (PyTorch eager kernels)"

    def run(self, inputs: dict[str, Any]) -> list[torch.Tensor]:
        """Run on forward kwargs (caches as objects): the program takes the forward's pytree."""
        with torch.no_grad():
            return [x for x in pytree.tree_leaves(self.module(**inputs)) if x is not None]

    def run_flat(self, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
        # The program takes the forward's pytree (a StaticCache object, ...): rebuild it from the
        # leaves. Its in-place cache writes land in these very tensors.
        args, kwargs = pytree.tree_unflatten(list(leaves), self.artifact.call_spec.in_spec)
        with torch.no_grad():
            return [x for x in pytree.tree_leaves(self.module(*args, **kwargs)) if x is not None]
