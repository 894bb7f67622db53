"""A model that builds its mask from a 2-D padding mask over a static cache, under `torch.export`.

With a static cache `generate` hands most models precomputed 4-D masks, which `create_causal_mask`
returns as they are. BLOOM's `create_masks_for_generate` instead hands it a 2-D padding mask over
the whole cache (its alibi is built from it), so its forward builds the 4-D mask itself, and two
things in transformers 5.24 then fix sizes the program would otherwise take at any value:

`StaticLayer.get_mask_sizes` returns `self.max_cache_len`, a Python int of the layer. A model that
builds its 4-D mask inside the forward from a 2-D padding mask over a static cache (BLOOM, whose
`create_masks_for_generate` hands it such a mask to build its alibi from) then makes a mask of
that constant length and adds it to scores over the cache tensor's own length: traced, every
cache length is fixed at `max_cache_len`, although the program would take any cache length
(hfexport keeps it symbolic, resizable at load). The patch reads the length from the allocated
key buffer, the same number in eager and the symbolic length in a trace.

`create_causal_mask` computes `allow_is_causal_skip and not (cache.is_compileable and q_length == 1)`,
which guards a symbolic query length on not being 1 (a prefill traced at 8 tokens refuses one).
The skip it decides is never taken under `torch.export` (`_ignore_causal_mask_sdpa` returns False
while exporting), so passing `allow_is_causal_skip=False` there changes no mask and short-circuits
the comparison.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..workarounds import register_patch

__all__ = ["patch_static_layer_mask_sizes", "patch_bloom_causal_mask_skip"]


@register_patch(
    ("dynamo", "onnx", "openvino", "executorch"),
    "transformers.cache_utils.StaticLayer.get_mask_sizes",
    reason="StaticLayer.get_mask_sizes returns max_cache_len, a Python int, so a mask built inside the forward "
    "from a 2-D mask over a static cache (BLOOM) fixes every cache length at it in a trace; the allocated "
    "buffer's own length is the same number in eager and symbolic when traced",
    upstream="transformers 5.24 cache_utils.StaticLayer.get_mask_sizes (searched the transformers issues for "
    "'get_mask_sizes max_cache_len export dynamic': nothing filed; the static cache's length is treated "
    "as a compile-time constant there by design)",
    seen_with={"transformers": "5.24.0"},
    remove_when="transformers>5.24.0",
)
def patch_static_layer_mask_sizes(original: Callable[..., Any]) -> Callable[..., Any]:
    """`get_mask_sizes` with the key length read from the allocated key buffer."""
    def get_mask_sizes(self: Any, query_length: int) -> tuple[Any, int]:
        length, offset = original(self, query_length)
        keys = getattr(self, "keys", None)
        if getattr(self, "is_initialized", False) and keys is not None and keys.dim() >= 2:
            return keys.shape[-2], offset
        return length, offset

    return get_mask_sizes


@register_patch(
    ("dynamo", "onnx", "openvino", "executorch"),
    "transformers.models.bloom.modeling_bloom.create_causal_mask",
    reason="create_causal_mask compares the query length with 1 to decide an SDPA skip that is never taken "
    "while exporting, which guards a symbolic query length on not being 1 (BLOOM with a static cache, "
    "whose 2-D mask makes it build its mask in the forward); the skip is turned off while exporting",
    upstream="transformers 5.24 masking_utils.create_causal_mask, the `allow_is_causal_skip` line (searched the "
    "transformers issues for 'allow_is_causal_skip q_length == 1 export': nothing filed)",
    seen_with={"transformers": "5.24.0", "torch": "2.13.0"},
    remove_when="transformers>5.24.0",
)
def patch_bloom_causal_mask_skip(original: Callable[..., Any]) -> Callable[..., Any]:
    """BLOOM's `create_causal_mask` with the SDPA skip off while exporting."""
    def create_causal_mask(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_exporting():
            kwargs["allow_is_causal_skip"] = False
        return original(*args, **kwargs)

    return create_causal_mask
