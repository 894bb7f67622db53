"""`TorchaoQuantizer`: torchao's tensor-subclass quantization on the `torch.export` graph (ExecuTorch, torch.export).

torchao's `quantize_` swaps an `nn.Linear`'s weight for a quantized tensor subclass whose
`aten.linear` computes through torchao's quantize/dequantize ops. The captured program's module
has no `nn.Linear` left, only `aten.linear(x, weight)` nodes reading parameters; so each such
parameter goes through `quantize_` on a one-layer stand-in and the quantized tensor takes its
place. Re-exporting then traces the subclass's ops into the graph, where XNNPACK's partitioner
finds its dynamically quantized linear pattern (int8 activations per token, int4 weights per group).
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import QuantizationError
from .base import ExportQuantizer

__all__ = ["TorchaoQuantizer"]

#: The ATen ops whose weight argument the quantizer replaces, and that argument's position.
_WEIGHT_ARG = {"aten.linear.default": 1, "aten.embedding.default": 0}


class TorchaoQuantizer(ExportQuantizer):
    """torchao `quantize_` on the weights the `torch.export` graph's linears (and embeddings) read.

    Schemes:
    - `"int8-dynamic-int4-weights"` ("8da4w", as ExecuTorch deploys LLMs): int4 symmetric weights
      per group of `group_size` input channels, activations quantized to int8 per token at run
      time (torchao's `Int8DynamicActivationIntxWeightConfig`); on ExecuTorch the XNNPACK
      delegate runs them with its int8 x int4 kernels (`record.details["delegation"]` counts them).

    A linear whose input size is not a multiple of `group_size` is quantized per output channel
    instead (one int4 scale per row) and listed under `record.details["quantization"]["per_channel"]`.

    Args:
        scheme: see above.
        calibration: not used (the scheme is dynamic).
        group_size: input channels per int4 scale (a power of two, >= 16; default 32).
        embedding_bits: quantize the token embedding's weights too, to 4 or 8 bits (torchao's
            `IntxWeightOnlyConfig`, per group of `group_size`); `None` (default) keeps it float.
            An embedding whose table is tied to the output layer gets a copy of its own.

    # NOTE: not offered on the `dynamo` format: torchao's weight-only schemes do not decode faster
    # than fp32 with PyTorch's CPU kernels here (torchao 0.17, torch 2.13, 2 CPUs, a 126 MB Llama,
    # eager `generate` with a static cache of 256): `Int8WeightOnlyConfig` 0.7 tok/s against fp32's
    # 1.7 in the same run; `Int4WeightOnlyConfig` needs bf16 for its CPU layout (`tile_packed_to_4d`:
    # "Only bfloat16 is supported") and the `mslk` package for the plain one. A lower precision
    # or a slower program presented as a speed option would be weaker than asked.

    ```python
    config = ExecutorchConfig(quantizer=TorchaoQuantizer("int8-dynamic-int4-weights", group_size=32))
    ```
    """

    name = "torchao"
    stage = "fx"
    formats = ("executorch",)
    schemes = ("int8-dynamic-int4-weights",)
    static_schemes = ()
    packages = ("torchao",)

    def __init__(self, scheme: str, calibration=None, *, group_size: int = 32, embedding_bits: int | None = None):
        super().__init__(scheme, calibration)
        if not isinstance(group_size, int) or group_size < 16 or group_size & (group_size - 1):
            raise ValueError(f"TorchaoQuantizer group_size must be a power of two >= 16 (XNNPACK's int4 kernels "
                             f"take 32, 64, 128, ...; 16 for small layers); got {group_size!r}")
        if embedding_bits not in (None, 4, 8):
            raise ValueError(f"TorchaoQuantizer embedding_bits must be 4, 8 or None (float); got {embedding_bits!r}")
        self.group_size = group_size
        self.embedding_bits = embedding_bits
        self.notes: dict[str, Any] = {}

    def to_dict(self) -> dict[str, Any]:
        """As `ExportQuantizer.to_dict`, with the group size and the embedding's bits."""
        return {**super().to_dict(), "group_size": self.group_size, "embedding_bits": self.embedding_bits}

    def details(self) -> dict[str, Any]:
        """What the last `quantize_program` decided per layer (layers quantized per channel)."""
        return dict(self.notes)

    def _linear_config(self, in_features: int):
        from torchao.quantization import Int8DynamicActivationIntxWeightConfig
        from torchao.quantization.granularity import PerAxis, PerGroup

        granularity = PerGroup(self.group_size) if in_features % self.group_size == 0 else PerAxis(0)
        return Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=granularity)

    def _embedding_config(self, dim: int):
        from torchao.quantization import IntxWeightOnlyConfig
        from torchao.quantization.granularity import PerAxis, PerGroup

        granularity = PerGroup(self.group_size) if dim % self.group_size == 0 else PerAxis(0)
        return IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{self.embedding_bits}"), granularity=granularity)

    def quantize_program(self, module: torch.fx.GraphModule, samples: list[dict[str, Any]]) -> torch.nn.Module:
        """Replace the weights of `module`'s linears (and embeddings) with torchao's quantized tensors."""
        from torchao.quantization import quantize_

        for name, ops in _weight_readers(module).items():
            if len(ops) > 1:  # tied: the embedding gets its own copy (float, or weight-only quantized)
                _untie_embedding(module, name)
        readers = _weight_readers(module)
        per_channel: list[str] = []
        for name, ops in readers.items():
            weight = module.get_parameter(name) if _is_parameter(module, name) else module.get_buffer(name)
            if weight.dim() != 2 or not weight.is_floating_point():
                continue
            op = "aten.linear.default" if "aten.linear.default" in ops else "aten.embedding.default"
            if op == "aten.embedding.default" and self.embedding_bits is None:
                continue
            if weight.shape[1] % self.group_size:
                per_channel.append(name)
            if op == "aten.linear.default":
                stand_in = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
                config = self._linear_config(weight.shape[1])
            else:
                stand_in = torch.nn.Embedding(weight.shape[0], weight.shape[1])
                config = self._embedding_config(weight.shape[1])
            stand_in.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
            quantize_(stand_in, config, filter_fn=lambda m, _: m is stand_in)
            _set_attribute(module, name, stand_in.weight)
            _call_functional(module, name)
        if not any("aten.linear.default" in ops for ops in readers.values()):
            raise QuantizationError(f"{type(self).__name__}: the graph has no linear layer reading a weight",
                                    remedy="this scheme quantizes linear layers; export without quantizer=")
        self.notes = {"per_channel": per_channel, "group_size": self.group_size} if per_channel else {}
        return module


def _weight_readers(module: torch.fx.GraphModule) -> dict[str, set[str]]:
    """`{weight attribute: {ops reading it}}` for the linears and embeddings of `module`'s graph."""
    readers: dict[str, set[str]] = {}
    for node in module.graph.nodes:
        position = _WEIGHT_ARG.get(str(node.target)) if node.op == "call_function" else None
        if position is None or len(node.args) <= position:
            continue
        weight = node.args[position]
        if isinstance(weight, torch.fx.Node) and weight.op == "get_attr":
            readers.setdefault(str(weight.target), set()).add(str(node.target))
    return readers


def _call_functional(module: torch.fx.GraphModule, name: str) -> None:
    """Make the linears/embeddings reading `name` call `F.linear`/`F.embedding` instead of the ATen op.

    # NOTE: torchao's subclass (torchao 0.17, `IntxUnpackedToInt8Tensor`) takes over `F.linear` and
    # `F.embedding` at `__torch_function__`; a graph calling `aten.linear.default` reaches it only
    # after `linear` decomposed to `t` + `mm`, which the subclass does not implement
    # ("attempting to run unimplemented operator ... aten.t").
    """
    import torch.nn.functional as F

    for node in module.graph.nodes:
        if node.op != "call_function" or str(node.target) not in _WEIGHT_ARG:
            continue
        if str(node.target) == "aten.linear.default" and getattr(node.args[1], "target", None) == name:
            node.target = F.linear
        elif str(node.target) == "aten.embedding.default" and getattr(node.args[0], "target", None) == name:
            node.target, node.args = F.embedding, (node.args[1], node.args[0], *node.args[2:3])
    module.recompile()


def _is_parameter(module: torch.nn.Module, name: str) -> bool:
    owner_path, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    return attr in owner._parameters


def _set_attribute(module: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    owner_path, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    if attr in owner._buffers:
        del owner._buffers[attr]
    owner._parameters[attr] = value if isinstance(value, torch.nn.Parameter) else torch.nn.Parameter(value, False)


def _untie_embedding(module: torch.fx.GraphModule, name: str) -> None:
    """Point the embedding lookups reading `name` at a copy of it (`<name>_embedding`)."""
    copy_name = f"{name.replace('.', '_')}_embedding"
    module.register_buffer(copy_name, module.get_parameter(name).detach().clone()
                           if _is_parameter(module, name) else module.get_buffer(name).clone())
    graph = module.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and str(node.target) == "aten.embedding.default" \
                and getattr(node.args[0], "target", None) == name:
            with graph.inserting_before(node):
                copy = graph.get_attr(copy_name)
            node.replace_input_with(node.args[0], copy)
    module.recompile()
