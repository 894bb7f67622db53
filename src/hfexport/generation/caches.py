"""The caches generation runs with: the kwarg names a cache goes by, full-length layers where
transformers would build window-sized ones (`full_length_caches`: the export and validation's eager
runs build the same caches), and the scalars of the empty cache a runner starts from."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..capture.names import io_leaf_names
from ..capture.pytree import is_static_cache

__all__ = ["CACHE_KEYS", "full_length_caches", "initial_cache"]

#: The forward kwargs a cache goes by (transformers 5.24's `cache`, the long-standing
#: `past_key_values`, Mamba's `cache_params`).
CACHE_KEYS = ("cache", "past_key_values", "cache_params")


@contextlib.contextmanager
def full_length_caches() -> Iterator[None]:
    """Caches that `generate` (or a forward without a cache) builds while this is active keep
    every token in sliding-window and chunked layers (a `DynamicLayer` / `StaticLayer` where transformers would use a window-sized
    layer); the masks still apply the window.

    # NOTE: sliding-window layers are exported with a full key-value cache (the mask applies the window). A window-sized
    # layer gives each layer type its own cache length (a runner would allocate several shapes),
    # caps a dynamic cache's length at the window (a decode step traced on a short prompt is then
    # guarded on that one length), and makes the prefill take the window as a tensor input
    # (`_sliding_window_tensor`), which a caller would have to know to feed. Read from
    # transformers 5.24 `cache_utils.{DYNAMIC,STATIC}_LAYER_TYPE_MAPPING`, which `DynamicCache` and
    # `StaticCache` look layer classes up in when they are built.
    """
    from transformers import cache_utils

    full = [
        (cache_utils.DYNAMIC_LAYER_TYPE_MAPPING, {
            "sliding_attention": cache_utils.DynamicLayer, "chunked_attention": cache_utils.DynamicLayer,
            "hybrid_sliding": cache_utils.LinearAttentionAndFullAttentionLayer}),
        (cache_utils.STATIC_LAYER_TYPE_MAPPING, {
            "sliding_attention": cache_utils.StaticLayer, "chunked_attention": cache_utils.StaticLayer,
            "hybrid_sliding": cache_utils.LinearAttentionAndStaticFullAttentionLayer}),
    ]
    saved = [(mapping, key, mapping.get(key)) for mapping, swaps in full for key in swaps]
    try:
        for mapping, swaps in full:
            for key, layer in swaps.items():
                if key in mapping:
                    mapping[key] = layer
        yield
    finally:
        for mapping, key, layer in saved:
            if layer is not None:
                mapping[key] = layer


def initial_cache(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The scalar leaves of the empty cache generation starts from, by leaf name
    (`cache.0.cumulative_length`: 0, `cache.0._sliding_window_tensor`: 4).

    A runner allocates the large buffers itself (zeros of the recorded shapes); these small ones
    carry values it cannot guess. A static cache is `reset()` first, as the README's Dynamo loop resets the
    program's own template: its write counters start at 0 whatever the capture left in them.
    """
    key = next((k for k in CACHE_KEYS if k in kwargs), None)
    if key is None:
        return {}
    cache = copy.deepcopy(kwargs[key])
    if is_static_cache(cache):
        cache.reset()
    tree = {key: cache}
    leaves = pytree.tree_leaves(tree)
    return {name: leaf.tolist() for name, leaf in zip(io_leaf_names(tree), leaves)
            if isinstance(leaf, torch.Tensor) and leaf.numel() <= 1}
