"""What a node or value of an ONNX IR graph holds, read the same way by every rewrite that matches on it
(`cache_writes.py`, the GQA rewrite)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["transpose_perm", "constant_array"]


def transpose_perm(node: Any) -> list[int] | None:
    """The `perm` attribute of the Transpose `node` as a list, or None where it has none."""
    attribute = node.attributes.get("perm")
    return list(attribute.value) if attribute is not None else None


def constant_array(value: Any) -> np.ndarray | None:
    """The array `value` holds where it is constant (an initializer, or a `Constant` node's output), else None."""
    if value is None:
        return None
    if value.const_value is not None:
        return value.const_value.numpy()
    node = value.producer()
    if node is not None and node.op_type == "Constant" and "value" in node.attributes:
        return node.attributes["value"].value.numpy()
    return None
