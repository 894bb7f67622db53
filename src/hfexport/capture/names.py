"""Readable names for a program's inputs, outputs and symbolic dimensions.

Cache leaves get names that pair up across inputs and outputs (`cache.0.keys`), whatever the
forward calls its cache argument (`cache`, `past_key_values`) or output field. Runtimes with
named I/O (ONNX, OpenVINO) prefix them `input.` / `output.` so a cache tensor fed in and its
updated value coming out form a pair. Symbolic dimensions are named by their role (`batch`,
`sequence`, `cache_length`) instead of `s0`, `s1`.

# NOTE: a name stands for a dimension of the interface, not for a `torch.export` symbol. The
# program ties two axes only where an op checks them against each other; scaled-dot-product
# attention never checks the values' length against the keys' (torch 2.13's fake kernel
# `_scaled_dot_product_flash_attention_for_cpu` reads neither), so a cache's keys and values
# trace as `s10` and `s0` though a valid cache always has them equal, and a mask that broadcasts
# over the batch keeps a batch symbol of its own. Naming each symbol apart would tell a caller
# sizing buffers from ONNX metadata that there are several cache lengths. `dim_names` gives one
# name to the symbols every valid call sizes alike (`_same_size`: structural facts about caches
# and batches), and keeps the leaf-prefixed names for sizes that may really differ (a sliding
# layer's cache beside a full one's).
"""

from __future__ import annotations

import re
from typing import Any

import torch.utils._pytree as pytree

from .pytree import is_cache_object, key_name

__all__ = ["io_leaf_names", "dim_names", "role_of", "CACHE_PREFIX", "INTERFACE_CACHE_NAME",
           "with_interface_cache_name"]

CACHE_PREFIX = "cache"
#: The role of a static cache's mask's last axis: the slots attention reads, from the tokens
#: cached plus the query up to the cache's length (`generation/attended.py`).
ATTENDED_ROLE = "attended"

#: The cache argument's name in exported interfaces (its long-standing name); transformers 5.24 calls it `cache`.
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
        parts = [key_name(k) for k in path]
        if parts and parts[0] in caches:
            name = ".".join([CACHE_PREFIX, *parts[1:]])
            names.append(f"{side}.{name}" if side else name)
        else:
            names.append(".".join(parts) or "output")
    return names


def _top_level_caches(tree: Any) -> set[str]:
    if hasattr(tree, "items"):
        return {str(k) for k, v in tree.items() if is_cache_object(v)}
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
    "feature_attention_mask": ("batch", "frames"),  # an audio-text LLM's per-frame mask (Qwen2-Audio's)
    "input_values": ("batch", "samples"),
    "cache_position": ("sequence",),
    "last_hidden_state": ("batch", "encoder_sequence", None),  # an encoder-decoder's `encoder_outputs`
    "encoder_hidden_states": ("batch", "encoder_sequence", None),
    "grid_thw": ("images", "grid"),  # Qwen2-VL's vision tower: one (t, h, w) row per image
    "image_grid_thw": ("images", "grid"),
    "mm_token_type_ids": ("batch", "sequence"),  # Qwen2-VL: which tokens are image tokens
    # Qwen2-VL's merger as OpenVINO GenAI's VLMPipeline feeds it: rows' and columns' rotary angles per patch
    "rotary_pos_emb": ("patches", "head_dim"),
}
#: Rank-3 hidden states a generation component takes (`decompose_for_generation`): the head's
#: (`nn.Linear.forward(input)`), the language model's output, one row per position; a projector's,
#: the vision tower's output, one row per patch of each image. Their last axis is the weights'.
_HIDDEN_STATES = {
    "input": ("batch", "sequence", None),
    "hidden_states": ("batch", "sequence", None),
    "image_features": ("images", "patches", None),
    "image_hidden_states": ("images", "patches", None),
    "vision_outputs": ("images", "patches", None),
}
# Vision towers that take flattened patches, `(patches, C*T*P*P)`, name them as below (Qwen2-VL).
_PATCH_INPUTS = ("pixel_values", "pixel_values_videos", "hidden_states")
_CACHE_ROLES = ("batch", "heads", "cache_length", "head_dim")
#: A recurrent state (SSM / linear-attention layers: `conv_states` `[batch, channels, kernel]`,
#: `recurrent_states` `[batch, channels, state]`): one row per sequence; the other axes are sized by
#: the weights (a conv_state wider than the kernel is not a state the model can take).
_STATE_ROLES = ("batch", "state", "state")


def role_of(leaf_name: str, rank: int, axis: int) -> str | None:
    """The role of `axis` of input leaf `leaf_name` (`batch`, `sequence`, `cache_length`, ...)."""
    roles = _roles(leaf_name, rank)
    return roles[axis] if axis < len(roles) else None


def _is_cache_leaf(leaf_name: str) -> bool:
    """Whether `leaf_name` names a cache leaf: `cache.0.keys`, or `input.cache.0.keys` /
    `output.cache.0.keys` on runtimes with named I/O. A leaf merely named `input` (an
    `nn.Linear` head's argument) is not one."""
    parts = leaf_name.split(".")
    return parts[0] == CACHE_PREFIX or len(parts) > 1 and parts[0] in ("input", "output") and parts[1] == CACHE_PREFIX


def _roles(leaf_name: str, rank: int) -> tuple[str | None, ...]:
    if _is_cache_leaf(leaf_name) and rank in (2, 3, 4):
        if "conv_states" in leaf_name or "recurrent_states" in leaf_name:  # Mamba2's are [b, heads, dim, state]
            return ("batch",) + ("state",) * (rank - 1)
        return _CACHE_ROLES if rank == 4 else _STATE_ROLES[:rank]
    if leaf_name.endswith("attention_mask") and rank == 4:  # [batch, 1, query, slots attended] (a static cache's mask)
        return ("batch", "broadcast", "sequence", ATTENDED_ROLE)
    if leaf_name.split(".")[-1] in ("position_ids", "decoder_position_ids") and rank == 3:
        return ("sections", "batch", "sequence")  # multimodal rotary positions (Qwen2-VL: t, h, w [, text])
    if leaf_name.split(".")[-1] in _PATCH_INPUTS and rank == 2:
        return ("patches", "patch_features")
    if _is_encoder_state(leaf_name.split(".")) and rank == 3:
        return ("batch", "encoder_sequence", None)
    if leaf_name.split(".")[-1] in _HIDDEN_STATES and rank == 3:
        return _HIDDEN_STATES[leaf_name.split(".")[-1]]
    roles = _ROLES_BY_NAME.get(leaf_name.split(".")[-1], ())
    return tuple(roles) + (None,) * max(0, rank - len(roles))


#: Input leaves whose batch axis counts images, not sequences (a prompt may carry several).
_IMAGE_INPUTS = ("pixel_values", "pixel_values_videos")
#: Encoder outputs a decoder reads: axis 1 is the encoder's sequence, the cross-attention length.
_ENCODER_STATES = ("last_hidden_state", "encoder_hidden_states")
#: A decoder component's `encoder_outputs` argument (a tuple or transformers' `BaseModelOutput`):
#: its first leaf is the encoder's `last_hidden_state`.
_ENCODER_OUTPUTS = "encoder_outputs"


def _is_encoder_state(parts: list[str]) -> bool:
    """Whether the leaf named by `parts` is an encoder's output states `[batch, encoder_sequence, hidden]`."""
    return parts[-1] in _ENCODER_STATES or parts[0] == _ENCODER_OUTPUTS and parts[1:] == ["0"]
#: The cache part holding keys/values over the encoder's tokens (transformers 5.24 `EncoderDecoderCache`).
_CROSS_ATTENTION = "cross_attention"


def dim_names(names: list[str], shapes: list[tuple[int | str, ...]]) -> dict[str, str]:
    """Map each symbol (`s0`) to a readable name: one name per dimension of the interface.

    Symbols a valid call always sizes alike share a name even where `torch.export` kept them
    apart (see the module note and `_same_size`). A dimension first seen at a role another
    dimension already took gets the leaf's name in front (`cache_1_keys_cache_length`), so two
    sizes that may differ never share a name.
    """
    groups = _same_size(names, shapes)
    mapping: dict[str, str] = {}
    by_group: dict[str, str] = {}
    # a static mask's last axis is the cache's length where attention reads every slot: named so
    masks_last = sorted(zip(names, shapes), key=lambda item: item[0].endswith("attention_mask") and len(item[1]) == 4)
    for name, shape in masks_last:
        clean = name.removeprefix("input.")
        for axis, (dim, role) in enumerate(zip(shape, _naming_roles(clean, len(shape)))):
            if not _is_symbol(dim) or dim in mapping:
                continue
            group = groups.find(dim)
            if group not in by_group:
                by_group[group] = _unique(role or f"{clean.replace('.', '_')}_dim{axis}", clean,
                                          set(by_group.values()))
            mapping[dim] = by_group[group]
    return mapping


def _is_symbol(dim: int | str) -> bool:
    return isinstance(dim, str) and dim.isidentifier()


def _unique(base: str, leaf: str, taken: set[str]) -> str:
    """`base`, or `<leaf>_<base>` (then trailing `_`s) when another dimension took it."""
    readable = base if base not in taken else f"{leaf.replace('.', '_')}_{base}"
    while readable in taken:
        readable += "_"
    return readable


def _naming_roles(leaf_name: str, rank: int) -> tuple[str | None, ...]:
    """`_roles`, with a cross-attention cache's length named for what it is, the encoder's
    sequence (naming only: the capture reads `role_of`)."""
    roles = _roles(leaf_name, rank)
    if rank == 4 and _is_cross_attention(leaf_name):
        return roles[:2] + ("encoder_sequence",) + roles[3:]
    return roles


def _is_cross_attention(leaf_name: str) -> bool:
    parts = leaf_name.split(".")
    return parts[0] == CACHE_PREFIX and _CROSS_ATTENTION in parts


class _Groups:
    """Union-find over symbols; `find` gives a group's first-joined symbol."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, symbol: str) -> str:
        self.parent.setdefault(symbol, symbol)
        while self.parent[symbol] != symbol:
            symbol = self.parent[symbol]
        return symbol

    def join(self, symbols: list[str]) -> None:
        roots = [self.find(s) for s in symbols]
        for root in roots[1:]:
            self.parent[root] = roots[0]


def _same_size(names: list[str], shapes: list[tuple[int | str, ...]]) -> _Groups:
    """Group the symbols that every valid call sizes alike, whatever the program ties:

    - a cache layer's values are as long as its keys (one value per key), also where the program
      fixed the keys' length (a sliding window's) and not the values': their symbols then join
      that number, so two layers' values fixed alike share a name;
    - every input's batch is the call's batch (image inputs count images, so are left out);
    - a cross-attention cache is as long as the encoder's output it was computed from.
    """
    groups = _Groups()
    lengths: dict[str, str] = {}  # cache layer -> its keys' length (a symbol, or `#<size>`)
    batch: list[str] = []
    encoder: list[str] = []
    for name, shape in zip(names, shapes):
        clean = name.removeprefix("input.")
        parts = clean.split(".")
        for axis, dim in enumerate(shape):
            role = role_of(clean, len(shape), axis)
            node = dim if _is_symbol(dim) else f"#{dim}" if isinstance(dim, int) else None
            if role == "cache_length" and parts[-1] in ("keys", "values") and node is not None:
                groups.join([lengths.setdefault(".".join(parts[:-1]), node), node])
            if not _is_symbol(dim):
                continue
            groups.find(dim)
            if role == "batch" and parts[-1] not in _IMAGE_INPUTS:
                batch.append(dim)
            if role == "cache_length" and _is_cross_attention(clean):
                encoder.append(dim)
            if axis == 1 and _is_encoder_state(parts) and len(shape) == 3:
                encoder.append(dim)
    for symbols in (batch, encoder):
        if symbols:
            groups.join(symbols)
    return groups


def rename_expression(expression: str, mapping: dict[str, str]) -> str:
    """`"s0 + 1"` -> `"sequence + 1"`."""
    return re.sub(r"\b[a-z]+\d+\b", lambda m: mapping.get(m.group(0), m.group(0)), expression)
