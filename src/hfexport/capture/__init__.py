"""The capture step shared by every backend: inputs, dynamic-shape plan, pytree, `torch.export`."""

from .capture import Capture, apply_fx_fixes, capture
from .dynamic import plan_dynamic_shapes
from .prepare import check_attention, inference_mode, normalize_inputs
from .pytree import flatten_with_names, leaf_names, register_cache_pytree_nodes, register_pytree_node

__all__ = [
    "Capture",
    "capture",
    "apply_fx_fixes",
    "plan_dynamic_shapes",
    "check_attention",
    "inference_mode",
    "normalize_inputs",
    "flatten_with_names",
    "leaf_names",
    "register_cache_pytree_nodes",
    "register_pytree_node",
]
