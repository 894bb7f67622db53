"""Custom ATen → ONNX translations, passed to torch.onnx as its `custom_translation_table`."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["translation_table"]


def translation_table() -> dict[Callable, Callable]:
    """The table of translations for ops torch.onnx does not convert (none needed yet)."""
    return {}
