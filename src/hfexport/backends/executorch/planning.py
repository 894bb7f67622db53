"""ExecuTorch memory planning: views bounded by their base, and a check that the plan is coherent.

ExecuTorch plans every dynamic tensor at its upper bound (each dim's expression bounded over the
symbols' ranges), and a `view` shares its base's storage: memory planning places the base, and the
view is emitted at the base's offset with its own upper-bound sizes. The two bounds are computed
independently, so a view whose sizes are an expression over *other* symbols can be bounded far above
its base. Whisper's cross-attention does it: the encoder states `[b_enc, frames, d]` are viewed as
`[b, (b_enc * frames) // b, heads, head_dim]`; `b_enc * frames // b` is bounded at
`max(b_enc) * max(frames) / 1`, so the view's bound was 8x its base's and ran past the arena.
The program then fails to *load* (`hierarchical_allocator.h: offset_bytes + size_bytes >= allocator
size`, error 0x21), long after export said it succeeded.

A view has exactly its base's element count at run time, and ExecuTorch's runtime checks only the
element count against a bounded tensor's capacity when it resizes one (`TensorImpl::internal_resize`:
`new_numel <= numel_bound_`), so capping the view's bound at its base's is exact. `check_plan` then
refuses a program with a view still larger than its base (it would overlap the tensors planned after
the base: wrong numbers, silently) or a tensor past the arena its plan declares (a load failure), so
such a plan fails at export, naming the tensor.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.fx.passes.infra.pass_base import PassBase, PassResult

__all__ = ["ViewsBoundedByBase", "check_plan"]


def _is_constant(size: Any) -> bool:
    return isinstance(size, int) or size.node.expr.is_number


class ViewsBoundedByBase(PassBase):
    """ExecuTorch's `ConstraintBasedSymShapeEvalPass` (each spec's shape at its upper bound), then every
    `memory.view` whose bound holds more elements than its base's capped at the base's.

    Given to `ExecutorchBackendConfig(sym_shape_eval_pass=...)`, where ExecuTorch runs it after it has
    turned `view_copy` into views and before memory planning. `capped` lists the views it changed
    (`name: [old bound] -> [new bound]`). The capped bound keeps the view's constant dims and puts the
    rest of the base's element count in its first dynamic dim (the runtime resizes the view to its real
    sizes on every call; only the element count is a capacity).
    """

    def __init__(self) -> None:
        super().__init__()
        from executorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass

        self.upper_bounds = ConstraintBasedSymShapeEvalPass()
        self.capped: list[str] = []

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        """Bound every symbolic size (ExecuTorch's own pass), then cap each view's bound at its base's."""
        from executorch.exir import memory

        self.upper_bounds(graph_module)
        for module in graph_module.modules():
            if not isinstance(module, torch.fx.GraphModule):
                continue
            for node in module.graph.nodes:
                if node.target is memory.view and (before := _cap(node)):
                    self.capped.append(f"{node.name}: {before} -> {node.meta['spec'].shape}")
        return PassResult(graph_module, True)


def _cap(node: torch.fx.Node) -> list[int] | None:
    """Cap `node`'s (a view's) bound at its base's element count; return the bound it had, or None."""
    from executorch.exir.tensor import contiguous_stride_from_shape

    spec, base = node.meta["spec"], node.args[0].meta["spec"]
    capacity = math.prod(base.shape)
    if math.prod(spec.shape) <= capacity:
        return None
    constant = [_is_constant(size) for size in node.meta["val"].shape]
    fixed = math.prod(size for size, keep in zip(spec.shape, constant) if keep)
    if all(constant) or fixed == 0 or capacity % fixed:
        return None  # left to check_plan, which names it
    before, first = list(spec.shape), constant.index(False)
    shape = [size if keep else 1 for size, keep in zip(spec.shape, constant)]
    shape[first] = capacity // fixed
    spec.shape = shape
    spec.stride = contiguous_stride_from_shape(torch.Size(shape))
    return before


def check_plan(program: Any) -> list[str]:
    """What in the memory plan of `program` (an `ExecutorchProgramManager`) the runtime would read or
    write outside its storage: a view bounded above its base (it overlaps whatever is planned after
    the base), a tensor ending past the arena its plan declares (the program fails to load). Each as
    `method: node [bound] dtype ...`; empty when the plan is coherent."""
    from executorch.exir import memory

    problems = []
    for method in program.methods:
        arenas = next(plan.non_const_buffer_sizes for plan in program.executorch_program.execution_plan
                      if plan.name == method)
        for node in program.exported_program(method).graph.nodes:
            specs = node.meta.get("spec")
            for spec in specs if isinstance(specs, (list, tuple)) else [specs]:
                if getattr(spec, "mem_id", None) is None or getattr(spec, "mem_offset", None) is None:
                    continue
                where = f"{method}: {node.name} {list(spec.shape)} {spec.dtype}"
                if node.target is memory.view and spec.nbytes() > (base := node.args[0].meta["spec"]).nbytes():
                    problems.append(f"{where} is a view of {spec.nbytes()} bytes over a base of {base.nbytes()}")
                end = spec.mem_offset + spec.nbytes()
                if spec.mem_id >= len(arenas) or end > arenas[spec.mem_id]:
                    arena = arenas[spec.mem_id] if spec.mem_id < len(arenas) else "missing"
                    problems.append(f"{where} ends at {end}, past arena {spec.mem_id} ({arena} bytes)")
    return problems
