"""Helpers the seed imports from `hfexport.utils` (a facade over where they live)."""

from .capture.pytree import register_pytree_node
from .validation import validate

__all__ = ["register_pytree_node", "validate"]
