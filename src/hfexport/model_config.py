"""Reading a transformers model config the same way everywhere."""

from __future__ import annotations

from typing import Any

__all__ = ["text_config"]


def text_config(config: Any) -> Any:
    """The text decoder's config of a composite model's `config` (a vision-language model's
    `text_config`), or `config` itself (a text model's, or None)."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
