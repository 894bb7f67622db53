"""`ExecutorchExporter`: the captured program lowered to an ExecuTorch `.pte` (XNNPACK by default).

```
capture (shared) -> to_edge_transform_and_lower(partitioner) -> to_executorch(memory planning)
```
Ops the delegate cannot take stay on ExecuTorch's portable kernels; the record counts both.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ...capture.capture import Capture
from ...capture.dynamic import grow_batch, has_fixed_batch
from ...capture.names import role_of
from ...capture.prepare import model_name
from ...capture.pytree import _is_cache
from ...errors import PrepareError
from ...exporter import HfExporter
from ...record import ExportRecord
from ...storage import atomic_file
from ..onnx.program import checked_destination
from .config import ExecutorchConfig
from .targets import check_target, partitioners

__all__ = ["ExecutorchExporter"]

#: Used for a dynamic dimension of unknown role when the config gives no better bound.
FALLBACK_MAX = 4096


class ExecutorchExporter(HfExporter):
    """Export to an `executorch.exir.ExecutorchProgramManager`.

    ```python
    et_program = ExecutorchExporter().export(model, inputs, config=ExecutorchConfig(dynamic=True))
    et_program.save("model.pte")
    method = Runtime.get().load_program("model.pte").load_method("forward")
    outputs = method.execute(list(inputs.values()))
    ```
    The program's inputs are the `inputs` dict's tensors, in order (caches flattened).
    """

    format = "executorch"
    config_class = ExecutorchConfig
    extra = "executorch"
    fix_order = ()

    def _check_model(self, model, inputs: dict[str, Any], config: ExecutorchConfig) -> None:
        check_target(config.backend, model_name(model))
        if config.backend == "mlx":
            from transformers import StaticCache

            if any(isinstance(v, StaticCache) for v in inputs.values()):
                raise PrepareError(
                    "the MLX delegate does not take a StaticCache",
                    model=model_name(model),
                    remedy="export with a DynamicCache (the default of generate()), or use backend='xnnpack'",
                )

    def _capture_sample(self, inputs: dict[str, Any], config: ExecutorchConfig) -> dict[str, Any]:
        # ExecuTorch's edge passes bound a symbol whose sample size is 1 to at most 2 (measured with
        # executorch 1.4.1: a batch-1 Llama planned a batch of 2), so trace with a batch of 2.
        if config.dynamic and config.dynamic_shapes is None and not has_fixed_batch(inputs):
            return grow_batch(inputs)
        return inputs

    def _dim_bounds(self, model, inputs: dict[str, Any], config: ExecutorchConfig) -> ConfigBounds:
        return ConfigBounds(model, inputs, config)

    def _convert(self, captured: Capture, model: torch.nn.Module, inputs: dict[str, Any], config: ExecutorchConfig):
        from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
        from executorch.exir.passes import MemoryPlanningPass

        edge = to_edge_transform_and_lower(captured.program,
                                           partitioner=partitioners(config.backend, dynamic_quant=_dynamic_quant(config)))
        planning = MemoryPlanningPass(
            alloc_graph_input=config.alloc_graph_input,
            alloc_graph_output=config.alloc_graph_output,
            alloc_mutable_buffers=config.alloc_mutable_buffers,
        )
        return edge.to_executorch(ExecutorchBackendConfig(memory_planning_pass=planning))

    def _record(self, captured: Capture, model, artifact, config: ExecutorchConfig) -> ExportRecord:
        record = super()._record(captured, model, artifact, config)
        record.details["delegation"] = delegation_summary(artifact, config.backend)
        return record

    def _save(self, artifact, stem: Path) -> list[Path]:
        return [save_pte(artifact, stem.with_suffix(".pte"))]

    def _load(self, files: list[Path]) -> PteBuffer:
        return PteBuffer(files[0].read_bytes())


class PteBuffer:
    """A saved `.pte` program, as the runner loads it (`buffer`, like `ExecutorchProgramManager`)."""

    def __init__(self, buffer: bytes):
        self.buffer = buffer


def _dynamic_quant(config: ExecutorchConfig) -> bool:
    return config.quantizer is not None and getattr(config.quantizer, "scheme", "") == "int8-dynamic"


class ConfigBounds:
    """Upper bounds for dynamic dims, which memory planning needs: the batch gets
    `ExecutorchConfig.max_batch_size`, sequence-like dims the model's `max_position_embeddings`
    (or `max_target_positions`), others `FALLBACK_MAX`. `chosen` says what was picked and why."""

    def __init__(self, model: torch.nn.Module, inputs: dict[str, Any], config: ExecutorchConfig):
        model_config = getattr(model, "config", None)  # a projector or an lm_head component has none
        text = (model_config.get_text_config(decoder=True) if hasattr(model_config, "get_text_config")
                else model_config)
        self.max_positions = int(getattr(text, "max_position_embeddings", None)
                                 or getattr(model_config, "max_target_positions", None) or FALLBACK_MAX)
        self.max_batch = config.max_batch_size
        self.max_patches = config.max_image_patches
        self.static_cache = has_fixed_batch(inputs)
        self.inputs = inputs
        self.chosen: dict[str, str] = {}

    def __call__(self, name: str, axis: int, size: int) -> tuple[int, int]:
        role = role_of(name, _rank_of(self.inputs, name), axis)
        if role == "cache_length" and self.static_cache:
            # planned at exactly the static cache's size: method_meta then gives the caller's
            # buffer sizes (the seed's C++ loop allocates the cache from `nbytes()`)
            upper, why = size, "the static cache's max_cache_len"
        elif role in ("batch", "images"):
            upper, why = self.max_batch, "ExecutorchConfig.max_batch_size"
        elif role == "patches":
            upper, why = self.max_patches, "ExecutorchConfig.max_image_patches"
        elif role in ("sequence", "decoder_sequence", "cache_length"):
            upper, why = self.max_positions, "the model config's max_position_embeddings"
        else:
            upper, why = max(FALLBACK_MAX, 2 * size), f"no known role: {FALLBACK_MAX} or twice the sample"
        upper = max(upper, size)
        self.chosen[f"{name}[{axis}] ({role or 'dim'})"] = f"<= {upper}: {why}"
        return 1, upper


def _rank_of(inputs: dict[str, Any], name: str) -> int:
    head = name.split(".")[0]
    value = inputs.get(head)
    if isinstance(value, torch.Tensor):
        return value.dim()
    if head == "cache" or _is_cache(value):
        return 4
    return 0


def delegation_summary(artifact: Any, backend: str) -> dict[str, int | str]:
    """How many graph nodes the delegate took and how many stayed on portable kernels."""
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    program = artifact.exported_program()
    delegated = portable = delegates = 0
    for node in program.graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target))
        if "executorch_call_delegate" in name:
            delegates += 1
        elif name != "getitem":
            portable += 1
    for _, module in program.graph_module.named_children():
        if isinstance(module, LoweredBackendModule):
            graph = module.original_module.graph_module.graph
            delegated += sum(1 for n in graph.nodes if n.op == "call_function" and "getitem" not in str(n.target))
    return {"backend": backend, "delegates": delegates, "delegated_nodes": delegated, "portable_nodes": portable}


def save_pte(artifact: Any, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write `artifact.buffer` to `path` atomically (temporary file, then rename)."""
    target = checked_destination(path, overwrite=overwrite, what="the ExecuTorch program")
    with atomic_file(target, "wb") as stream:
        artifact.write_to_file(stream)
    return target
