"""Pytree registration for transformers' `Cache` classes, and names for flattened leaves.

# NOTE: one generic flattening serves every `Cache` subclass rather than a function per class.
# A cache is a list of layer objects whose tensor attributes (`keys`, `values`, the static
# cache's `cumulative_length` counter, linear-attention states, ...) become leaves; everything
# else (layer classes, `max_cache_len`, `is_initialized`, dtypes) goes into the context, so the
# unflattened object is the same class with the same state. A new cache class in transformers
# therefore exports the day it lands, without code here. Sub-caches (`EncoderDecoderCache`) are
# children, so they flatten recursively.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import RefusedFileError

__all__ = ["register_pytree_node", "register_cache_pytree_nodes", "leaf_names", "flatten_with_names"]

_registered: set[type] = set()

_LIST, _DICT, _TUPLE = "__list__", "__dict__", "__tuple__"


class _Traced:
    """Stands for a Python number that was symbolic while tracing (a cache counter that grew with a
    dynamic size). Its traced value means nothing at run time, so it is not carried: the rebuilt
    cache gets `None` there."""

    def __init__(self, text: str):
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Traced)

    def __hash__(self) -> int:
        return hash(_Traced)

    def __repr__(self) -> str:
        return f"<traced {self.text}>"


def _freeze(value: Any) -> Any:
    """Make `value` hashable and comparable, keeping enough to rebuild it (`_thaw`)."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _Traced(str(value))
    if isinstance(value, list):
        return (_LIST, tuple(_freeze(v) for v in value))
    if isinstance(value, tuple):
        return (_TUPLE, tuple(_freeze(v) for v in value))
    if isinstance(value, dict):
        return (_DICT, tuple((k, _freeze(v)) for k, v in value.items()))
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, _Traced):
        return None
    if isinstance(value, tuple) and len(value) == 2 and value[0] in (_LIST, _TUPLE, _DICT):
        kind, items = value
        if kind == _LIST:
            return [_thaw(v) for v in items]
        if kind == _TUPLE:
            return tuple(_thaw(v) for v in items)
        return {k: _thaw(v) for k, v in items}
    return value


def is_static_cache(obj: Any) -> bool:
    """A cache whose every layer is preallocated to a fixed length (`StaticCache`, and its
    sliding-window layers), as opposed to one that grows (`DynamicCache`)."""
    layers = getattr(obj, "layers", None) if is_cache_object(obj) else None
    if not layers:
        return False
    from transformers.cache_utils import StaticLayer

    return all(isinstance(layer, StaticLayer) for layer in layers)


def is_cache_object(obj: Any) -> bool:
    """Whether `obj` is a transformers `Cache` (a model's key/value cache, not a tensor of one)."""
    from transformers.cache_utils import Cache

    return isinstance(obj, Cache)


class _Nested:
    """A dict/list/tuple attribute holding tensors (linear-attention layers keep
    `conv_states = {0: tensor}`): its frozen structure, with `_LEAF` where each tensor goes."""

    def __init__(self, frozen: Any):
        self.frozen = frozen

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Nested) and self.frozen == other.frozen

    def __hash__(self) -> int:
        return hash(self.frozen)


_LEAF = "__tensor__"


def _extract(value: Any, path: str, leaves: list[tuple[str, torch.Tensor]]) -> Any:
    """Freeze `value`, replacing every tensor with `_LEAF` and appending `(path, tensor)` to `leaves`."""
    if isinstance(value, torch.Tensor):
        leaves.append((path, value))
        return _LEAF
    if isinstance(value, dict):
        return (_DICT, tuple((k, _extract(v, f"{path}.{k}", leaves)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        kind = _LIST if isinstance(value, list) else _TUPLE
        return (kind, tuple(_extract(v, f"{path}.{i}", leaves) for i, v in enumerate(value)))
    return _freeze(value)


def _rebuild(frozen: Any, leaves: Any) -> Any:
    if frozen == _LEAF:
        return next(leaves)
    if isinstance(frozen, tuple) and len(frozen) == 2 and frozen[0] in (_LIST, _TUPLE, _DICT):
        kind, items = frozen
        if kind == _DICT:
            return {k: _rebuild(v, leaves) for k, v in items}
        rebuilt = [_rebuild(v, leaves) for v in items]
        return rebuilt if kind == _LIST else tuple(rebuilt)
    return _thaw(frozen)


def _holds_tensor(value: Any) -> bool:
    return isinstance(value, (dict, list, tuple)) and any(
        isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(value))


def _split_state(obj: Any) -> tuple[list[str], tuple, list[tuple[str, torch.Tensor]]]:
    """Split `vars(obj)` into tensor attribute names (sorted), the frozen rest, and the tensors
    found inside container attributes (as `(name.key, tensor)`, after the direct ones)."""
    tensor_names, state, nested = [], [], []
    for name, value in sorted(vars(obj).items()):
        if isinstance(value, torch.Tensor):
            tensor_names.append(name)
        elif _holds_tensor(value):
            state.append((name, _Nested(_extract(value, name, nested))))
        elif name not in ("layers",) and not is_cache_object(value):
            if isinstance(value, torch.Stream):
                raise TypeError(
                    f"{type(obj).__name__} was built with offloading=True, which cannot be exported. "
                    "Build the cache with offloading=False."
                )
            state.append((name, _freeze(value)))
    return tensor_names, tuple(state), nested


def _flatten_cache(cache: Any) -> tuple[list[Any], tuple]:
    children, (_names, context) = _flatten_cache_with_names(cache)
    return children, context


def _flatten_cache_with_names(cache: Any) -> tuple[list[Any], tuple[list[str], tuple]]:
    children: list[Any] = []
    names: list[str] = []
    layer_specs = []
    for index, layer in enumerate(getattr(cache, "layers", None) or []):
        tensor_names, state, nested = _split_state(layer)
        layer_specs.append((type(layer), tuple(tensor_names), state))
        for name in tensor_names:
            children.append(getattr(layer, name))
            names.append(f"{index}.{name}")
        for name, tensor in nested:
            children.append(tensor)
            names.append(f"{index}.{name}")
    sub_caches = []
    for name, value in sorted(vars(cache).items()):
        if is_cache_object(value):
            sub_caches.append(name)
            children.append(value)
            names.append(name.removesuffix("_cache"))
    tensor_names, state, nested = _split_state(cache)
    for name in tensor_names:
        children.append(getattr(cache, name))
        names.append(name)
    for name, tensor in nested:
        children.append(tensor)
        names.append(name)
    has_layers = hasattr(cache, "layers")
    context = (type(cache), has_layers, tuple(layer_specs), tuple(sub_caches), tuple(tensor_names), state)
    return children, (names, context)


def _unflatten_cache(children: list[Any], context: tuple) -> Any:
    cls, has_layers, layer_specs, sub_caches, tensor_names, state = context
    cache = cls.__new__(cls)
    it = iter(children)
    if has_layers:
        layers = []
        for layer_cls, layer_tensor_names, layer_state in layer_specs:
            layer = layer_cls.__new__(layer_cls)
            _restore(layer, layer_tensor_names, layer_state, it)
            layers.append(layer)
        cache.layers = layers
    for name in sub_caches:
        setattr(cache, name, next(it))
    _restore(cache, tensor_names, state, it)
    return cache


def _restore(obj: Any, tensor_names: tuple, state: tuple, children: Any) -> None:
    """Set `obj`'s attributes in the order `_flatten_cache_with_names` consumed them."""
    for name in tensor_names:
        setattr(obj, name, next(children))
    for name, value in state:
        setattr(obj, name, _rebuild(value.frozen, children) if isinstance(value, _Nested) else _thaw(value))


def _flatten_cache_with_keys(cache: Any) -> tuple[list[tuple[Any, Any]], tuple]:
    children, (names, context) = _flatten_cache_with_names(cache)
    return [(pytree.MappingKey(name), child) for name, child in zip(names, children)], context


# -- JSON form of the context, for `torch.export.save` / `load` ------------------------------------


def _qualname(obj: type) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


def _layer_classes() -> list[type]:
    """transformers' cache layer classes, those of modules imported so far included: the subclasses
    of its two layer bases (read from transformers 5.24: attention layers, and the linear-attention
    and SSM layers of `LinearAttentionCacheLayerMixin`)."""
    from transformers.cache_utils import CacheLayerMixin, LinearAttentionCacheLayerMixin

    return [*all_subclasses(CacheLayerMixin), *all_subclasses(LinearAttentionCacheLayerMixin)]


def _class_table() -> dict[str, type]:
    """`module:qualname` -> class, for every class a saved tree spec may name: the `Cache` classes
    registered with `register_pytree_node` in this process and transformers' cache layer classes
    (`_layer_classes`)."""
    return {_qualname(cls): cls for cls in (*_registered, *_layer_classes())}


def _table_class(path: Any) -> type:
    """The class `path` (`module:qualname`, as `_qualname` wrote it) names in a saved tree spec,
    looked up in `_class_table`.

    # NOTE: a `.pt2` is a file from anywhere, and `torch.export.load` hands its tree specs' contexts
    # to `from_dumpable_context`. Resolving a name by importing its module and following its
    # attributes let a file reach any object of an importable module
    # (`transformers.utils.hub:tempfile._TemporaryFileCloser`, which `_unflatten_cache` then built
    # with a file's state and which deleted that file when collected). An exact table of the classes
    # this module rebuilds leaves a file nothing to name: nothing is imported, no attribute followed.
    """
    found = _class_table().get(path) if isinstance(path, str) else None
    if found is None:
        raise RefusedFileError(
            f"the saved program's tree spec names the class {str(path)[:200]!r}, which is not a cache class "
            "registered with register_pytree_node nor a transformers cache layer class; nothing was imported",
            remedy="if you trust the file and its cache class is your own, import it and register it with "
                   "hfexport.exporter_dynamo.register_pytree_node before loading; otherwise do not load it")
    return found


def _dump_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return {"t": [_dump_value(v) for v in value]}
    if isinstance(value, type):
        return {"class": _qualname(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, _Traced):
        return {"traced": value.text}
    if isinstance(value, _Nested):
        return {"nested": _dump_value(value.frozen)}
    raise TypeError(f"cannot serialize cache attribute value {value!r} of type {type(value).__name__}")


#: The devices a saved cache attribute may name (`torch.device(text)` parses; nothing is imported).
_DEVICE = re.compile(r"(cpu|cuda|mps|xpu|meta)(:[0-9]+)?")
#: An attribute name `_restore` may set: a plain identifier, not a dunder (`__class__`, `__dict__`).
_ATTRIBUTE = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_]*")


def _refuse_context(why: str) -> RefusedFileError:
    return RefusedFileError(f"the saved program's tree spec has a cache context that {why}; hfexport writes "
                            "none such", remedy="load only a .pt2 hfexport wrote; otherwise do not load it")


def _dtype(name: Any) -> torch.dtype:
    # a table rather than getattr(torch, name): torch's module __getattr__ imports a submodule it names
    dtypes = {str(v).removeprefix("torch."): v for v in vars(torch).values() if isinstance(v, torch.dtype)}
    found = dtypes.get(name) if isinstance(name, str) else None
    if found is None:
        raise _refuse_context(f"names the dtype {str(name)[:80]!r}, which is not a torch.dtype")
    return found


def _load_value(value: Any) -> Any:
    """The value `_dump_value` wrote as `value`: plain JSON scalars, or one-key objects of the kinds
    it writes; anything else (a list, another key, a class outside `_class_table`) is refused."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if not (isinstance(value, dict) and len(value) == 1):
        raise _refuse_context(f"holds {type(value).__name__} {str(value)[:80]}, which _dump_value never writes")
    (kind, payload), = value.items()
    if kind == "t" and isinstance(payload, list):
        return tuple(_load_value(v) for v in payload)
    if kind == "class":
        return _table_class(payload)
    if kind == "dtype":
        return _dtype(payload)
    if kind == "device" and isinstance(payload, str) and _DEVICE.fullmatch(payload):
        return torch.device(payload)
    if kind == "traced" and isinstance(payload, str):
        return _Traced(payload)
    if kind == "nested":
        return _Nested(_load_value(payload))
    raise _refuse_context(f"holds {{{kind!r}: {str(payload)[:80]}}}, which _dump_value never writes")


def _check_names(cls: type, names: Any, what: str) -> None:
    """Refuse `names` unless a tuple of attribute names `_restore` may set on a `cls`: identifiers,
    no dunder, none naming a method or property of the class."""
    if not isinstance(names, tuple):
        raise _refuse_context(f"gives {what} as {type(names).__name__}, not a tuple of names")
    for name in names:
        found = inspect.getattr_static(cls, name, None) if isinstance(name, str) else None
        if not (isinstance(name, str) and _ATTRIBUTE.fullmatch(name)) or hasattr(found, "__get__"):
            raise _refuse_context(f"sets the attribute {str(name)[:80]!r} of {cls.__name__}, which is not a plain "
                                  "data attribute name")


def _check_state(cls: type, state: Any) -> None:
    if not (isinstance(state, tuple) and all(isinstance(item, tuple) and len(item) == 2 for item in state)):
        raise _refuse_context(f"gives the state of {cls.__name__} as something else than (name, value) pairs")
    _check_names(cls, tuple(name for name, _ in state), "state")


def _checked_context(context: Any) -> tuple:
    """`context` if it has the shape `_flatten_cache_with_names` gives one: `(cache class, has layers,
    ((layer class, tensor names, state), ...), sub-cache names, tensor names, state)`, every class
    from `_class_table`, every name a plain attribute name."""
    from transformers.cache_utils import Cache

    if not (isinstance(context, tuple) and len(context) == 6):
        raise _refuse_context("is not the 6 fields _flatten_cache writes")
    cls, has_layers, layer_specs, sub_caches, tensor_names, state = context
    if not (isinstance(cls, type) and issubclass(cls, Cache) and cls in _registered):
        raise _refuse_context(f"rebuilds {cls!r}, which is not a registered cache class")
    if not isinstance(has_layers, bool) or not isinstance(layer_specs, tuple):
        raise _refuse_context("gives its layers in another shape than _flatten_cache writes")
    for spec in layer_specs:
        if not (isinstance(spec, tuple) and len(spec) == 3 and spec[0] in _layer_classes()):
            raise _refuse_context(f"gives a layer as {str(spec)[:80]}, not (layer class, tensor names, state)")
        _check_names(spec[0], spec[1], "tensor names")
        _check_state(spec[0], spec[2])
    _check_names(cls, sub_caches, "sub-cache names")
    _check_names(cls, tensor_names, "tensor names")
    _check_state(cls, state)
    return context


def _to_dumpable_context(context: tuple) -> str:
    return json.dumps(_dump_value(context))


def from_dumpable_context(dumped: str) -> tuple:
    """The context `_to_dumpable_context` wrote, checked (`_checked_context`) before anything is
    built from it: `RefusedFileError` otherwise."""
    try:
        loaded = json.loads(dumped)
    except (TypeError, ValueError):
        raise _refuse_context("is not JSON") from None
    return _checked_context(_load_value(loaded))


def is_registered_cache_class(cls: Any) -> bool:
    """Whether `cls` is a `Cache` class registered with `register_pytree_node` in this process."""
    return cls in _registered


def register_pytree_node(cls: type) -> type:
    """Register a transformers `Cache` class as a pytree node, so it can be an export input or output.

    Needed before `torch.export.load` of a program whose inputs hold a cache (the loader rebuilds
    the cache object from the saved tree spec). Registering twice is a no-op. A registered class
    joins the table of classes a saved tree spec may name (with transformers' cache layer classes);
    no other class is ever resolved from a file.

    Args:
        cls: a subclass of `transformers.cache_utils.Cache`.

    Returns:
        `cls`, so it can be used as a class decorator.
    """
    from transformers.cache_utils import Cache

    if not (isinstance(cls, type) and issubclass(cls, Cache)):
        raise TypeError(f"register_pytree_node expects a transformers Cache class, got {cls!r}")
    # A program's outputs are `ModelOutput`s (`CausalLMOutputWithPast`), which transformers
    # registers as pytree nodes when their module is first imported; a fresh process that only
    # imported a cache class would fail `torch.export.load` with "Deserializing
    # transformers.modeling_outputs.CausalLMOutputWithPast in pytree is not registered".
    import transformers.modeling_outputs  # noqa: F401

    if cls in _registered or cls in pytree.SUPPORTED_NODES:
        _registered.add(cls)
        return cls
    pytree.register_pytree_node(
        cls,
        _flatten_cache,
        _unflatten_cache,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        to_dumpable_context=_to_dumpable_context,
        from_dumpable_context=from_dumpable_context,
        flatten_with_keys_fn=_flatten_cache_with_keys,
    )
    import torch.fx._pytree as fx_pytree

    fx_pytree.register_pytree_flatten_spec(cls, lambda cache, spec: _flatten_cache(cache)[0])
    _allow_in_weights_only_load(cls)
    _registered.add(cls)
    return cls


def _allow_in_weights_only_load(cls: type) -> None:
    """Let `torch.load(weights_only=True)` rebuild `cls` and every cache layer class.

    `torch.export.save` pickles a program's `example_inputs`; without this, `torch.export.load`
    of a program whose inputs hold a cache falls back to `weights_only=False` with a warning.
    Cache classes only carry tensors and plain values, so allowing them adds no code execution.
    """
    from transformers.cache_utils import CacheLayerMixin

    torch.serialization.add_safe_globals([cls, CacheLayerMixin, *_layer_classes()])


def all_subclasses(cls: type) -> list[type]:
    """Every subclass of `cls` defined so far, at any depth."""
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(all_subclasses(sub))
    return out


def register_cache_pytree_nodes(tree: Any = None) -> None:
    """Register every `Cache` class known now, and any cache class found inside `tree`."""
    from transformers.cache_utils import Cache

    for cls in (Cache, *all_subclasses(Cache)):
        register_pytree_node(cls)
    if tree is not None:
        for leaf in pytree.tree_leaves(tree, is_leaf=is_cache_object):
            if is_cache_object(leaf):
                register_pytree_node(type(leaf))


# -- Leaf names ----------------------------------------------------------------------------------


def key_name(key: Any) -> str:
    """One step of a pytree path as it reads in a leaf name: a dict key, a list index, an attribute."""
    if isinstance(key, pytree.MappingKey):
        return str(key.key)
    if isinstance(key, pytree.SequenceKey):
        return str(key.idx)
    if isinstance(key, pytree.GetAttrKey):
        return key.name
    return str(key).strip(".[]'\"")


def flatten_with_names(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Flatten `tree` to `(dotted name, leaf)` pairs: `logits`, `cache.0.keys`, `input_ids`."""
    pairs, _ = pytree.tree_flatten_with_path(tree)
    out = []
    for path, leaf in pairs:
        name = ".".join(key_name(k) for k in path)
        out.append((f"{prefix}{name}" if name else prefix.rstrip(".") or "output", leaf))
    return out


def leaf_names(tree: Any, prefix: str = "") -> list[str]:
    """The names of `tree`'s leaves, in flattening order (see `flatten_with_names`)."""
    return [name for name, _ in flatten_with_names(tree, prefix)]
