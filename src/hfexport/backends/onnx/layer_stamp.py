"""Layer stamping of an ONNX graph: a decoder's repeated layers converted and optimised once, then
stamped for every layer with its own weights, so that torch.onnx's conversion and ONNX Runtime's
fusions cost three layers, not N.

```
stamp_graph(model, root, prefix, count)
    `model`: the fused graph of the decoder's first three layers (`StampedLayers.program(3)`:
    layers 3..N-1's caches pass through to their outputs, an `Identity`, and a write counter's
    `Reshape`); in place, layer 2's nodes
    copied for layers 3..N-1, each reading its own cache inputs and weights (derived from `root`'s
    parameters as layer 2's were) and the previous copy where layer 2 reads layer 1; the tail
    (final norm, head) reads the last copy; each copy's cache outputs replace the pass-through
```
Three layers, not two: ONNX Runtime's fusions join each layer's last residual add to the next
layer's input norm (`SkipSimplifiedLayerNormalization`), so layer 0 (whose input norm has no
residual) differs from the rest, while layers 1 and 2 are alike: layer 2 is checked against layer 1
node for node (op, attributes, and what each input is: the layer's own node, its cache, its weight,
a value every layer shares, or, for the first nodes, the previous layer's output), then stamped.

A node's layer is the highest layer whose cache or weights it depends on (its inputs' layers,
through the graph); a node that depends on none is shared (the mask, positions, the rotary), or
the layer's own where only that layer's nodes read it (a `Constant` of a reshape). The tail is what
depends on a weight of no layer (the head) or follows layer 2's nodes in a graph that has more of
them than layer 1 (a final norm whose weight equals a layer's and was merged with it). A weight
is a parameter of `root` (its name, or, for a constant the optimizer folded, the parameters it
was folded from: onnxscript's `pkg.onnxscript.optimizer.folded_from`; for our packed q/k/v
projection, `PACKED_FROM`): layer 2's is matched to the same parameter of layer 2 as it is, or
transposed, or the parts concatenated, by its bytes, and layer i's derived the same way from layer
i's parameters. Where the optimizer merged equal weights of several layers into one (a random
model's norms), the copies share it only where layer i's weights are equal too.

Anything unexpected raises `NotStampable`, before the graph is changed, and the caller converts
the whole program instead (the record says why). Validation then runs the stamped graph against the
whole eager model, as any export.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

import numpy as np
import torch

from ...capture.stamp import NotStampable, layer_index

__all__ = ["stamp_graph", "folded_sources", "PACKED_FROM", "TRACED_LAYERS"]

#: the layers converted before stamping: layer 2 is stamped, checked against layer 1
TRACED_LAYERS = 3
#: metadata of a packed projection weight (`gqa.py`): its parts' sources, a JSON list of lists
PACKED_FROM = "hfexport.packed_from"
#: onnxscript's optimizer (0.7.2): the sources a folded constant was computed from, a Python list
_FOLDED_FROM = "pkg.onnxscript.optimizer.folded_from"
_CACHE = re.compile(r"(?:^|\.)cache\.(\d+)\.")
_SHARED = -1
_TAIL = 1 << 30


def folded_sources(value: Any) -> list[str]:
    """The names `value` (an initializer) was folded from by onnxscript's optimizer, else its own."""
    listed = value.metadata_props.get(_FOLDED_FROM)
    if listed is None:
        return [value.name]
    try:
        return [str(name) for name in ast.literal_eval(listed)]
    except (ValueError, SyntaxError):
        return []


def stamp_graph(model: Any, root: torch.nn.Module, prefix: str, count: int) -> str:
    """Stamp layer 2 of `model` (an `ir.Model` of the first three of `count` layers of `root`'s
    layer list at `prefix`, `model.model.layers`) for layers 3..count-1, in place; return the
    record's line.

    Raises:
        NotStampable: the graph is not three layers whose last two are alike (before any change).
    """
    plan = _Plan(model.graph, root, prefix.rstrip(".") + ".", count)
    plan.check()
    plan.write()
    layers = "layer 3" if count == TRACED_LAYERS + 1 else f"layers 3-{count - 1}"
    return f"{layers} stamped in the ONNX graph from layer 2 of a three-layer conversion"


class _Plan:
    """`stamp_graph`'s steps: attribute nodes to layers, check layer 2 against layer 1 (what each
    input of layer 2 is), then write the copies."""

    def __init__(self, graph: Any, root: torch.nn.Module, prefix: str, count: int):
        self.graph, self.prefix, self.count = graph, prefix, count
        self.tensors = {**dict(root.named_parameters(remove_duplicate=False)),
                        **dict(root.named_buffers(remove_duplicate=False))}
        self.nodes = list(graph)
        self.inputs_by_name = {v.name: v for v in graph.inputs}

    # -- which layer each value and node is ---------------------------------------------------------

    def sources(self, value: Any) -> list[list[str]]:
        """The parameters `value` (an initializer) was made from, by part: `[[name]]` for a
        parameter or a constant folded from one, one list a part for a packed projection."""
        if value.name in self.tensors:
            return [[value.name]]
        if PACKED_FROM in value.metadata_props:
            return [[name for name in part if name in self.tensors]
                    for part in json.loads(value.metadata_props[PACKED_FROM])]
        found = [name for name in folded_sources(value) if name in self.tensors]
        return [found] if found else []

    def layer_of_name(self, name: str) -> int | None:
        return layer_index(name, self.prefix)

    def weight_layer(self, value: Any) -> int | None:
        """The layer whose parameters an initializer was made from; `_SHARED` for a constant of no
        parameter; None for a parameter of no layer (the head, the final norm, the embedding)."""
        names = [name for part in self.sources(value) for name in part]
        if not names:
            return _SHARED
        layers = {self.layer_of_name(name) for name in names}
        if len(layers) != 1:
            raise NotStampable(f"initializer {value.name} was made from several layers' weights: {sorted(names)}")
        return layers.pop()

    def attribute(self) -> None:
        """`self.layer`: each node's layer (`_SHARED`, 0.., or `_TAIL`)."""
        import onnx_ir as ir

        level: dict[int, int] = {}
        for value in self.graph.inputs:
            found = _CACHE.search(value.name)
            level[id(value)] = int(found.group(1)) if found else _SHARED
        self.weight_layers: dict[int, int | None] = {}
        for value in self.graph.initializers.values():
            layer = self.weight_layer(value)
            self.weight_layers[id(value)] = layer
            level[id(value)] = _SHARED if layer is None else layer
        self.layer: dict[int, int] = {}
        subgraphs = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
        for node in self.nodes:
            if any(a.type in subgraphs for a in node.attributes.values()):
                raise NotStampable(f"{node.op_type} node {node.name} holds a subgraph")
            layers = [level.get(id(v), _SHARED) for v in node.inputs if v is not None]
            layer = max(layers, default=_SHARED)
            if layer != _TAIL and layer >= 0 and any(
                    v is not None and self.weight_layers.get(id(v), _SHARED) is None for v in node.inputs):
                layer = _TAIL  # reads a weight of no layer after a layer: the head, the final norm
            self.layer[id(node)] = layer
            for out in node.outputs:
                level[id(out)] = layer
        # a node no weight or cache reaches belongs to the layer that alone reads it (a Constant)
        for node in reversed(self.nodes):
            if self.layer[id(node)] == _SHARED and not any(out.is_graph_output() for out in node.outputs):
                found = {self.layer[id(use.node)] for out in node.outputs for use in out.uses()}
                if len(found) == 1 and next(iter(found)) not in (_SHARED, _TAIL):
                    self.layer[id(node)] = found.pop()

    # -- the check --------------------------------------------------------------------------------

    def check(self) -> None:
        """Find layers 1 and 2, the tail and the later layers' pass-through; check layer 2 against
        layer 1 (`self.roles`: what each of layer 2's inputs is) and that every later layer has
        what its copy reads. Raises `NotStampable`; the graph is not changed."""
        self.attribute()
        traced = TRACED_LAYERS
        segments = {k: [n for n in self.nodes if self.layer[id(n)] == k] for k in range(traced)}
        first, second = segments[traced - 2], segments[traced - 1]
        if not first or len(second) < len(first):
            raise NotStampable(f"layers 1 and 2 converted to {len(first)} and {len(second)} nodes")
        # the tail: what depends on a weight of no layer, and layer 2's nodes past layer 1's count
        # (a final norm whose weight was merged with a layer's equal one)
        extra = {id(n) for n in second[len(first):]}
        second = second[:len(first)]
        self.first, self.second = first, second
        self.tail = [n for n in self.nodes if self.layer[id(n)] == _TAIL or id(n) in extra]
        self.later = [n for n in self.nodes if traced <= self.layer[id(n)] < _TAIL]
        self.at = {id(n): k for k, n in enumerate(first)} | {id(n): k for k, n in enumerate(second)}
        in_first = {id(n) for n in first}
        in_second = {id(n) for n in second}
        self.passed = self._passed_through()
        self._check_alike(in_first, in_second)
        for node in self.tail:
            for value in node.inputs:
                producer = value.producer() if value is not None else None
                if producer is not None and (id(producer) in in_first or self.layer[id(producer)] in range(traced - 2)):
                    raise NotStampable(f"the tail's {node.op_type} {node.name} reads {value.name} of an earlier layer")
        if not any(role[0] == "link" for roles in self.roles for role in roles):
            raise NotStampable("layer 2 reads nothing of layer 1")
        stamped = {_relayered_cache(y.name, traced - 1, k) for node in second for y in node.outputs
                   if y.is_graph_output() for k in range(traced, self.count)}
        if stamped != set(self.passed):
            raise NotStampable(f"the later layers' cache outputs {sorted(set(self.passed) ^ stamped)[:4]} are not "
                               "layer 2's, one layer on each")
        self._check_later_layers()

    def _check_alike(self, in_first: set[int], in_second: set[int]) -> None:
        """Layer 2 against layer 1 node for node: op, attributes, each input's role (`self.roles`),
        its outputs (a cache output one layer on), and no reader of its values but itself, the tail
        and the later layers' pass-through."""
        traced = TRACED_LAYERS
        readers = {id(n) for n in self.tail} | {id(n) for n in self.later}
        self.roles: list[list[tuple]] = []
        self.derived: dict[int, tuple] = {}
        for a, b in zip(self.first, self.second):
            if (a.op_type, a.domain, a.overload, len(a.inputs), len(a.outputs)) != (
                    b.op_type, b.domain, b.overload, len(b.inputs), len(b.outputs)):
                raise NotStampable(f"layer 2's {b.op_type} {b.name} is not layer 1's {a.op_type} {a.name}")
            if _attributes(a) != _attributes(b):
                raise NotStampable(f"layer 2's {b.op_type} {b.name} has other attributes than layer 1's {a.name}")
            self.roles.append([self._role(x, y, in_first, in_second) for x, y in zip(a.inputs, b.inputs)])
            for x, y in zip(a.outputs, b.outputs):
                if x.is_graph_output() != y.is_graph_output():
                    raise NotStampable(f"layer 2's {y.name} is an output where layer 1's {x.name} is not, or back")
                if y.is_graph_output() and not _relayered_cache(x.name, traced - 2, traced - 1) == y.name:
                    raise NotStampable(f"layer 2's output {y.name} is not layer 1's {x.name} one layer on")
            for y in b.outputs:
                for use in y.uses():
                    if id(use.node) not in in_second and id(use.node) not in readers:
                        raise NotStampable(f"{use.node.op_type} {use.node.name} outside layer 2 and the tail "
                                           f"reads {y.name}")

    def _check_later_layers(self) -> None:
        """Each stamped layer has what its copy reads: its cache inputs, its weights shaped as layer
        2's, and, where layers 1 and 2 share a merged weight, weights equal to it."""
        traced = TRACED_LAYERS
        caches = {role[1] for roles in self.roles for role in roles if role[0] == "cache"}
        merged = {id(role[1]): role for roles in self.roles for role in roles if role[0] == "merged"}
        for k in range(traced, self.count):
            missing = [name for name in (_relayered_cache(c, traced - 1, k) for c in caches)
                       if name not in self.inputs_by_name]
            if missing:
                raise NotStampable(f"the graph takes no {missing[0]}")
            for _, relatives, _ in self.derived.values():
                for relative in relatives:
                    mine, theirs = self._param(traced - 1, relative), self._param(k, relative)
                    if (mine.shape, mine.dtype) != (theirs.shape, theirs.dtype):
                        raise NotStampable(f"layer {k}'s {relative} is {tuple(theirs.shape)} {theirs.dtype}, "
                                           f"layer 2's {tuple(mine.shape)} {mine.dtype}")
            for _, value, relatives in merged.values():
                wanted = value.const_value.tobytes()
                if any(_numpy(self._param(k, r)).tobytes() != wanted for r in relatives):
                    raise NotStampable(f"layer {k}'s {relatives} differ where layers 1 and 2 share {value.name}")

    def _passed_through(self) -> dict[str, Any]:
        """Layers 3..N-1's cache outputs in the three-layer graph, each made of its layer's cache
        input alone (passed through: an `Identity`, and a scalar counter's `Reshape`):
        `{output name: value}`; the copies make them instead."""
        later = {id(n) for n in self.later}
        passed = {}
        for node in self.later:
            for value in node.inputs:
                producer = value.producer() if value is not None else None
                if value is None or (producer is not None and id(producer) in later):
                    continue
                found = _CACHE.search(value.name) if value.name in self.inputs_by_name else None
                constant = producer is None and value.const_value is not None \
                    and self.weight_layers.get(id(value)) == _SHARED
                if not constant and (found is None or int(found.group(1)) < TRACED_LAYERS):
                    raise NotStampable(f"{node.op_type} {node.name} of a later layer reads {value.name}, "
                                       "not only that layer's cache")
            for out in node.outputs:
                if out.is_graph_output():
                    passed[out.name] = out
                if any(id(use.node) not in later for use in out.uses()):
                    raise NotStampable(f"{out.name}, passed through for a later layer, is read by the layers")
        return passed

    def _role(self, x: Any, y: Any, in_first: set[int], in_second: set[int]) -> tuple:
        """What layer 2's input `y` is, given layer 1's `x` at the same place."""
        if x is None or y is None:
            if x is not y:
                raise NotStampable("an input layer 1 leaves empty is set in layer 2, or back")
            return ("none",)
        px, py = x.producer(), y.producer()
        if py is not None and id(py) in in_second:
            if px is None or id(px) not in in_first or self.at[id(px)] != self.at[id(py)] or x.index() != y.index():
                raise NotStampable(f"layer 2's {y.name} is not made as layer 1's {x.name}")
            return ("own", self.at[id(py)], y.index())
        if py is not None and id(py) in in_first:
            if px is not None and (id(px) in in_first or id(px) in in_second):
                raise NotStampable(f"layer 2 reads layer 1's {y.name} where layer 1 reads its own {x.name}")
            return ("link", self.at[id(py)], y.index())
        if y.name in self.inputs_by_name and _CACHE.search(y.name):
            if x.name != _relayered_cache(y.name, TRACED_LAYERS - 1, TRACED_LAYERS - 2):
                raise NotStampable(f"layer 2 reads the cache {y.name} where layer 1 reads {x.name}")
            return ("cache", y.name)
        if y.const_value is not None and y.name in self.graph.initializers:
            return self._weight_role(x, y)
        if x is y and (py is None or self.layer[id(py)] == _SHARED):
            return ("shared", y)
        raise NotStampable(f"layer 2 reads {y.name} where layer 1 reads {x.name}")

    def _weight_role(self, x: Any, y: Any) -> tuple:
        traced = TRACED_LAYERS - 1
        layer = self.weight_layers.get(id(y), _SHARED)
        if layer == _SHARED:
            if x is not y:
                raise NotStampable(f"layer 2 reads the constant {y.name} where layer 1 reads {x.name}")
            return ("shared", y)
        if x is y:  # equal weights merged by the optimizer: shared by the copies only where theirs are equal
            return ("merged", y, self._merged_roles(y))
        if layer != traced or self.weight_layers.get(id(x)) != traced - 1:
            raise NotStampable(f"layer 2 reads {y.name} (of layer {layer}) where layer 1 reads {x.name}")
        parts = [[self._relative(name) for name in part] for part in self.sources(y)]
        if parts != [[self._relative(name) for name in part] for part in self.sources(x)] \
                or any(len(part) != 1 for part in parts):
            raise NotStampable(f"layer 2's {y.name} is not made from layer 2's weights as layer 1's {x.name} "
                               "from layer 1's")
        if id(y) not in self.derived:
            self.derived[id(y)] = (y, [part[0] for part in parts], self._recipe(y, [part[0] for part in parts]))
        return ("weight", id(y))

    def _relative(self, name: str) -> str:
        return name[len(self.prefix):].split(".", 1)[1] if self.layer_of_name(name) is not None else name

    def _param(self, layer: int, relative: str) -> torch.Tensor:
        name = f"{self.prefix}{layer}.{relative}"
        if name not in self.tensors:
            raise NotStampable(f"the model has no {name}")
        return self.tensors[name]

    def _recipe(self, y: Any, relatives: list[str]) -> str:
        """How `y` is made from layer 2's parameters `relatives`, checked on its bytes."""
        wanted = y.const_value.tobytes()
        shape = tuple(y.shape.dims) if y.shape is not None else None
        arrays = [_numpy(self._param(TRACED_LAYERS - 1, relative)) for relative in relatives]
        for recipe in ("as_is", "transposed"):
            made = _made(recipe, arrays)
            if made is not None and made.shape == shape and made.dtype.itemsize * made.size == len(wanted) \
                    and np.ascontiguousarray(made).tobytes() == wanted:
                return recipe
        raise NotStampable(f"layer 2's {y.name} is not its weights {relatives} as they are, transposed or packed")

    def _merged_roles(self, y: Any) -> list[str]:
        """The parameters of layer 2 equal to `y` (layers 1 and 2 read it: the optimizer merged
        their equal weights), which a stamped layer's copy may read only where its own are equal."""
        wanted = y.const_value.tobytes()
        roles = []
        for name, tensor in self.tensors.items():
            if self.layer_of_name(name) == TRACED_LAYERS - 1 and tuple(tensor.shape) == tuple(y.shape.dims) \
                    and _numpy(tensor).tobytes() == wanted:
                roles.append(self._relative(name))
        if not roles:
            raise NotStampable(f"layers 1 and 2 share {y.name}, which is none of layer 2's weights")
        return roles

    # -- the copies -------------------------------------------------------------------------------

    def write(self) -> None:
        import onnx_ir as ir

        graph = self.graph
        outputs_by_name = {v.name: index for index, v in enumerate(graph.outputs)}
        previous = [list(node.outputs) for node in self.second]
        made: list[Any] = []
        for k in range(TRACED_LAYERS, self.count):
            weights: dict[int, Any] = {}
            copies: list[list[Any]] = []
            for node, roles in zip(self.second, self.roles):
                inputs = [self._input(role, k, previous, copies, weights) for role in roles]
                copy = ir.Node(node.domain, node.op_type, inputs, [_copied(a) for a in node.attributes.values()],
                               overload=node.overload, num_outputs=len(node.outputs), version=node.version,
                               name=f"{node.name}_layer{k}" if node.name else None)
                for old, new in zip(node.outputs, copy.outputs):
                    new.name = _relayered_cache(old.name, TRACED_LAYERS - 1, k) if old.is_graph_output() \
                        else f"{old.name}_layer{k}"
                    new.type = old.type
                    new.shape = old.shape.copy() if old.shape is not None else None
                copies.append(list(copy.outputs))
                made.append(copy)
            previous = copies
        graph.insert_after(self.second[-1], made)
        second = {id(n) for n in self.second}
        for node in self.tail:  # reads the last copy where it read layer 2
            for index, value in enumerate(node.inputs):
                producer = value.producer() if value is not None else None
                if producer is not None and id(producer) in second:
                    node.replace_input_with(index, previous[self.at[id(producer)]][value.index()])
        for copy in made:  # each copy's cache outputs in place of the pass-through
            for out in copy.outputs:
                if self.passed.pop(out.name, None) is not None:
                    graph.outputs[outputs_by_name[out.name]] = out
        if self.passed:  # `check` found every later layer's cache passed through, which the copies make
            raise AssertionError(f"stamped outputs left unmade: {sorted(self.passed)}")
        graph.remove(self.later, safe=True)
        graph.sort()  # a tail node placed among layer 2's now reads the last copy

    def _input(self, role: tuple, k: int, previous: list[list[Any]], copies: list[list[Any]],
               weights: dict[int, Any]) -> Any:
        import onnx_ir as ir

        kind = role[0]
        if kind == "none":
            return None
        if kind == "own":
            return copies[role[1]][role[2]]
        if kind == "link":
            return previous[role[1]][role[2]]
        if kind == "cache":
            value = self.inputs_by_name[_relayered_cache(role[1], TRACED_LAYERS - 1, k)]
            template = self.inputs_by_name[role[1]]
            value.type, value.shape = template.type, template.shape.copy() if template.shape is not None else None
            return value
        if kind in ("shared", "merged"):
            return role[1]
        y, relatives, recipe = self.derived[role[1]]
        if role[1] not in weights:
            array = _made(recipe, [_numpy(self._param(k, relative)) for relative in relatives])
            name = _relayered_weight(y.name, self.prefix, TRACED_LAYERS - 1, k)
            tensor = ir.Tensor(array, name=name)
            value = ir.Value(name=name, shape=ir.Shape(array.shape), type=y.type, const_value=tensor,
                             metadata_props=_relayered_props(y.metadata_props, self.prefix, TRACED_LAYERS - 1, k))
            self.graph.register_initializer(value)
            weights[role[1]] = value
        return weights[role[1]]


def _attributes(node: Any) -> list[tuple]:
    out = []
    for name, attr in sorted(node.attributes.items()):
        value = attr.value
        if hasattr(value, "tobytes"):
            value = (str(value.dtype), tuple(value.shape.dims) if value.shape is not None else None, value.tobytes())
        elif isinstance(value, (list, tuple)):
            value = tuple(value)
        out.append((name, attr.type, value))
    return out


def _copied(attr: Any) -> Any:
    import onnx_ir as ir

    return ir.Attr(attr.name, attr.type, attr.value)


def _relayered_cache(name: str, old: int, new: int) -> str:
    return re.sub(rf"(^|\.)cache\.{old}\.", rf"\g<1>cache.{new}.", name, count=1)


def _relayered_weight(name: str, prefix: str, old: int, new: int) -> str:
    relayered = name.replace(f"{prefix}{old}.", f"{prefix}{new}.")
    return relayered if relayered != name else f"{name}_layer{new}"


def _relayered_props(props: dict[str, str], prefix: str, old: int, new: int) -> dict[str, str]:
    return {key: value.replace(f"{prefix}{old}.", f"{prefix}{new}.") for key, value in props.items()}


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's values as numpy (shared memory); bfloat16 as ml_dtypes' bfloat16, as onnx_ir holds it."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _made(recipe: str, arrays: list[np.ndarray]) -> np.ndarray | None:
    """An initializer made from its parts by `recipe`: each as it is or transposed (2-D), several
    concatenated along the last axis (a packed projection's weights, or its biases)."""
    parts = [a.T if recipe == "transposed" and a.ndim == 2 else a for a in arrays]
    if len(parts) == 1:
        return parts[0]
    if len({p.shape[:-1] for p in parts}) != 1:
        return None
    return np.concatenate(parts, axis=-1)
