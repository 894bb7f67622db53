"""`OnnxRunner`: runs an ONNX program in ONNX Runtime (CPU), fed by input name."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from ...runner import Runner, to_numpy

__all__ = ["OnnxRunner"]


class OnnxRunner(Runner):
    """Runs an ONNX model in ONNX Runtime on the CPU, fed by input name."""
    runtime = "ONNX Runtime (CPUExecutionProvider)"

    def __init__(self, artifact, record):
        super().__init__(artifact, record)
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        source = artifact.model_proto.SerializeToString() if hasattr(artifact, "model_proto") else str(artifact)
        self.session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]

    @property
    def precision(self) -> str:
        return "f32 (ONNX Runtime CPU runs the model's own dtypes)"

    def run_flat(self, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
        if len(leaves) != len(self.input_names):
            raise ValueError(f"the ONNX model takes {len(self.input_names)} inputs, got {len(leaves)} tensors")
        feed = {name: to_numpy(leaf) for name, leaf in zip(self.input_names, leaves)}
        return [torch.from_numpy(np.asarray(out)) for out in self.session.run(None, feed)]
