"""`TorchaoQuantizer`: torchao's tensor-subclass quantization on the `torch.export` graph (ExecuTorch, torch.export).

torchao's `quantize_` swaps an `nn.Linear`'s weight for a quantized tensor subclass whose
`aten.linear` computes through torchao's quantize/dequantize ops. The captured program's module
has no `nn.Linear` left, only `aten.linear(x, weight)` nodes reading parameters; so each such
parameter goes through `quantize_` on a one-layer stand-in and the quantized tensor takes its
place. Re-exporting then traces the subclass's ops into the graph, where XNNPACK's partitioner
finds its dynamically quantized linear pattern (int8 activations per token, int4 weights per group).

# NOTE: mixed precision by default (`ratio=0.8`, as optimum-intel's OpenVINO int4, NNCF's `ratio=0.8`): with
# every linear int4, SmolLM2-135M-Instruct lost facts (teacher-forced greedy agreement with fp32
# eager 0.54-0.75 over nine chat prompts, the colors prompt 0.54, under the 0.6 floor), and no
# all-int4 option (groups of 16, HQQ scales, the head alone at int8: 0.62-0.79) cleared it with
# margin. The LM head and a fifth of the other linears' parameters at 8 bits, chosen data-free by
# NNCF's criterion (`linear_bits`), give 0.71-0.81 (mean step cosine 0.88-0.94) for 97.3 MB of
# linear weights against all-int4's 75.6 MB (+29%; 8da8w: 0.85-0.94, 135.3 MB). Ranking by the
# relative int4 error instead gave 0.60-0.81 (cosine 0.85-0.93) at the same size
# (`bench/int4_options.py --torchao`, `bench/RESULTS.md`). XNNPACK runs the 8-bit ones as its
# int8 x int8 per-channel dynamic linear; the LLM-runner program gives torchao's eager logits with
# them (cosine 1.0000 per decode step on the tiny Llama; an "int8 head breaks decoding from step 4"
# reading was a free-running comparison past a near-tied token the head flips,
# `tests/quantization/test_torchao.py`).
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
    With `ratio` under 1, the LM head and the linears NNCF's data-free criterion ranks first keep
    8-bit weights (one scale per output channel; `linear_bits`), listed with the reason under
    `record.details["quantization"]["int8_weights"]`.

    Args:
        scheme: see above.
        calibration: not used (the scheme is dynamic).
        group_size: input channels per int4 scale (a power of two, >= 16; default 32).
        embedding_bits: quantize the token embedding's weights too, to 4 or 8 bits (torchao's
            `IntxWeightOnlyConfig`, per group of `group_size`); `None` (default) keeps it float.
            An embedding whose table is tied to the output layer gets a copy of its own.
        ratio: the share of the linears' parameters (the LM head aside) at int4, the rest and the
            head at int8 (default 0.8, NNCF's default for OpenVINO's int4); 1.0: every linear
            int4, the head included (22% smaller weights than 0.8, fewer facts kept; see the note above).

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

    def __init__(self, scheme: str, calibration=None, *, group_size: int = 32, embedding_bits: int | None = None,
                 ratio: float = 0.8):
        super().__init__(scheme, calibration)
        if not isinstance(ratio, (int, float)) or not 0.0 <= ratio <= 1.0:
            raise ValueError(f"TorchaoQuantizer ratio must be in [0, 1] (the share of linear weights at int4); "
                             f"got {ratio!r}")
        if not isinstance(group_size, int) or group_size < 16 or group_size & (group_size - 1):
            raise ValueError(f"TorchaoQuantizer group_size must be a power of two >= 16 (XNNPACK's int4 kernels "
                             f"take 32, 64, 128, ...; 16 for small layers); got {group_size!r}")
        if embedding_bits not in (None, 4, 8):
            raise ValueError(f"TorchaoQuantizer embedding_bits must be 4, 8 or None (float); got {embedding_bits!r}")
        self.group_size = group_size
        self.embedding_bits = embedding_bits
        self.ratio = float(ratio)
        self.notes: dict[str, Any] = {}

    def to_dict(self) -> dict[str, Any]:
        """As `ExportQuantizer.to_dict`, with the group size, the embedding's bits and the int4 ratio."""
        return {**super().to_dict(), "group_size": self.group_size, "embedding_bits": self.embedding_bits,
                "ratio": self.ratio}

    def details(self) -> dict[str, Any]:
        """What the last `quantize_program` decided per layer (layers quantized per channel)."""
        return dict(self.notes)

    def _linear_config(self, in_features: int, bits: int = 4):
        return linear_config(in_features, bits, self.group_size)

    def _linear_bits(self, weights: dict[str, torch.Tensor], embedding_rows: list[int]) -> dict[str, int]:
        """`{weight name: bits}` for the linears' weights (`linear_bits`)."""
        return linear_bits(weights, embedding_rows, self.group_size, self.ratio)

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
        linears = {name: _attribute(module, name) for name, ops in readers.items() if "aten.linear.default" in ops}
        tables = [_attribute(module, name).shape[0] for name, ops in readers.items() if "aten.embedding.default" in ops]
        bits = self._linear_bits({name: w for name, w in linears.items() if w.dim() == 2 and w.is_floating_point()},
                                 tables)
        per_channel: list[str] = []
        for name, ops in readers.items():
            weight = _attribute(module, name)
            if weight.dim() != 2 or not weight.is_floating_point():
                continue
            op = "aten.linear.default" if "aten.linear.default" in ops else "aten.embedding.default"
            if op == "aten.embedding.default" and self.embedding_bits is None:
                continue
            if weight.shape[1] % self.group_size and bits.get(name, 4) == 4:
                per_channel.append(name)
            if op == "aten.linear.default":
                stand_in = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
                config = self._linear_config(weight.shape[1], bits[name])
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
        int8 = [name for name, b in bits.items() if b == 8]
        if int8:
            self.notes["int8_weights"] = {"linears": int8, "ratio": self.ratio, "why": _int8_why(bits, linears, tables)}
        return module


def _int8_why(bits: dict[str, int], weights: dict[str, torch.Tensor], embedding_rows: list[int]) -> str:
    heads = [name for name in bits if weights[name].shape[0] == max(embedding_rows, default=None)]
    body = [name for name in bits if name not in heads]
    share = sum(weights[n].numel() for n in body if bits[n] == 8) / max(1, sum(weights[n].numel() for n in body))
    return (f"the LM head ({', '.join(heads) or 'none found'}: output size = the token embedding's rows) and "
            f"the other linears NNCF's data-free criterion ranks first (the smallest int8 weight error), "
            f"{share:.0%} of their parameters, keep 8-bit weights (per output channel); the rest int4")


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


def _attribute(module: torch.nn.Module, name: str) -> torch.Tensor:
    return module.get_parameter(name) if _is_parameter(module, name) else module.get_buffer(name)


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


def linear_config(in_features: int, bits: int, group_size: int):
    """torchao's 8da4w config for one linear: int4 per group of `group_size` input channels (per
    output channel where `in_features` is not a multiple), or int8 per output channel."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig
    from torchao.quantization.granularity import PerAxis, PerGroup

    grouped = bits == 4 and in_features % group_size == 0
    return Int8DynamicActivationIntxWeightConfig(weight_dtype=getattr(torch, f"int{bits}"),
                                                 weight_granularity=PerGroup(group_size) if grouped else PerAxis(0))


def _quantization_error(weight: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """Per output channel, the mean squared error of `weight` through torchao's `bits` quantization."""
    from torchao.quantization import quantize_

    stand_in = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    stand_in.weight = torch.nn.Parameter(weight.detach().float(), requires_grad=False)
    quantize_(stand_in, linear_config(weight.shape[1], bits, group_size), filter_fn=lambda m, _: m is stand_in)
    return (stand_in.weight.dequantize().float() - weight.detach().float()).pow(2).mean(1)


def linear_bits(weights: dict[str, torch.Tensor], embedding_rows: list[int], group_size: int, ratio: float,
                metric: str = "nncf") -> dict[str, int]:
    """`{name: 4 or 8}` for linear weights `{name: [out, in]}`: the mixed-precision rule.

    `ratio` 1.0: every linear 4 bits. Below: the LM head (a linear whose output size is the token
    embedding's rows, the largest of `embedding_rows`) 8 bits, and of the other linears the most sensitive 8 bits
    until `1 - ratio` of their parameters are; sensitivity `metric` `"nncf"`: NNCF's data-free
    criterion (`nncf.compress_weights` without data: each linear's largest per-row mean squared
    int8 error, the smallest kept at 8 bits; here on the symmetric per-channel int8 the program
    runs, where NNCF measures its asymmetric one); `"int4"` (the bench's comparison): the relative
    error of the int4 weight (`||W - Q4(W)|| / ||W||`), the largest kept at 8 bits.
    """
    bits = {name: 4 for name in weights}
    weights = {name: weight.detach() for name, weight in weights.items()}
    if ratio >= 1.0:
        return bits
    body, vocab_size = {}, max(embedding_rows, default=None)
    for name, weight in weights.items():
        if weight.shape[0] == vocab_size:
            bits[name] = 8
        elif metric == "int4":
            error = _quantization_error(weight, 4, group_size).mean() / weight.float().pow(2).mean()
            body[name] = -float(error.sqrt())
        else:
            body[name] = float(_quantization_error(weight, 8, group_size).max())
    budget = (1.0 - ratio) * sum(weights[name].numel() for name in body)
    kept = 0
    for name in sorted(body, key=body.get):
        if kept + weights[name].numel() > budget:
            break
        bits[name], kept = 8, kept + weights[name].numel()
    return bits
