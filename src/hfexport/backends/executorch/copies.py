"""Identity copies removed before ExecuTorch partitions the program.

hfexport's view-or-copy patches (`models/view_or_copy.py`) and transformers' own `contiguous()`
calls leave `clone`s in the graph that copy a tensor into the layout it already has. XNNPACK
removes such clones inside a partition, and where the clone's result leaves the partition beside
its input, the partition then lists one node twice among its outputs, which its preprocessing
refuses: BLOOM's decode with a growing cache (the updated key cache returned as the cache output
and, through four identity clones, fed to the attention's `baddbmm` outside the delegate) failed
with "Output node 'aten_cat_default' is already in the inputs" (executorch 1.4.1
`backends/xnnpack/xnnpack_preprocess.py`, `generate_node_to_external_map`). Removed from the
whole program before partitioning (ExecuTorch's own `RemoveCloneOpsTransform`), a consumer reads
the copied tensor itself; the portable kernels also stop copying. A clone that feeds the
program's outputs stays: an output must not be another output or an input. A clone between a
dequantize and a quantize leaves the two adjacent, and the pair goes too, as XNNPACK's own removal
does (`eliminate_quant_dequant_pairs`): left in, a statically quantized BERT's program crashed the
process (SIGSEGV in XNNPACK).
"""

from __future__ import annotations

from typing import Any

__all__ = ["drop_identity_copies"]


def drop_identity_copies() -> Any:
    """A pass for `to_edge_transform_and_lower(transform_passes=[...])` (see the module note)."""
    # read from executorch 1.4.1: backends/transforms/remove_clone_ops.py (a clone is an identity
    # when its dim order or memory format is its input's; `_is_input_output_copy` decides which
    # identity clones stay)
    from executorch.backends.transforms.remove_clone_ops import RemoveCloneOpsTransform

    class DropIdentityCopies(RemoveCloneOpsTransform):
        def _is_input_output_copy(self, node) -> bool:
            return any(user.op == "output" for user in node.users)

    return DropIdentityCopies(preserve_input_output_copies=True, eliminate_quant_dequant_pairs=True)
