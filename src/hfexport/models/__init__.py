"""Model-family workarounds (`models/<family>.py`), kept apart from the backends.

Each module registers patches or fixes for one family or one transformers integration; importing
this package registers them all (the exporter does so before it applies them).
"""

from . import attention, batched_matmul, conv, linear_attention, moe, qwen2_vl, static_cache, swin, view_or_copy  # noqa: F401
