"""`OpenVINOConfig`: options of the OpenVINO backend."""

from __future__ import annotations

import dataclasses

from ...config import ExportConfig, check_choice, check_type

__all__ = ["OpenVINOConfig"]

INFERENCE_PRECISIONS = ("f32", "bf16", "f16", None)
KV_CACHE_PRECISIONS = ("f32", "bf16", "f16", "u8", None)


@dataclasses.dataclass
class OpenVINOConfig(ExportConfig):
    """Export to an `openvino.Model` (save with `.save("model.xml")`, run with `compile_model`).

    Args:
        inference_precision: the precision the CPU plugin runs in, recorded in the model's
            `rt_info` so a plain `compile_model(model, "CPU")` honours it. `"f32"` (default) keeps
            eager's numbers on CPUs where the plugin would otherwise pick bf16; `None` leaves the
            plugin's default.
        kv_cache_precision: the precision the CPU plugin stores a stateful model's KV cache in
            (`KV_CACHE_PRECISION`, recorded in `rt_info` like the inference precision). Default:
            the inference precision, so an fp32 export keeps an fp32 cache (the plugin's own
            default, u8, changes logits by ~1e-3 on a tiny Llama); `"u8"` halves the cache
            reads again at that cost.
        compress_to_fp16: store weights as fp16 in the saved `.bin`.
        stateful: a model whose cache leaves come back updated (a generation `decode`, static
            or dynamic cache) keeps its cache as OpenVINO variables named by the leaves
            (`cache.0.keys`), with a `beam_idx` input, as OpenVINO's stateful LLMs do (default);
            `False` keeps the cache as plain inputs and outputs (CLI `--stateless`). In an export
            folder (`export_to_folder`, the CLI), a stateful generation export of a decoder is one
            model for prefill and decode whose state grows with the tokens, laid out as OpenVINO
            GenAI's `LLMPipeline` takes it (`genai.py`); the seed's `export_for_generation` keeps
            its `prefill` and `decode` components unless `genai_layout=True` asks for that model.
        max_cache_len: the most tokens the growing state of a stateful generation export may
            hold (recorded under the component's `state`; `GenerationRunner` refuses more). A
            static-cache request (`--static-cache N`) on OpenVINO becomes this bound on the
            growing state; `None`: unbounded.
        genai_layout: that one stateful model (`genai.py`), set by an export folder's
            generation plan or asked for through `export_for_generation`: a fully masked attention row (a left-padded position) attends every key instead of
            coming out zero as in PyTorch, so OpenVINO GenAI's paged attention, which drops the
            mask, can take the model (`patches.fully_masked_rows_left_unzeroed`). Real tokens'
            outputs are unchanged.
    """

    export_format = "openvino"
    # measured with openvino 2026.4.1 (CPU plugin) on tiny:llama: float16 matches eager within 7e-4 relative;
    # a bfloat16 model converts, but its logits differ from eager's by several times their scale
    refused_dtypes = {"bfloat16": "OpenVINO's conversion of a bfloat16 model gives logits far from eager's "
                                  "(several times their scale on a tiny Llama); a float32 export with "
                                  "OpenVINOConfig(inference_precision='bf16') runs in bfloat16 on the CPU plugin"}

    inference_precision: str | None = "f32"
    kv_cache_precision: str | None = None
    compress_to_fp16: bool = False
    stateful: bool = True
    max_cache_len: int | None = None
    genai_layout: bool = False

    def _validate(self) -> None:
        check_choice("OpenVINOConfig", "inference_precision", self.inference_precision, INFERENCE_PRECISIONS)
        check_choice("OpenVINOConfig", "kv_cache_precision", self.kv_cache_precision, KV_CACHE_PRECISIONS)
        check_type("OpenVINOConfig", "compress_to_fp16", self.compress_to_fp16, bool)
        check_type("OpenVINOConfig", "stateful", self.stateful, bool)
        check_type("OpenVINOConfig", "genai_layout", self.genai_layout, bool)
        if self.max_cache_len is not None and (isinstance(self.max_cache_len, bool)
                                               or not isinstance(self.max_cache_len, int) or self.max_cache_len < 2):
            raise ValueError(f"OpenVINOConfig.max_cache_len is a number of tokens >= 2 or None; got {self.max_cache_len!r}")
