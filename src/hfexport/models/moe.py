"""MoE experts (transformers' `integrations.moe`): formulations each converter can take.

Under `torch.export` with fp32 weights transformers routes `grouped_mm` to its custom op
`transformers::grouped_mm_fallback` (a Python loop over experts, opaque to tracing), which
torch.onnx and OpenVINO do not know.

- ONNX: the dispatcher `_grouped_mm` is swapped for the same product in plain ATen ops
  (`grouped_mm_dense`), so the grouped formulation converts as is.
- OpenVINO: its converter also lacks `histc`/`empty_permuted` from the grouped routing, so the
  experts switch to transformers' own `batched_mm` implementation (gather each row's expert
  weights, one `bmm`), which it converts. ExecuTorch does the same.

# NOTE: the formulation multiplies every row by every expert's weight and then picks, per row,
# its own expert's result (`gather`). That costs `num_experts` times the FLOPs of a true grouped
# matmul but keeps memory at `num_experts x rows x out_dim` and needs no loop construct; the
# alternative (gathering each row's weight matrix) needs `rows x in_dim x out_dim` memory, which
# is far worse for prefill. A real grouped kernel (ONNX Loop / OpenVINO's MoE op) is future work.
"""

from __future__ import annotations

import torch

from ..workarounds import register_patch

__all__ = ["grouped_mm_dense", "patch_transformers_moe_grouped_mm", "patch_transformers_experts_interface"]


def grouped_mm_dense(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """`out[s] = input[s] @ weight[expert(s)]`, where `expert(s)` is the group `offs` puts row `s` in.

    Args:
        input: `(S, K)`, rows sorted by expert.
        weight: `(E, K, N)`.
        offs: `(E,)` cumulative row counts; rows at or past `offs[-1]` give zeros.
    """
    input = input.to(weight.dtype)
    rows = torch.arange(input.shape[0], device=input.device)
    expert = (offs.unsqueeze(0) <= rows.unsqueeze(1)).sum(dim=1)  # (S,) in [0, E]
    valid = expert < weight.shape[0]
    expert = expert.clamp(max=weight.shape[0] - 1)
    every = torch.matmul(input.unsqueeze(0), weight)  # (E, S, N)
    index = expert.view(1, -1, 1).expand(1, input.shape[0], weight.shape[2])
    picked = every.gather(0, index).squeeze(0)  # (S, N)
    return torch.where(valid.unsqueeze(1), picked, torch.zeros_like(picked))


@register_patch(
    ("onnx",),
    "transformers.integrations.moe._grouped_mm",
    reason="with fp32 weights under torch.export transformers calls its custom op "
    "transformers::grouped_mm_fallback, which torch.onnx cannot convert; trace the grouped matmul "
    "as plain ATen ops instead; remove once torch.onnx translates grouped_mm (or transformers stops using the custom op in export)",
    upstream="not filed upstream for transformers::grouped_mm_fallback (searched microsoft/onnxscript, "
    "pytorch/pytorch and huggingface/transformers issues); the aten._grouped_mm counterpart is "
    "microsoft/onnxscript#2795 (closed)",
    seen_with={"transformers": "5.24.0", "torch": "2.13.0"},
    remove_when="torch>2.13.0",
)
def patch_transformers_moe_grouped_mm(original):
    """transformers' `_grouped_mm` as a dense gather-and-multiply that torch.onnx converts."""
    def _grouped_mm(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return grouped_mm_dense(input, weight, offs)

    return _grouped_mm


@register_patch(
    ("openvino", "executorch"),
    "transformers.integrations.moe.ExpertsInterface.get_interface",
    reason="the grouped_mm experts route tokens with histc/empty_permuted and the grouped_mm custom op, which "
    "OpenVINO's PyTorch frontend cannot convert and XNNPACK cannot run; use transformers' batched_mm experts "
    "(a gather and one bmm) instead, the route the README documents for ExecuTorch; remove once OpenVINO converts aten.histc and aten.empty_permuted",
    upstream="aten.histc: openvinotoolkit/openvino#37796 (open PR adding it, for #29699); aten.empty_permuted: "
    "not filed (searched openvinotoolkit/openvino issues, none matches); OpenVINO PyTorch FE has no conversion "
    "rule for either (seen 2026.4.1)",
    seen_with={"transformers": "5.24.0", "openvino": "2026.4.1"},
    remove_when="openvino>2026.4.1",
)
def patch_transformers_experts_interface(original):
    """The experts interface answering `batched_mm` where the graph would use `grouped_mm`."""
    def get_interface(self, experts_implementation, default):
        if experts_implementation == "grouped_mm":
            experts_implementation = "batched_mm"
        return original(self, experts_implementation, default)

    return get_interface
