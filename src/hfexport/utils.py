"""Helpers documented under `hfexport.utils` (a facade over where they live)."""

from .capture.pytree import register_pytree_node
from .generation.decompose import decompose_for_generation
from .validation.driver import validate

__all__ = ["decompose_for_generation", "register_pytree_node", "validate"]
