"""`OnnxConfig`: options of the ONNX backend."""

from __future__ import annotations

import dataclasses

from ...config import ExportConfig, check_type

__all__ = ["OnnxConfig"]

#: Opsets the converter is tested with.
SUPPORTED_OPSETS = tuple(range(18, 24))


@dataclasses.dataclass
class OnnxConfig(ExportConfig):
    """Export to a `torch.onnx.ONNXProgram` (save with `.save("model.onnx")`, run in ONNX Runtime).

    Args:
        opset: the ONNX opset to target (18 to 23).
        optimize: run onnxscript's graph optimizer after conversion (constant folding, fusions).
        external_data: write the weights to one `<name>.onnx.data` file beside the graph (the
            manifest lists it and records its fingerprint); `None` does so for weights over
            `hfexport.config.EXTERNAL_WEIGHTS_BYTES` (64 MiB).
        ort_fusions: rewrite the graph for ONNX Runtime's fused kernels (onnxscript's
            `optimize_for_ort`: RMSNorm and residual + RMSNorm into `SimplifiedLayerNormalization` /
            `SkipSimplifiedLayerNormalization`, attention into `MultiHeadAttention`, ...). Applied
            after conversion, before a quantizer (so `MatMulNBits` takes the MatMuls that remain),
            to every ONNX export; `record.details["ort_fusions"]` counts what fused and says why a
            decoder's attention or rotary fusion did not. The fused ops are `com.microsoft`
            contrib ops: such a model runs in ONNX Runtime only; `False` keeps standard ONNX ops.
        group_query_attention: with `ort_fusions`, a static cache's attention as ONNX Runtime's
            `GroupQueryAttention` on a shared past/present buffer (`gqa.py`), the graph
            onnxruntime-genai runs: its `attention_mask` is 2-D int64 `[batch, past + new]` and
            the write counters leave it (`GenerationRunner` and validation still feed the
            record's interface). `None` (the default): on in an export folder (`export_to_folder`,
            the CLI), which also carries `genai_config.json`; off through the seed's API
            (`OnnxExporter().export(...)`, `export_for_generation`), whose decode keeps the seed's
            interface (4-D boolean causal mask, write counters as cache tensors) that its
            ONNX Runtime loop feeds. `False` keeps `MultiHeadAttention` and the seed's interface
            everywhere; `True` asks for GroupQueryAttention everywhere, and the export raises
            where a graph with a cache keeps `MultiHeadAttention` (the rule does not match, ONNX
            Runtime refuses the rewrite, a dynamic cache), naming why; it needs `ort_fusions`.
    """

    export_format = "onnx"
    # measured with onnxruntime 1.32.0 (CPUExecutionProvider) on tiny:llama: float16 runs
    refused_dtypes = {"bfloat16": "ONNX Runtime's CPU provider has no bfloat16 kernel for common ops (Mul(14) "
                                  "among them): the session cannot load the graph"}

    opset: int = 18
    optimize: bool = True
    external_data: bool | None = None
    ort_fusions: bool = True
    group_query_attention: bool | None = None
    #: set by the export folder's package (`OnnxRuntimePackage.folder_config`), never serialized:
    #: `group_query_attention=None` then rewrites a static cache's attention where the rule
    #: applies, and the record says why not elsewhere (`True` would refuse the export there)
    _in_folder: bool = dataclasses.field(default=False, repr=False)

    @property
    def rewrites_attention(self) -> bool:
        """Whether a static cache's attention is to become `GroupQueryAttention` where it can
        (`group_query_attention=True`, or None in an export folder)."""
        return bool(self.group_query_attention) or (self.group_query_attention is None and self._in_folder)

    def _validate(self) -> None:
        check_type("OnnxConfig", "opset", self.opset, int)
        if self.opset not in SUPPORTED_OPSETS:
            raise ValueError(f"OnnxConfig.opset must be one of {', '.join(map(str, SUPPORTED_OPSETS))}; got {self.opset}")
        check_type("OnnxConfig", "optimize", self.optimize, bool)
        check_type("OnnxConfig", "ort_fusions", self.ort_fusions, bool)
        if self.group_query_attention is not None:
            check_type("OnnxConfig", "group_query_attention", self.group_query_attention, bool)
        if self.group_query_attention and not self.ort_fusions:
            raise ValueError("OnnxConfig(group_query_attention=True) is ONNX Runtime's fused GroupQueryAttention, "
                             "which needs ort_fusions=True; set group_query_attention=False to keep standard ONNX ops")
        if self.external_data is not None:
            check_type("OnnxConfig", "external_data", self.external_data, bool)
