"""Generation components: split what `generate()` runs into independently exported graphs."""

from .decompose import decompose_for_generation

__all__ = ["decompose_for_generation"]
