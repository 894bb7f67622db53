"""ExecuTorch delegates: which partitioner each `ExecutorchConfig.delegate` uses, and whether it
can run here (checked before any work)."""

from __future__ import annotations

import platform
import sys
from typing import Any

from .partitioner import xnnpack_partitioner

__all__ = ["check_delegate", "partitioners"]


def _macos_version() -> tuple[int, ...]:
    release = platform.mac_ver()[0]
    return tuple(int(p) for p in release.split(".") if p.isdigit()) if release else ()


def check_delegate(delegate: str, model_name: str) -> None:
    """Raise `RuntimeError` when `delegate` cannot be used on this machine, saying what to do."""
    if delegate == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(
                f"{model_name}: ExecutorchConfig(delegate='cuda') needs CUDA, and torch.cuda.is_available() is False "
                "here. Use delegate='xnnpack' for CPU, or export on a machine with a CUDA GPU and a CUDA build of torch."
            )
    elif delegate == "mlx":
        if sys.platform != "darwin" or platform.machine() != "arm64" or _macos_version() < (14,):
            raise RuntimeError(
                f"{model_name}: ExecutorchConfig(delegate='mlx') needs macOS 14+ on Apple Silicon "
                f"(this is {sys.platform}/{platform.machine()}). Use delegate='xnnpack' here."
            )
        try:
            from executorch.backends.mlx import partitioner  # noqa: F401
        except ImportError as error:
            raise RuntimeError(
                f"{model_name}: the MLX delegate is not in this ExecuTorch build ({error}). Install an ExecuTorch "
                "macOS arm64 nightly that ships it (see the README), or use delegate='xnnpack'."
            ) from error


def partitioners(delegate: str, *, dynamic_quant: bool = False) -> list[Any]:
    """The partitioner list handed to `to_edge_transform_and_lower` for `delegate`.

    A dynamically quantized program first gets XNNPACK's dynamically-quantized partitioner, one op per
    partition (as ExecuTorch's own LLM export does): partitioned together with the float ops, the
    quantize/dequantize chains of dynamically quantized linears formed dependency cycles
    ("Invalid partition, found dependency cycles").
    """
    if delegate == "xnnpack":
        if dynamic_quant:
            from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

            dynamic = XnnpackPartitioner(config_precisions=ConfigPrecisionType.DYNAMIC_QUANT, per_op_mode=True)
            return [dynamic, xnnpack_partitioner()]
        return [xnnpack_partitioner()]
    if delegate == "cuda":
        from executorch.backends.cuda.cuda_backend import CudaBackend
        from executorch.backends.cuda.cuda_partitioner import CudaPartitioner

        return [CudaPartitioner([CudaBackend.generate_method_name_compile_spec("forward")])]
    from executorch.backends.mlx.partitioner import MLXPartitioner

    return [MLXPartitioner()]
