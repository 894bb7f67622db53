"""Readable names for a program's inputs, outputs and symbolic dimensions.

Cache leaves get names that pair up across inputs and outputs (`cache.0.keys`), whatever the
forward calls its cache argument (`cache`, `past_key_values`) or output field. Runtimes with
named I/O (ONNX, OpenVINO) prefix them `input.` / `output.` so a cache tensor fed in and its
updated value coming out form a pair. Symbolic dimensions are named by their role (`batch`,
`sequence`, `cache_length`) instead of `s0`, `s1`.
"""

from __future__ import annotations

import re
from typing import Any

import torch.utils._pytree as pytree

from .pytree import _is_cache, _key_name

__all__ = ["io_leaf_names", "dim_names", "role_of", "CACHE_PREFIX", "INTERFACE_CACHE_NAME",
           "with_interface_cache_name"]

CACHE_PREFIX = "cache"

#: The cache argument's name in exported interfaces (the seed's); transformers 5.24 calls it `cache`.
INTERFACE_CACHE_NAME = "past_key_values"


def with_interface_cache_name(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with a `cache` argument renamed `past_key_values` (order kept)."""
    if "cache" in kwargs and INTERFACE_CACHE_NAME not in kwargs:
        return {(INTERFACE_CACHE_NAME if k == "cache" else k): v for k, v in kwargs.items()}
    return kwargs


def io_leaf_names(tree: dict[str, Any] | Any, *, side: str | None = None) -> list[str]:
    """Name every leaf of `tree` (a kwargs dict or a model output); cache leaves become
    `cache.<layer>.<tensor>`, prefixed `input.`/`output.` when `side` is given."""
    pairs, _ = pytree.tree_flatten_with_path(tree, is_leaf=lambda x: False)
    caches = _top_level_caches(tree)
    names = []
    for path, _leaf in pairs:
        parts = [_key_name(k) for k in path]
        if parts and parts[0] in caches:
            name = ".".join([CACHE_PREFIX, *parts[1:]])
            names.append(f"{side}.{name}" if side else name)
        else:
            names.append(".".join(parts) or "output")
    return names


def _top_level_caches(tree: Any) -> set[str]:
    if hasattr(tree, "items"):
        return {str(k) for k, v in tree.items() if _is_cache(v)}
    return set()


_ROLES_BY_NAME = {
    "input_ids": ("batch", "sequence"),
    "attention_mask": ("batch", "sequence"),
    "token_type_ids": ("batch", "sequence"),
    "position_ids": ("batch", "sequence"),
    "inputs_embeds": ("batch", "sequence", None),
    "decoder_input_ids": ("batch", "decoder_sequence"),
    "decoder_attention_mask": ("batch", "decoder_sequence"),
    "pixel_values": ("batch", "channels", "height", "width"),
    "input_features": ("batch", "features", "frames"),
    "input_values": ("batch", "samples"),
    "cache_position": ("sequence",),
    "last_hidden_state": ("batch", "encoder_sequence", None),  # an encoder-decoder's `encoder_outputs`
    "encoder_hidden_states": ("batch", "encoder_sequence", None),
    "grid_thw": ("images", "grid"),  # Qwen2-VL's vision tower: one (t, h, w) row per image
    "image_grid_thw": ("images", "grid"),
}
# Vision towers that take flattened patches, `(patches, C*T*P*P)`, name them as below (Qwen2-VL).
_PATCH_INPUTS = ("pixel_values", "pixel_values_videos", "hidden_states")
_CACHE_ROLES = ("batch", "heads", "cache_length", None)
#: A recurrent state (SSM / linear-attention layers: `conv_states` `[batch, channels, kernel]`,
#: `recurrent_states` `[batch, channels, state]`): one row per sequence; the other axes are sized by
#: the weights (a conv_state wider than the kernel is not a state the model can take).
_STATE_ROLES = ("batch", "state", "state")


def role_of(leaf_name: str, rank: int, axis: int) -> str | None:
    """The role of `axis` of input leaf `leaf_name` (`batch`, `sequence`, `cache_length`, ...)."""
    roles = _roles(leaf_name, rank)
    return roles[axis] if axis < len(roles) else None


def _roles(leaf_name: str, rank: int) -> tuple[str | None, ...]:
    if leaf_name.split(".")[0] in (CACHE_PREFIX, "input", "output") and rank in (2, 3, 4):
        return _CACHE_ROLES if rank == 4 else _STATE_ROLES[:rank]
    if leaf_name.endswith("attention_mask") and rank == 4:  # [batch, 1, query, keys] (a static cache's mask)
        return ("batch", None, "sequence", "cache_length")
    if leaf_name.split(".")[-1] in _PATCH_INPUTS and rank == 2:
        return ("patches", "patch_features")
    roles = _ROLES_BY_NAME.get(leaf_name.split(".")[-1], ())
    return tuple(roles) + (None,) * max(0, rank - len(roles))


def dim_names(names: list[str], shapes: list[tuple[int | str, ...]]) -> dict[str, str]:
    """Map each symbol (`s0`) to a readable, unique name, from the first input dim that uses it.

    A symbol first seen at a role another symbol already took gets the leaf's name in front
    (`attention_mask_batch`), so two different sizes never share a name.
    """
    mapping: dict[str, str] = {}
    taken: set[str] = set()
    for name, shape in zip(names, shapes):
        clean = name.removeprefix("input.")
        for axis, (dim, role) in enumerate(zip(shape, _roles(clean, len(shape)))):
            if not (isinstance(dim, str) and dim.isidentifier()) or dim in mapping:
                continue
            base = role or f"{clean.replace('.', '_')}_dim{axis}"
            readable = base if base not in taken else f"{clean.replace('.', '_')}_{base}"
            while readable in taken:
                readable += "_"
            mapping[dim] = readable
            taken.add(readable)
    return mapping


def rename_expression(expression: str, mapping: dict[str, str]) -> str:
    """`"s0 + 1"` -> `"sequence + 1"`."""
    return re.sub(r"\b[a-z]+\d+\b", lambda m: mapping.get(m.group(0), m.group(0)), expression)
