"""`OpenVINORunner`: compiles an OpenVINO model for CPU, exactly as a user's `compile_model` does."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from ...runner import Runner, to_numpy

__all__ = ["OpenVINORunner"]


class OpenVINORunner(Runner):
    """Compiles an OpenVINO model for the CPU plugin, as a user's `compile_model` does, and runs it."""
    runtime = "OpenVINO CPU plugin"

    def __init__(self, artifact, record):
        super().__init__(artifact, record)
        import openvino as ov

        self.compiled = ov.Core().compile_model(artifact, "CPU")  # no extra config: what users get

    @property
    def precision(self) -> str:
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT")  # what the compiled model runs in
        return f"{hint.to_string() if hasattr(hint, 'to_string') else hint} (CPU plugin INFERENCE_PRECISION_HINT)"

    def run_flat(self, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
        feed = [to_numpy(leaf) for leaf in leaves]
        result = self.compiled(feed)
        return [torch.from_numpy(np.array(result[out])) for out in self.compiled.outputs]
