"""Layer stamping: a decoder's repeated layers traced once and stamped for every layer with its
own weights, so the capture (torch.export's trace, then the backend's decomposition retrace) costs
two layers rather than N.

```
stampable(model, config, inputs)
    the decoder's layer list, when its layers differ only in their weights and layer index
    (STAMPED_MODEL_TYPES, every layer's attributes alike) and `inputs` hold a static cache, else why not
shallow(model, stack)       the model with the list's first two layers (modules shared, nothing copied)
stamp(program, model, stack)
    the shallow program (traced on the full sample: layers 2..N-1's cache inputs are there, unused)
    with layer 1's nodes copied for layers 2..N-1: each copy reads its own layer's parameters and
    cache inputs, and the previous copy where layer 1 reads layer 0; the tail (final norm, head)
    reads the last copy; each copy's cache writes become its layer's outputs
```
The program is the one a trace of the whole model gives: the same inputs, outputs, names and
symbolic dimensions, every layer's parameters in its state dict. Two layers are traced, not one,
so the trace itself says what joins one layer to the next (what layer 1 reads of layer 0's
nodes), and the two layers' nodes are checked to be the same program (op for op, argument for
argument) before layer 1 is stamped. Anything unexpected raises `NotStampable`, and the caller
traces the whole model as before (the record says why). A dynamic cache's layers are not stamped
yet (refused before any trace): each reads its own cache's length through shape arithmetic
(`1 + sym_size(values)`) that the check finds apart from layer 0's; the static cache of the
runtimes' LLM packages is stamped. Nor is a forward without a cache input: what it hands back per
layer (the cache it makes, hidden states) comes from the layers the trace ran.

# NOTE: why an allowlist of model types besides the checks. A decoder layer can branch on its index
# in Python (a layer that skips the rotary every fourth layer, a sliding window from a pattern),
# which no trace of two layers shows. The attribute check catches what the layer computes from its
# index at construction (`use_rope`, `sliding_window`, `is_sliding`, as transformers 5.24's
# SmolLM3, Qwen2 and Gemma3 set them); the allowlist holds the model types whose layers were read
# (transformers 5.24) to use their index only for their cache (`past_key_values.update(...,
# self.layer_idx)`). Validation (on by default) then compares the stamped program's outputs with
# the whole eager model's, as for any export.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
import torch.fx

__all__ = ["stampable", "shallow", "stamp", "NotStampable", "LayerStack", "STAMPED_MODEL_TYPES"]

#: model types whose decoder layers use their index only for the cache (read in transformers 5.24)
STAMPED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3"})
#: the fewest layers worth stamping: two are traced, so a model of two gains nothing
MIN_LAYERS = 3
#: attributes a layer's modules may differ in (the index its cache is addressed by)
_INDEX_ATTRIBUTES = frozenset({"layer_idx", "layer_index"})


class NotStampable(Exception):
    """Why a program or model is not stamped (the whole model is traced instead)."""


@dataclasses.dataclass(frozen=True)
class LayerStack:
    """The decoder's layer list and its path from the traced root (`model.model.layers`)."""

    path: str
    layers: torch.nn.ModuleList


def stampable(model: torch.nn.Module, config: Any, inputs: dict[str, Any] | None = None,
              backend: str | None = None) -> tuple[LayerStack | None, str]:
    """`(the layer list, "")` when `model`'s capture on `inputs` can be stamped, else `(None, why not)`.
    A quantizer of the converted model (`stage_for(backend)`: ONNX Runtime's int4) leaves the capture
    as it is; one of the traced program (without `backend`, any) is refused."""
    from ..model_config import text_config
    from .pytree import is_cache_object

    quantizer = getattr(config, "quantizer", None)
    if quantizer is not None and (backend is None or quantizer.stage_for(backend) != "model"):
        return None, "a quantizer annotates the traced program"
    model_config = text_config(getattr(model, "config", None))  # a generation component's front has its model's
    model_type = getattr(model_config, "model_type", None)
    if model_type is None:
        return None, f"{type(model).__name__} shows no model config"
    if model_type not in STAMPED_MODEL_TYPES:
        return None, f"model type {model_type!r} is not one whose layers were read to differ only in weights"
    caches = [value for value in (inputs or {}).values() if is_cache_object(value)]
    if not caches:
        return None, ("no cache among the inputs: what a forward hands back per layer (the cache it makes, hidden "
                      "states) comes from the layers it ran")
    if any(_dynamic_cache(cache) for cache in caches):
        return None, ("a dynamic cache: each layer reads its own cache's length through shape arithmetic the trace "
                      "shares between layers, which the stamp's node-for-node check refuses")
    asked = [name for name in ("output_hidden_states", "output_attentions")
             if getattr(model_config, name, False) or (getattr(model, "constants", None) or {}).get(name)]
    if asked:
        return None, f"{' and '.join(asked)} asked: outputs per layer"
    count = getattr(model_config, "num_hidden_layers", None)
    found = [(name, module) for name, module in model.named_modules()
             if isinstance(module, torch.nn.ModuleList) and len(module) == count]
    if len(found) != 1:
        return None, f"{len(found)} module lists of the config's {count} layers"
    if count < MIN_LAYERS:
        return None, f"{count} layers (stamping starts at {MIN_LAYERS})"
    path, layers = found[0]
    types = getattr(model_config, "layer_types", None)
    if types and len(set(types[:count])) > 1:
        return None, f"the layers are of {len(set(types[:count]))} kinds ({', '.join(sorted(set(types[:count])))})"
    first = _layer_signature(layers[0])
    for index, layer in enumerate(layers):
        if _layer_signature(layer) != first:
            return None, f"layer {index} differs from layer 0 in its modules, attributes or weights' shapes"
    return LayerStack(path, layers), ""


def _dynamic_cache(cache: Any) -> bool:
    """Whether `cache` (a transformers cache) has a layer that is not a static one."""
    from transformers.cache_utils import StaticLayer

    return not all(isinstance(layer, StaticLayer) for layer in cache.layers)


def _layer_signature(layer: torch.nn.Module) -> list[Any]:
    """What two layers that trace alike share: their modules' types, plain attributes (but the
    index) and hooks, their parameters' and buffers' names, shapes and dtypes."""
    signature: list[Any] = []
    for name, module in layer.named_modules():
        attributes = sorted((key, _plain(value)) for key, value in vars(module).items()
                            if not key.startswith("_") and key not in _INDEX_ATTRIBUTES)
        hooks = (len(module._forward_hooks), len(module._forward_pre_hooks))
        signature.append((name, type(module), attributes, hooks))
    for name, tensor in [*layer.named_parameters(recurse=True), *layer.named_buffers(recurse=True)]:
        signature.append((name, type(tensor), tuple(tensor.shape), tensor.dtype))
    return signature


def _plain(value: Any) -> Any:
    """A comparable stand-in for an attribute's value (a tensor by shape and dtype, a function by name)."""
    if isinstance(value, (int, float, str, bool, type(None), torch.dtype)):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _plain(v)) for k, v in value.items()))
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    if callable(value):
        return ("callable", getattr(value, "__qualname__", type(value).__qualname__))
    return ("object", type(value).__qualname__)


def shallow(model: torch.nn.Module, stack: LayerStack) -> torch.nn.Module:
    """`model` with only the first two of `stack`'s layers: each module on the way to the list
    copied shallowly with its own child table, the rest (every weight) shared."""
    parts = stack.path.split(".")
    root = _with_own_children(model)
    parent = root
    for part in parts[:-1]:
        child = _with_own_children(parent._modules[part])
        parent._modules[part] = child
        parent = child
    parent._modules[parts[-1]] = torch.nn.ModuleList(list(stack.layers)[:2])
    return root


def _with_own_children(module: torch.nn.Module) -> torch.nn.Module:
    import copy

    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    return clone


def stamp(program: torch.export.ExportedProgram, model: torch.nn.Module, stack: LayerStack,
          layers: int | None = None) -> torch.export.ExportedProgram:
    """The program of the whole `model` from `program`, the trace of `shallow(model, stack)` on
    the whole model's sample (see the module docstring); with `layers`, of its first `layers`
    layers only (at least 3): the later layers' caches pass through, as in the shallow program
    (what the ONNX converter takes before stamping its graph, `backends/onnx/layer_stamp.py`).

    Raises:
        NotStampable: the program is not two alike layers between a prefix and a tail.
    """
    return _Stamp(program, model, stack, layers).program()


class _Stamp:
    """`stamp`'s steps on one shallow program: find the two layers' nodes, check them alike (and
    what layer 1 reads of layer 0: the link), find the tail, then write the whole program."""

    def __init__(self, program: torch.export.ExportedProgram, model: torch.nn.Module, stack: LayerStack,
                 layers: int | None = None):
        self.shallow, self.model = program, model
        self.count = len(stack.layers) if layers is None else min(max(layers, MIN_LAYERS), len(stack.layers))
        self.prefix = f"{stack.path}."
        self.nodes = list(program.graph.nodes)
        self.placeholders = {node.name: node for node in self.nodes if node.op == "placeholder"}
        self.spec_of = {spec.arg.name: spec for spec in program.graph_signature.input_specs}
        self.by_input_name = _user_input_names(program)
        self.name_of_input = {node.name: name for name, node in self.by_input_name.items()}

    def own(self, node: torch.fx.Node | None, index: int) -> str | None:
        """What `node` (a placeholder) is to layer `index` (`weight:<name>`, `cache:<leaf>`), when it
        is that layer's own input."""
        from torch.export.graph_signature import InputKind

        spec = self.spec_of.get(node.name) if node is not None else None
        if spec is None:
            return None
        layer = f"{self.prefix}{index}."
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER) and spec.target.startswith(layer):
            return "weight:" + spec.target[len(layer):]
        if spec.kind == InputKind.USER_INPUT:
            found = re.fullmatch(rf"cache\.{index}\.(.+)", self.name_of_input.get(node.name, ""))
            if found:
                return "cache:" + found.group(1)
        return None

    def program(self) -> torch.export.ExportedProgram:
        from torch.export.graph_signature import ExportGraphSignature

        self.first, self.second = self._bodies()
        self.position = {node: k for k, node in enumerate(self.first)} | {
            node: k for k, node in enumerate(self.second)}
        self.links = self._alike()
        self.tail = self._tail()
        self.caches = self._stamped_caches()
        graph = torch.fx.Graph()
        input_specs, state_dict, constants = self._inputs(graph)
        self._body(graph)
        output_specs = self._outputs(graph)
        graph.lint()
        module = torch.fx.GraphModule(self.shallow.graph_module, graph)
        stamped = torch.export.ExportedProgram(
            root=module, graph=module.graph, graph_signature=ExportGraphSignature(input_specs, output_specs),
            state_dict=state_dict, range_constraints=_used_ranges(self.shallow, graph),
            module_call_graph=_stamped_call_graph(self.shallow, self.prefix, self.count), example_inputs=None,
            constants=constants, verifiers=self.shallow.verifiers)
        for attribute, value in vars(self.shallow).items():  # hfexport's marks (decomposed for ONNX), torch's guards
            if attribute.startswith("_hfexport") or attribute == "_guards_code":
                setattr(stamped, attribute, value)
        return stamped

    def _bodies(self) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
        """Layer 0's and layer 1's call nodes, in graph order (by the module each ran in)."""
        bodies: dict[int, list[torch.fx.Node]] = {0: [], 1: []}
        for node in self.nodes:
            if node.op != "call_function":
                continue
            found = {layer_index(path, self.prefix) for path, _ in (node.meta.get("nn_module_stack") or {}).values()}
            found.discard(None)
            if len(found) > 1 or (found and not found <= bodies.keys()):
                raise NotStampable(f"node {node.name} ran in layers {sorted(found)} of a two-layer trace")
            if found:
                bodies[found.pop()].append(node)
        for index, body in bodies.items():
            # Shape arithmetic (a SymInt node) belongs to a layer only where it reads that layer's
            # tensors: the tracer shares one node for a size every layer computes alike, so layer 1
            # may read layer 0's (as it reads the prefix's); such a node is the prefix's.
            members: set[torch.fx.Node] = set()
            for node in body:
                if not _symbolic(node) or any(arg in members for arg in node.all_input_nodes):
                    members.add(node)
            bodies[index] = [node for node in body if node in members]
        if not bodies[1] or len(bodies[0]) != len(bodies[1]):
            raise NotStampable(f"layers 0 and 1 traced to {len(bodies[0])} and {len(bodies[1])} nodes")
        return bodies[0], bodies[1]

    def _alike(self) -> set[int]:
        """Check layer 1 against layer 0 node for node; return the positions of layer 0's nodes
        layer 1 reads (the link: where layer 1 reads layer 0, layer i reads layer i-1)."""
        in_first, in_second, position = set(self.first), set(self.second), self.position
        links: set[int] = set()

        def same(a: Any, b: Any) -> bool:
            if isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node):
                if a in in_first and b in in_second:
                    return position[a] == position[b]
                if b in in_first:  # layer 1 reading layer 0's output where layer 0 reads the prefix's
                    links.add(position[b])
                    return a not in in_first and a not in in_second and a.op != "placeholder"
                mine, theirs = self.own(a, 0), self.own(b, 1)
                if mine is not None or theirs is not None:
                    return mine == theirs
                return a is b
            if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
                return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
            if isinstance(a, dict) and isinstance(b, dict):
                return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
            return type(a) is type(b) and a == b

        for a, b in zip(self.first, self.second):
            if a.target != b.target or not same(a.args, b.args) or not same(a.kwargs, b.kwargs):
                raise NotStampable(f"layer 1's {b.name} is not layer 0's {a.name} ({b.target} against {a.target})")
        if not links:
            raise NotStampable("layer 1 reads nothing of layer 0")
        return links

    def _tail(self) -> list[torch.fx.Node]:
        """The nodes after the layers (the final norm, the head): those reading a layer's node, read
        by none; they may read only layer 1's output (its nodes at the link's positions)."""
        layers = set(self.first) | set(self.second)
        reading = set(layers)
        tail = []
        for node in self.nodes:
            if node.op == "call_function" and node not in reading and any(a in reading for a in node.all_input_nodes):
                reading.add(node)
                tail.append(node)
        for node in tail:
            if any(user in layers for user in node.users):
                raise NotStampable(f"{node.name}, outside the layers, reads one layer and is read by another")
            for arg in node.all_input_nodes:
                if arg in self.first or (arg in self.second and self.position[arg] not in self.links):
                    raise NotStampable(f"{node.name}, outside the layers, reads {arg.name}, not layer 1's output")
        return tail

    def _stamped_caches(self) -> dict[tuple[int, str], torch.fx.Node]:
        """`{(layer, "cache:<leaf>"): its input}` for layers 2..N-1: in the program, unused."""
        caches = {}
        for node in self.placeholders.values():
            mine = self.own(node, 1)
            if not (mine or "").startswith("cache:"):
                continue
            for index in range(2, self.count):
                theirs = self.by_input_name.get(f"cache.{index}.{mine[len('cache:'):]}")
                if theirs is None or any(user.op != "output" for user in theirs.users):
                    raise NotStampable(f"layer {index}'s cache input {mine} is missing, or read by the trace")
                caches[(index, mine)] = theirs
        return caches

    def _inputs(self, graph: torch.fx.Graph) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
        """The placeholders, with layers 2..N-1's weights after layer 1's of each kind (as a whole
        trace orders them); return the input specs, state dict and constants."""
        from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

        self.env: dict[torch.fx.Node, torch.fx.Node] = {}
        self.added: dict[tuple[int, str], torch.fx.Node] = {}
        specs: list[InputSpec] = []
        state_dict, constants = dict(self.shallow.state_dict), dict(self.shallow.constants)
        tensors = {**dict(self.model.named_parameters(remove_duplicate=False)),
                   **dict(self.model.named_buffers(remove_duplicate=False))}
        weights = [node for node in self.placeholders.values() if (self.own(node, 1) or "").startswith("weight:")]
        last_of_kind = {self.spec_of[node.name].kind: node for node in weights}
        for node in self.placeholders.values():
            self.env[node] = copied = graph.node_copy(node, lambda n: self.env[n])
            spec = self.spec_of[node.name]
            specs.append(_with_arg(spec, copied))
            if last_of_kind.get(spec.kind) is not node:
                continue
            for index in range(2, self.count):
                for weight in (w for w in weights if self.spec_of[w.name].kind == spec.kind):
                    mine = self.own(weight, 1)
                    target = f"{self.prefix}{index}.{mine[len('weight:'):]}"
                    if target not in tensors:
                        raise NotStampable(f"the model has no {target}")
                    placeholder = graph.placeholder(
                        ("p_" if spec.kind == InputKind.PARAMETER else "b_") + target.replace(".", "_"))
                    placeholder.meta.update(weight.meta)
                    placeholder.meta["val"] = _like(weight.meta.get("val"))
                    self.added[(index, mine)] = placeholder
                    persistent = self.spec_of[weight.name].persistent
                    specs.append(InputSpec(spec.kind, TensorArgument(placeholder.name), target, persistent))
                    (constants if spec.kind == InputKind.BUFFER and not persistent else state_dict)[target] = (
                        tensors[target])
        for (index, mine), node in self.caches.items():  # layer i's cache inputs take layer 1's symbolic shapes
            self.env[node].meta["val"] = _like(self.by_input_name[f"cache.1.{mine[len('cache:'):]}"].meta["val"])
        return specs, state_dict, constants

    def _body(self, graph: torch.fx.Graph) -> None:
        """The prefix and the two layers as traced, layer 1's copies after it, then the tail
        reading the last copy where it read layer 1."""
        tail = set(self.tail)
        self.copies: list[dict[torch.fx.Node, torch.fx.Node]] = []
        for node in self.nodes:
            if node.op in ("placeholder", "output") or node in tail:
                continue
            self.env[node] = graph.node_copy(node, lambda n: self.env[n])
            if node is self.second[-1]:
                previous = {body_node: self.env[body_node] for body_node in self.second}
                for index in range(2, self.count):
                    previous = self._copy(graph, index, previous)
                    self.copies.append(previous)
        last = self.copies[-1]
        for node in self.tail:
            self.env[node] = graph.node_copy(node, lambda n: last[n] if n in last else self.env[n])

    def _copy(self, graph: torch.fx.Graph, index: int, previous: dict[torch.fx.Node, torch.fx.Node]
              ) -> dict[torch.fx.Node, torch.fx.Node]:
        """Layer 1's nodes copied as layer `index`'s, reading `previous` (layer index-1's nodes by
        layer 1's) where layer 1 reads layer 0; return the copies by layer 1's nodes."""
        first = set(self.first)
        copied_layer: dict[torch.fx.Node, torch.fx.Node] = {}

        def mapped(n: torch.fx.Node) -> torch.fx.Node:
            if n in copied_layer:
                return copied_layer[n]
            if n in first:
                return previous[self.second[self.position[n]]]
            mine = self.own(n, 1) if n.op == "placeholder" else None
            if mine is not None:
                return self.added[(index, mine)] if mine.startswith("weight:") else self.env[self.caches[(index, mine)]]
            return self.env[n]

        for node in self.second:
            copied = graph.node_copy(node, mapped)
            modules = copied.meta.get("nn_module_stack")
            if modules:
                copied.meta["nn_module_stack"] = {
                    key: (_relayered(path, self.prefix, index), kind) for key, (path, kind) in modules.items()}
            copied_layer[node] = copied
        return copied_layer

    def _outputs(self, graph: torch.fx.Graph) -> list[Any]:
        """The output node: layer 1's cache writes and cache outputs repeated for each stamped
        layer (a stamped layer's cache output was its input, passed through); return the specs."""
        from torch.export.graph_signature import OutputKind, OutputSpec, TensorArgument

        from .record import user_output_names

        output = next(node for node in self.nodes if node.op == "output")
        values, specs = list(output.args[0]), list(self.shallow.graph_signature.output_specs)
        names = user_output_names(self.shallow)
        user_at = [k for k, spec in enumerate(specs) if spec.kind == OutputKind.USER_OUTPUT]
        if len(names) != len(user_at):
            raise NotStampable("the outputs' names do not line up with the program's user outputs")
        name_at = dict(zip(user_at, names))
        layer_one = {found.group(1): values[k] for k, name in name_at.items()
                     if (found := re.search(r"(?:^|\.)cache\.1\.(.+)$", name))}
        for leaf in layer_one:  # every layer's cache comes out (a static cache input passes through the trace)
            missing = [index for index in range(self.count)
                       if not any(re.search(rf"(?:^|\.)cache\.{index}\.{re.escape(leaf)}$", n) for n in names)]
            if missing:
                raise NotStampable(f"the outputs hold no cache {leaf} of layers {missing}")
        writes = [k for k, spec in enumerate(specs) if spec.kind == OutputKind.USER_INPUT_MUTATION
                  and (self.own(self.placeholders.get(spec.target), 1) or "").startswith("cache:")]
        new_values: list[Any] = []
        new_specs: list[OutputSpec] = []
        second = set(self.second)
        for k, (spec, value) in enumerate(zip(specs, values)):
            found = re.search(r"(?:^|\.)cache\.(\d+)\.(.+)$", name_at.get(k, ""))
            if found and 2 <= int(found.group(1)) < self.count:  # a later layer's (`layers`) passes through
                source = layer_one.get(found.group(2))
                if source not in second:
                    raise NotStampable(f"layer 1's cache output {found.group(2)} is not a node of layer 1")
                value = self.copies[int(found.group(1)) - 2][source]
            elif isinstance(value, torch.fx.Node):
                value = self.env[value]
            new_values.append(value)
            new_specs.append(_with_arg(spec, value))
            if writes and k == writes[-1]:  # the stamped layers' cache writes, after layer 1's
                for index in range(2, self.count):
                    for write in writes:
                        if values[write] not in second:
                            raise NotStampable(f"layer 1's write of {specs[write].target} is not a node of layer 1")
                        copied = self.copies[index - 2][values[write]]
                        written = self.caches[(index, self.own(self.placeholders[specs[write].target], 1))]
                        new_values.append(copied)
                        new_specs.append(OutputSpec(OutputKind.USER_INPUT_MUTATION, TensorArgument(copied.name),
                                                    self.env[written].name))
        graph.output(tuple(new_values)).meta.update(output.meta)
        return new_specs


def _like(value: Any) -> Any:
    """A fake tensor of `value`'s shape, strides and dtype, in its fake mode: a tensor of its own (a
    retrace, `run_decompositions`, takes two placeholders holding one fake tensor for aliased inputs)."""
    mode = getattr(value, "fake_mode", None)
    if mode is None:
        return value
    with mode:
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)


def _symbolic(node: torch.fx.Node) -> bool:
    """Whether `node` computes a size (a SymInt, SymBool or SymFloat), not a tensor."""
    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymBool, torch.SymFloat))


def layer_index(path: str, prefix: str) -> int | None:
    """The layer `path` (a module or parameter path) is under in the layer list at `prefix`, else None."""
    if not path.startswith(prefix):
        return None
    head = path[len(prefix):].split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _relayered(path: str, prefix: str, index: int) -> str:
    if layer_index(path, prefix) != 1:
        return path
    rest = path[len(prefix):].split(".", 1)
    return f"{prefix}{index}" + (f".{rest[1]}" if len(rest) > 1 else "")


def _with_arg(spec: Any, value: Any) -> Any:
    """`spec` naming the node `value` (its copy in the stamped graph)."""
    from torch.export.graph_signature import TensorArgument

    if isinstance(spec.arg, TensorArgument) and isinstance(value, torch.fx.Node):
        return dataclasses.replace(spec, arg=TensorArgument(value.name))
    return spec


def _user_input_names(program: torch.export.ExportedProgram) -> dict[str, torch.fx.Node]:
    """The program's user-input placeholders by their interface names (`cache.1.keys`, the record's)."""
    from torch.export.graph_signature import InputKind

    from .record import record_from_program

    names = record_from_program(program).input_names
    specs = [spec for spec in program.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT]
    if len(names) != len(specs):
        raise NotStampable("the inputs' names do not line up with the program's user inputs")
    nodes = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    return {name: nodes[spec.arg.name] for name, spec in zip(names, specs)}


def _used_ranges(program: torch.export.ExportedProgram, graph: torch.fx.Graph) -> dict[Any, Any]:
    """The program's symbol ranges, less the symbols only the stamped layers' unused cache inputs had."""
    used: set[Any] = set()
    for node in graph.nodes:
        value = node.meta.get("val")
        for tensor in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(tensor, torch.Tensor):
                for size in tensor.shape:
                    expr = getattr(getattr(size, "node", None), "expr", None)
                    if expr is not None:
                        used |= expr.free_symbols
            elif isinstance(tensor, torch.SymInt):
                used |= tensor.node.expr.free_symbols
    return {symbol: bound for symbol, bound in program.range_constraints.items() if symbol in used}


def _stamped_call_graph(program: torch.export.ExportedProgram, prefix: str, count: int) -> list[Any]:
    """The program's module call graph with layer 1's entries repeated for layers 2..N-1, after them."""
    import copy

    entries = [copy.deepcopy(entry) for entry in program.module_call_graph]
    layer_one = [entry for entry in entries if layer_index(entry.fqn, prefix) == 1]
    at = max((k for k, entry in enumerate(entries) if layer_index(entry.fqn, prefix) == 1), default=len(entries) - 1)
    stamped = []
    for index in range(2, count):
        for entry in layer_one:
            clone = copy.deepcopy(entry)
            clone.fqn = _relayered(entry.fqn, prefix, index)
            stamped.append(clone)
    return entries[:at + 1] + stamped + entries[at + 1:]
