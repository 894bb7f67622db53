"""Patches and FX fixes for the ONNX backend.

ATen ops torch.onnx does not translate get a translation in `translations.py`; the workarounds
every format needs are in `hfexport/models/` (`hfexport patches --format onnx` lists them).
"""

from __future__ import annotations

import functools

from ...workarounds import register_patch
from .decomposition import is_decomposed_for

__all__ = ["patch_torch_onnx_decompose_once"]


@register_patch(
    ("onnx",),
    "torch.onnx._internal.exporter._fx_passes.decompose_with_registry",
    reason="torch.onnx retraces every program it converts with run_decompositions; a program that writes "
    "its inputs in place (a static cache) was already retraced at capture to functionalize it, so it was "
    "retraced twice (4 + 6 s on an 8-layer Llama). The ONNX exporter now functionalizes it with torch.onnx's "
    "own decomposition table (decomposition.decomposed_for_onnx), and torch.onnx takes a program so "
    "decomposed for its registry as it is; the ONNX graph is the same. Remove once torch.onnx can be "
    "given a program it need not decompose",
    upstream="torch 2.13.0 torch/onnx/_internal/exporter/_core.py _prepare_exported_program_for_export "
    "(decompose_with_registry on every program, decomposed or not)",
    seen_with={"torch": "2.13.0"},
    remove_when="torch>2.13.0",
)
def patch_torch_onnx_decompose_once(original):
    """`decompose_with_registry` that returns a program `decomposed_for_onnx` made for this
    registry's table unchanged, and decomposes any other."""
    @functools.wraps(original)
    def decompose_with_registry(exported_program, registry):
        if is_decomposed_for(exported_program, registry):
            return exported_program
        return original(exported_program, registry)

    return decompose_with_registry
