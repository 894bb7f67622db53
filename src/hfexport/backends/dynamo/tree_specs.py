"""The tree specs of a saved program (how its inputs and outputs nest): which transformers modules
their classes come from (`import_output_modules`), and what a spec may say (`tree_spec_fault`).

# NOTE: torch 2.13's `treespec_loads` (torch/utils/_pytree.py) looks each node's type name up in the
# types registered in this process, then reads its context with the registered
# `from_dumpable_context` or, for a type without one (dict, a transformers `ModelOutput`), with
# `json.loads(..., object_hook=enum_object_hook)`: an object `{"__enum__": ..., "fqn": "mod:Name"}`
# anywhere in that JSON imports `mod`. So a spec is accepted only when each node is a leaf, a tuple,
# list or dict (keys: plain names), a `ModelOutput` subclass transformers registered (context: its
# own field names), or a cache class from hfexport's table (context: `from_dumpable_context`'s
# checked shape). The modules imported first are named by an explicit rule, not by what a file says
# anywhere: `transformers.modeling_outputs`, `transformers.cache_utils`, and
# `transformers.models.<m>.modeling_<m>` for a model module `<m>` transformers' own table lists.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from typing import Any

import torch
import torch.utils._pytree as pytree

from ...errors import RuntimeLoadError

__all__ = ["import_output_modules", "tree_spec_fault"]

_MODELING = re.compile(r"transformers\.models\.([a-z0-9_]+)\.modeling_([a-z0-9_]+)")
#: A dict key in a spec: the forward's argument names, an output's fields.
_KEY = re.compile(r"[A-Za-z0-9_.]+")


def _model_modules() -> set[str]:
    """The model module names transformers lists (read from transformers 5.24:
    `CONFIG_MAPPING_NAMES`, mapped as `AutoConfig` maps a model type to its module)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name

    return {model_type_to_module_name(model_type) for model_type in CONFIG_MAPPING_NAMES}


def _is_output_module(module: str) -> bool:
    if module in ("transformers.modeling_outputs", "transformers.cache_utils"):
        return True
    match = _MODELING.fullmatch(module)
    return bool(match) and match[1] == match[2] and match[1] in _model_modules()


def _type_names(spec_text: Any) -> set[str]:
    """Every node type a serialized spec names (nothing for text that is not one: the check refuses it)."""
    try:
        _, spec = json.loads(spec_text)
    except (TypeError, ValueError):
        return set()
    names, stack = set(), [spec]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("type"), str):
                names.add(node["type"])
            stack.extend(node.get("children_spec") or [])
    return names


def import_output_modules(program: Any) -> None:
    """Import the transformers modules, by `_is_output_module`'s rule, whose classes the tree specs
    of `program` (the program's JSON) name, and allow their `ModelOutput`s in the weights-only
    unpickler.

    # NOTE: transformers registers each `ModelOutput` class as a pytree node when its module is
    # imported; `torch.export.load` of a program returning e.g. `LlavaCausalLMOutputWithPast`, in a
    # process that has not imported `modeling_llava`, fails with a generic "error when
    # deserializing" (the real NotImplementedError is only logged).
    """
    entries = program.get("graph_module", {}).get("module_call_graph") if isinstance(program, dict) else None
    names: set[str] = set()
    for entry in entries if isinstance(entries, list) else []:
        signature = entry.get("signature") if isinstance(entry, dict) else None
        if isinstance(signature, dict):
            names |= _type_names(signature.get("in_spec")) | _type_names(signature.get("out_spec"))
    for module in sorted({name.rpartition(".")[0] for name in names}):
        if _is_output_module(module):
            try:
                importlib.import_module(module)
            except ImportError:  # an optional dependency missing: its classes stay unregistered, and refused
                continue
    # A program's pickled `example_inputs` may hold a ModelOutput (an encoder-decoder's
    # `encoder_outputs`); let the weights-only unpickler rebuild those plain containers.
    from transformers.utils import ModelOutput

    from ...capture.pytree import all_subclasses

    torch.serialization.add_safe_globals([ModelOutput, *all_subclasses(ModelOutput)])


def _keys(context: Any, allowed: set[str] | None = None) -> str | None:
    """Why `context` is not a JSON list of plain keys (from `allowed`, if given), or None."""
    try:
        keys = json.loads(context)
    except (TypeError, ValueError):
        return "its context is not JSON"
    if not (isinstance(keys, list) and all(isinstance(k, str) and _KEY.fullmatch(k) for k in keys)):
        return f"its context {str(context)[:80]} is not a list of plain keys"
    if allowed is not None and not set(keys) <= allowed:
        return f"its context names {sorted(set(keys) - allowed)[:3]}, which are not its fields"
    return None


def _node_fault(node: Any) -> str | None:
    from transformers.utils import ModelOutput

    from ...capture.pytree import from_dumpable_context, is_registered_cache_class

    if not (isinstance(node, dict) and set(node) == {"type", "context", "children_spec"}
            and isinstance(node["children_spec"], list)):
        return f"a node {str(node)[:80]} is not a tree spec node"
    name, context, children = node["type"], node["context"], node["children_spec"]
    if name is None:
        return None if context is None and not children else "a leaf has a context or children"
    # torch's table of registered node types, read from torch 2.13's pytree
    kind = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(name) if isinstance(name, str) else None
    if kind in (tuple, list):
        fault = None if context == "null" else f"its {name} has the context {str(context)[:80]}"
    elif kind is dict:
        fault = _keys(context)
    elif isinstance(kind, type) and issubclass(kind, ModelOutput) and dataclasses.is_dataclass(kind):
        fault = _keys(context, {field.name for field in dataclasses.fields(kind)})
    elif is_registered_cache_class(kind):
        try:
            fault = None if from_dumpable_context(context)[0] is kind else f"its {name} context rebuilds another class"
        except RuntimeLoadError as error:
            fault = str(error).splitlines()[0].removeprefix(f"[{error.step}] ")
    else:
        return (f"it names the type {str(name)[:120]!r}, which is not a tuple, list, dict, transformers output or "
                "registered cache class")
    return fault or next((f for f in map(_node_fault, children) if f), None)


def tree_spec_fault(text: Any) -> str | None:
    """Why `text` (a serialized tree spec) is not one hfexport writes, or None: see the module's note."""
    try:
        protocol, spec = json.loads(text)
        return f"its protocol is {protocol!r}, not 1" if protocol != 1 else _node_fault(spec)
    except (TypeError, ValueError):
        return "it is not a serialized tree spec"
    except RecursionError:
        return "it nests too deep"
