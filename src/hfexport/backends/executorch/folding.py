"""Weight-only computations folded into constants before ExecuTorch partitions the program.

A model that derives a tensor from its weights at every call (Mamba's `A = -exp(A_log)`) hands
XNNPACK a chain `exp(x[..., None] * -exp(w))` in which the broadcast operand is an intermediate of
the delegate instead of a weight. With a dynamic batch, such a delegate run first at batch 1 and then
at batch 3 writes outside its buffers (glibc: `double free or corruption`; inside a larger program:
rows 1.. of the result wrong, row 0 right), while a freshly loaded program run at batch 3 is right.
Measured with executorch 1.4.1 on the minimal module in
`tests/backends/executorch/test_exporter.py::test_weight_only_math_is_folded`; with the weight
expression folded into a constant the same delegate is right in any order of batch sizes.

Folding is ExecuTorch's own `constant_prop_pass`, run on the edge program (its default skip list
keeps `full` and the quantize/dequantize primitives, so quantized weights stay in their Q/DQ form).
It also removes the per-call work: the folded ops no longer run at all.
"""

from __future__ import annotations

from typing import Any

__all__ = ["fold_weight_only_math"]


def fold_weight_only_math() -> Any:
    """An `ExportedProgramPassBase` for `to_edge_transform_and_lower(transform_passes=[...])`."""
    from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
    from executorch.exir.passes.constant_prop_pass import constant_prop_pass

    class FoldWeightOnlyMath(ExportedProgramPassBase):
        def call(self, exported_program):
            before = len(exported_program.graph.nodes)
            # an output that folds to a constant gets a copy node: the edge dialect's dim-order copy
            # (`_skip_dim_order=False`, as the edge program is built), not `aten.clone`, which the
            # dim-order verifier rejects (MistralForCausalLM's sliding-window output)
            program = constant_prop_pass(exported_program, _skip_dim_order=False)
            return ExportedProgramPassResult(program, len(program.graph.nodes) != before)

    return FoldWeightOnlyMath()
