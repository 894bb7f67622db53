"""`OrtQuantizer`: ONNX Runtime's own quantization of the ONNX model: int8 dynamic and static,
and weight-only int4/int8 into `MatMulNBits`.

# NOTE: why `MatMulNBits` rather than NNCF's int4 on ONNX: NNCF writes the int4 weights as
# `DequantizeLinear -> MatMul`, which ONNX Runtime's CPU provider runs by dequantizing every weight
# to fp32 on each call (measured: int4 decode at 0.60x eager fp32 on a 134 MB Llama). ORT's
# `MatMulNBitsQuantizer` packs the weights into the `com.microsoft.MatMulNBits` contrib op, whose
# kernel reads the packed blocks directly: a decode step reads a quarter (int4) of the weight bytes.
# Measured on the decode graph of that Llama (static cache 256, one token, 2 CPUs, onnxruntime 1.32,
# all variants interleaved in one process on a loaded machine, median ms): fp32 98, ORT int4 66,
# ORT int8 77, NNCF int4 97, NNCF int8 264. `accuracy_level` 4 (int8 activations) against 0: int4
# 55 vs 63 ms, int8 47 vs 259 ms (at 0 the 8-bit kernel falls back to dequantizing), same logits
# cosine to fp32 (0.9906 vs 0.9907 int4, 0.99994 vs 0.99996 int8): 4 is the default.
"""

from __future__ import annotations

import copy
import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import QuantizationError
from .base import ExportQuantizer

__all__ = ["OrtQuantizer"]

#: Weight-only schemes -> bits per weight in `MatMulNBits`.
_NBITS = {"int4-weights": 4, "int8-weights": 8}

#: `MatMulNBits`'s `accuracy_level` (the precision its kernel computes in): 0 = unset, 1 = fp32,
#: 2 = fp16, 3 = bf16, 4 = int8 activations.
_ACCURACY_LEVELS = (0, 1, 2, 3, 4)


#: On CPUs without VNNI ONNX Runtime's u8 x s8 int8 matmul kernels (AVX2) add product pairs in
#: int16 and saturate (its docs: use `reduce_range` or U8U8). The artifact runs on whichever CPU it
#: is deployed to, so it is made safe on both. Measured on an AVX2 EPYC without VNNI (onnxruntime
#: 1.32): the tiny Llama's one-token logits against fp32, int8-dynamic cosine 0.9920 with s8 weights
#: at 8 bits, 0.9998 at 7 (`reduce_range`), 0.9999 with u8 weights at 8 (U8U8); int8-static 0.9937
#: at 8 bits, over the 0.995 floor at 7. On SmolLM2-135M-Instruct s8 at 8 bits is destroyed there
#: (teacher-forced greedy agreement 0.00), and `int8-dynamic`'s decode export agrees with fp32 eager
#: on 64 steps at 0.89 (sample prompt) / 0.75 and 0.78 (chat prompts: lowest, mean; lowest mean step
#: cosine 0.881) at 7 bits, at 0.97 / 0.80 and 0.81 (0.922) with u8 weights at 8 bits, as s8 at 8
#: bits on a VNNI machine measured (0.92 / 0.80 and 0.83, 0.936);
#: one-token forward 28 ms U8U8 vs 33 ms at 7 bits (`bench/RESULTS.md`). So `int8-dynamic` keeps
#: u8 weights at full range (`DYNAMIC_WEIGHT_TYPE`); `int8-static`'s symmetric int8 activations
#: (QDQ) keep s8 weights within 7 bits (`REDUCE_RANGE`).
DYNAMIC_WEIGHT_TYPE = "QUInt8"
REDUCE_RANGE = True

#: The op types `int8-static` quantizes: the layers that hold weights. Static per-tensor int8 around
#: every op (ORT's default: Add, Mul, Softmax, Gather... too) destroys an LLM; see `_static_excluded_matmuls`.
STATIC_OP_TYPES = ("MatMul", "Gemm", "Conv")


class OrtQuantizer(ExportQuantizer):
    """Quantize the exported ONNX model with `onnxruntime.quantization`.

    Schemes:
    - `"int8-dynamic"` (`quantize_dynamic`: int8 weights, activations at run time; MatMul/Gemm
      become `MatMulInteger`);
    - `"int8-static"` (`quantize_static`, QDQ format, per-channel weights, activations calibrated on
      `calibration`);
    safe on CPUs without VNNI: int8-dynamic's weights are uint8 (U8U8, `DYNAMIC_WEIGHT_TYPE`),
    int8-static's within 7 bits (`REDUCE_RANGE`);
    - `"int4-weights"`, `"int8-weights"`: weight-only, block-wise (`MatMulNBitsQuantizer`): every
      MatMul with a constant weight becomes a `com.microsoft.MatMulNBits` holding the packed weights
      (the embedding `Gather` stays fp32).

    Args:
        block_size: weights per quantization block along the input axis (weight-only schemes; a
            power of two, at least 16).
        accuracy_level: the `MatMulNBits` kernel's compute precision (0 to 4; 4 quantizes the
            activations to int8 per block, ORT's fastest CPU path).
        is_symmetric: symmetric blocks (no zero points) rather than asymmetric.

    Instead of a scheme name, ONNX Runtime's own config object may be given, used as it is:
    `onnxruntime.quantization.DynamicQuantConfig` (scheme `"int8-dynamic"`), `StaticQuantConfig`
    (`"int8-static"`; its `calibration_data_reader` is replaced by one over `calibration=`, fed by
    the model's input names; `None` there is fine) or a `matmul_nbits_quantizer` weight-only config
    such as `DefaultWeightOnlyQuantConfig(bits=4, ...)` (`"int4-weights"` / `"int8-weights"`).

    ```python
    config = OnnxConfig(dynamic=True, quantizer=OrtQuantizer("int4-weights"))
    config = OnnxConfig(dynamic=True, quantizer=OrtQuantizer(DynamicQuantConfig(per_channel=False)))
    ```
    """

    name = "onnxruntime"
    stage = "model"
    formats = ("onnx",)
    schemes = ("int8-dynamic", "int8-static", "int4-weights", "int8-weights")
    packages = ("onnxruntime",)
    extra = "onnx"

    def __init__(self, scheme: Any, calibration=None, *, block_size: int = 32, accuracy_level: int = 4,
                 is_symmetric: bool = True, ort_config: str | None = None):
        if ort_config is not None:  # a config file's entry for an object that JSON cannot hold
            raise QuantizationError(f"OrtQuantizer was made from ONNX Runtime's {ort_config}, which a config file "
                                    "does not hold", remedy=f"pass OrtQuantizer({ort_config}(...)) in Python")
        self.ort_config = None if isinstance(scheme, str) else scheme
        super().__init__(_scheme_of(scheme), calibration)
        if block_size < 16 or block_size & (block_size - 1):
            raise ValueError(f"OrtQuantizer: block_size must be a power of two >= 16 (MatMulNBits' blocks); "
                             f"got {block_size}")
        if accuracy_level not in _ACCURACY_LEVELS:
            raise ValueError(f"OrtQuantizer: accuracy_level must be one of {_ACCURACY_LEVELS}; got {accuracy_level}")
        self.block_size = block_size
        self.accuracy_level = accuracy_level
        self.is_symmetric = is_symmetric
        self.notes: dict[str, Any] = {}

    @property
    def needs_calibration(self) -> bool:
        """As `ExportQuantizer.needs_calibration`; a `StaticQuantConfig` with its own reader needs none."""
        if getattr(self.ort_config, "calibration_data_reader", None) is not None:
            return False
        return super().needs_calibration

    def to_dict(self) -> dict[str, Any]:
        """As `ExportQuantizer.to_dict`, with the weight-only options (or the ORT config's class)."""
        out = super().to_dict()
        if self.ort_config is not None:
            out["ort_config"] = type(self.ort_config).__name__
        elif self.scheme in _NBITS:
            out.update(block_size=self.block_size, accuracy_level=self.accuracy_level, is_symmetric=self.is_symmetric)
        return out

    def quantize_model(self, artifact: Any, samples: list[list[torch.Tensor]]) -> Any:
        """Quantize the ONNX model with ONNX Runtime's quantization tools (calibrated on `samples`
        for the static scheme)."""
        import onnx

        # the artifact's own class (HfOnnxProgram) makes the quantized copy: quantization sits below the backends
        program_class = type(artifact)
        if self.scheme in _NBITS:
            if self.ort_config is None and _weights_one_at_a_time(artifact.model):
                return program_class.from_model(self._matmul_nbits_in_place(artifact.model.clone()), artifact)
            return program_class.from_proto(self._matmul_nbits(artifact.model_proto), artifact)
        from onnxruntime import quantization as q

        with tempfile.TemporaryDirectory(prefix="hfexport-ort-") as tmp:
            source, target = Path(tmp) / "model.onnx", Path(tmp) / "model.int8.onnx"
            proto = artifact.model_proto
            # before saving: ORT selects nodes by name, which the export's nodes have, a hand-made graph may not
            excluded = _static_excluded_matmuls(proto.graph) if self.scheme == "int8-static" else []
            onnx.save_model(proto, source)
            if self.ort_config is not None:
                config = copy.copy(self.ort_config)
                if isinstance(config, q.StaticQuantConfig) and samples and self.calibration is not None:
                    config.calibration_data_reader = _reader([i.name for i in proto.graph.input],
                                                             samples)
                q.quantize(source, target, config)
            elif self.scheme == "int8-dynamic":
                q.quantize_dynamic(source, target, weight_type=getattr(q.QuantType, DYNAMIC_WEIGHT_TYPE),
                                   per_channel=True)
            else:
                names = [i.name for i in proto.graph.input]
                q.quantize_static(source, target, _reader(names, samples), quant_format=q.QuantFormat.QDQ,
                                  op_types_to_quantize=list(STATIC_OP_TYPES), nodes_to_exclude=excluded,
                                  per_channel=True, weight_type=q.QuantType.QInt8,
                                  activation_type=q.QuantType.QInt8, reduce_range=REDUCE_RANGE,
                                  extra_options={"ActivationSymmetric": True})
            quantized = onnx.load_model(target)
        return program_class.from_proto(quantized, artifact)

    def _matmul_nbits_in_place(self, model: Any) -> Any:
        """`model` (an ONNX IR model, changed in place) with each constant-weight MatMul of its graph
        replaced by `MatMulNBits`, one weight at a time: the weight's blocks are quantized by ONNX
        Runtime's own `DefaultWeightOnlyQuantizer.qbits_block_quant` (what `MatMulNBitsQuantizer`
        calls per node; the same nodes, names and bytes) straight from the tensor the initializer
        holds, so a weight mapped from a checkpoint is read, never copied whole, and the export
        holds the quantized weights only. `MatMulNBitsQuantizer` itself takes a `ModelProto`: every
        weight serialized first (2.1x the weights at the peak on a 1 GB checkpoint)."""
        import onnx_ir as ir
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            DefaultWeightOnlyQuantizer,
        )

        quantizers = {bits: DefaultWeightOnlyQuantizer(DefaultWeightOnlyQuantConfig(
            block_size=self.block_size, is_symmetric=self.is_symmetric, accuracy_level=self.accuracy_level or None,
            bits=bits)) for bits in {_NBITS[self.scheme], 8}}
        graph, replaced, heads = model.graph, 0, []
        for node in list(graph):
            weight = _constant_weight(node)
            if weight is None:
                continue
            # a head tied to the embedding (its table, which a Gather reads too) at 8 bits, as NNCF's
            # backup precision keeps a head; on SmolLM2 int4 decode then ran at 0.98x the builder's (head
            # int4) with the teacher-forced agreement of the fp32 head (0.71-0.79); int4 there not measured
            tied = any(use.node.op_type == "Gather" for use in weight.uses())
            bits = 8 if tied else _NBITS[self.scheme]
            if tied:
                heads.append(weight.name)
            # a folded Transpose is a strided view; the quantizer's kernel reads rows in order
            array = weight.const_value.numpy()
            array = np.ascontiguousarray(array.T if node.op_type == "FusedMatMul" else array)
            bfloat16 = weight.const_value.dtype == ir.DataType.BFLOAT16
            packed, scales, zero_points = quantizers[bits].qbits_block_quant(
                array.astype(np.float32) if bfloat16 else array)
            if bfloat16:
                scales = scales.astype(array.dtype)
            rows, cols = array.shape
            del array
            inputs = [node.inputs[0]]
            pieces = [(f"_Q{bits}", packed), ("_scales", scales), *([] if self.is_symmetric else [("_zero_points", zero_points)])]
            for suffix, data in pieces:
                tensor = ir.Tensor(data, name=weight.name + suffix)
                value = ir.Value(name=tensor.name, shape=tensor.shape, type=ir.TensorType(tensor.dtype), const_value=tensor)
                graph.register_initializer(value)
                inputs.append(value)
            attributes = {"K": rows, "N": cols, "bits": bits, "block_size": self.block_size}
            if self.accuracy_level:  # 0 means "unset": no attribute, as ORT's quantizer writes it
                attributes["accuracy_level"] = self.accuracy_level
            nbits = ir.node("MatMulNBits", inputs, attributes=attributes, domain="com.microsoft", num_outputs=1,
                            name=f"{node.name}_Q{bits}" if node.name else None)
            ir.convenience.replace_nodes_and_values(graph, node, [node], [nbits], node.outputs, nbits.outputs)
            if not weight.uses() and weight not in graph.outputs:
                graph.initializers.pop(weight.name)
            replaced += 1
        if not replaced:
            raise self._nothing_to_quantize()
        self.notes = {"tied_head": {"weights": heads, "bits": 8}} if heads else {}
        model.opset_imports.setdefault("com.microsoft", 1)
        return model

    def details(self) -> dict[str, Any]:
        """What the last quantization decided per layer: a tied LM head at 8 bits (`_constant_weight`)."""
        return dict(self.notes)

    def _matmul_nbits(self, proto: Any) -> Any:
        """`proto` with its constant-weight MatMuls replaced by `MatMulNBits` (weight-only schemes)."""
        MatMulNBitsQuantizer = _matmul_nbits_quantizer_class()
        if self.ort_config is not None:
            quantizer = MatMulNBitsQuantizer(proto, algo_config=self.ort_config,
                                             accuracy_level=getattr(self.ort_config, "accuracy_level", None))
        else:  # accuracy_level 0 means "unset": ORT's quantizer then writes no attribute (its default)
            quantizer = MatMulNBitsQuantizer(proto, bits=_NBITS[self.scheme], block_size=self.block_size,
                                             is_symmetric=self.is_symmetric,
                                             accuracy_level=self.accuracy_level or None)
        logger = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
        level = logger.level
        logger.setLevel(logging.WARNING)  # it logs a line per node at INFO
        try:
            quantizer.process()
        finally:
            logger.setLevel(level)
        quantized = quantizer.model.model
        if not any(node.op_type == "MatMulNBits" for node in quantized.graph.node):
            raise self._nothing_to_quantize()
        return quantized

    def _nothing_to_quantize(self) -> QuantizationError:
        return QuantizationError(f"{self!r}: no MatMul of the model has a constant 2-D weight for MatMulNBits",
                                 remedy="use OrtQuantizer('int8-dynamic') or NNCFQuantizer for this model")


def _constant_weight(node: Any) -> Any:
    """The weight of `node` when it is a MatMul whose second input is a 2-D float initializer (what
    `MatMulNBits` takes), or a `FusedMatMul` computing `x @ weight^T` and nothing more, else `None`.

    # NOTE: the second is where an LM head reads the token embedding's table `[vocab, hidden]` itself
    # (tied), which the Gather reads as it is: onnxscript (0.7.2) left SmolLM2's 49152 x 576 table
    # unfolded and fused the head's transpose into `FusedMatMul(x, table, transB=1)` (a small table's
    # transpose is folded into a copy, a plain MatMul); left in fp32 it was the biggest matmul of
    # SmolLM2-135M's int4 decode (49152 x 576, 21% of the weights), which decoded at 0.59x
    # onnxruntime-genai's builder, which quantizes the head (`bench/RESULTS.md`, issue 31).
    """
    import onnx_ir as ir

    if node.op_type == "FusedMatMul" and node.domain == "com.microsoft":
        plain = {"transA": 0, "transB": 1, "transBatchA": 0, "transBatchB": 0}
        if any(node.attributes.get_int(name, 0) != want for name, want in plain.items()) \
                or node.attributes.get_float("alpha", 1.0) != 1.0:
            return None
    elif node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
        return None
    if len(node.inputs) != 2:
        return None
    weight = node.inputs[1]
    if weight is None or not weight.is_initializer() or weight.const_value is None:
        return None
    tensor = weight.const_value
    floats = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    return weight if tensor.dtype in floats and len(tensor.shape) == 2 else None


def _static_excluded_matmuls(graph: Any) -> list[str]:
    """The names of the MatMuls of `graph` (an ONNX `GraphProto`, whose nameless nodes get names
    here) that `int8-static` leaves in fp32: those without a constant weight (attention's
    `Q @ K^T` and `P @ V`), and those reading the product of two activations (a gated MLP's
    `down_proj` reads `act(gate(x)) * up(x)`).

    # NOTE: why these: on SmolLM2-135M-Instruct (onnxruntime 1.32, the 20 built-in calibration
    # prompts, QDQ, per-channel s8 weights within 7 bits, symmetric s8 activations, MinMax) the
    # teacher-forced greedy agreement with fp32 eager over 64 steps (sample prompt / 3 chat prompts)
    # was 0.02 / 0.00 quantizing every op, 0.27-0.36 MatMuls only, 0.23-0.33 weight MatMuls only, and
    # 0.78-0.80 (mean step cosine 0.91-0.95) leaving the 30 `down_proj`s in fp32 too: the gated
    # product has outlier channels one per-tensor scale cannot hold (asymmetric u8 activations: 0.33-0.48;
    # `bench/RESULTS.md`).
    """
    initializers = {tensor.name for tensor in graph.initializer}
    constants = initializers | {output for node in graph.node if node.op_type == "Constant" for output in node.output}
    producers = {output: node for node in graph.node for output in node.output}
    excluded = []
    for index, node in enumerate(graph.node):
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        source = producers.get(node.input[0])
        gated = source is not None and source.op_type == "Mul" and not any(i in constants for i in source.input)
        if node.input[1] not in initializers or gated:
            if not node.name:
                node.name = f"hfexport_matmul_{index}"
            excluded.append(node.name)
    return excluded


def _weights_one_at_a_time(model: Any) -> bool:
    """Whether `_matmul_nbits_in_place` quantizes every MatMul `MatMulNBitsQuantizer` would: none
    sits in a subgraph (an If or Loop body) and no constant weight is N-D with unit leading dims
    (which ORT's quantizer squeezes and reshapes back)."""
    import onnx_ir as ir

    subgraphs = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
    for node in model.graph:
        if any(attribute.type in subgraphs for attribute in node.attributes.values()):
            return False
        if node.op_type == "MatMul" and len(node.inputs) == 2 and node.inputs[1] is not None:
            weight = node.inputs[1].const_value
            if weight is not None and len(weight.shape) > 2:
                return False
    return True


def _scheme_of(scheme: Any) -> str:
    """The short scheme name of `scheme`: itself, or that of an ONNX Runtime config object."""
    if isinstance(scheme, str):
        return scheme
    from onnxruntime import quantization as q

    if isinstance(scheme, q.DynamicQuantConfig):
        return "int8-dynamic"
    if isinstance(scheme, q.StaticQuantConfig):
        return "int8-static"
    bits = getattr(scheme, "bits", 4)  # RTN/GPTQ configs have no `bits`: 4
    if type(scheme).__name__.endswith("WeightOnlyQuantConfig") and bits in (4, 8):
        return f"int{bits}-weights"
    raise ValueError(f"OrtQuantizer takes a scheme name or DynamicQuantConfig, StaticQuantConfig, or a 4/8-bit "
                     f"weight-only config from onnxruntime.quantization; got {scheme!r}")


def _matmul_nbits_quantizer_class() -> type:
    """`onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer`, imported without its
    side effect on the root logger.

    # NOTE: the module (onnxruntime 1.32) calls `logging.basicConfig(level=logging.INFO)` at import,
    # which, in a process whose root logger has no handler yet, makes every library's INFO lines
    # print. `basicConfig` does nothing when the root logger has a handler, so one is held there
    # for the import.
    """
    root = logging.getLogger()
    guard = logging.NullHandler()
    root.addHandler(guard)
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    finally:
        root.removeHandler(guard)
    return MatMulNBitsQuantizer


def _reader(names: list[str], samples: list[list[torch.Tensor]]):
    """An ORT `CalibrationDataReader` over flat samples, fed by the model's own input names."""
    from onnxruntime.quantization import CalibrationDataReader

    from ..runner import to_numpy

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = ({n: to_numpy(t) for n, t in zip(names, sample)} for sample in samples)  # one at a time

        def get_next(self):
            return next(self.feeds, None)

    return Reader()
