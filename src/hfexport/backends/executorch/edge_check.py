"""ExecuTorch's check of the edge program, run once instead of at every graph the lowering builds.

# NOTE: with its default `EdgeCompileConfig(_check_ir_validity=True)`, ExecuTorch verifies the edge
# program each time the lowering builds an `ExportedProgram` (after the decompositions, each
# transform pass, the partitioner's retraces): a tiny Llama's lowering ran the verifier's dtype check
# (`_check_tensor_args_matching_op_allowed_dtype`) over 28 distinct graphs 36 times, 6.8 of its 47 s
# (executorch 1.4.1, measured by wrapping the function). XNNPACK's own edge config
# (`backends/xnnpack/utils/configs.py`, `get_xnnpack_edge_compile_config`) and ExecuTorch's LLM builder
# (`extension/llm/export/builder.py`) lower with the check off. hfexport does too, and runs the one
# part the runtime would otherwise report only when a method is called (an op handed tensors of
# dtypes its kernels do not take) once, on the program as partitioned: the last transform pass.
# The op check (every op an edge op, core ATen or kept by a partitioner) is left to `to_executorch`,
# which refuses an op without an out variant by name.
"""

from __future__ import annotations

from typing import Any

__all__ = ["edge_compile_config", "checked_dtypes"]


def edge_compile_config() -> Any:
    """The `EdgeCompileConfig` of every lowering: ExecuTorch's IR checks off (see the module note)."""
    from executorch.exir import EdgeCompileConfig

    return EdgeCompileConfig(_check_ir_validity=False)


def checked_dtypes() -> Any:
    """An `ExportedProgramPassBase` for `to_edge_transform_and_lower(transform_passes=[..., this])`:
    raises ExecuTorch's `SpecViolationError` naming each op whose tensor arguments' dtypes its
    kernels do not take; changes nothing."""
    # read from executorch 1.4.1: exir/verification/verifier.py (what `_EXIREdgeDialectVerifier.
    # check_additional` runs when `_check_ir_validity` is on)
    from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
    from executorch.exir.verification.verifier import _check_tensor_args_matching_op_allowed_dtype

    class CheckedDtypes(ExportedProgramPassBase):
        def call(self, exported_program):
            _check_tensor_args_matching_op_allowed_dtype(exported_program.graph_module)
            return ExportedProgramPassResult(exported_program, False)

    return CheckedDtypes()
