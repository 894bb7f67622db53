"""`OnnxRunner`: runs an ONNX program in ONNX Runtime (CPU), fed by input name; its cache session
keeps a generation component's cache in ONNX Runtime's own buffers (IO binding).

# NOTE: why one buffer per cache pair: each `input.cache.<l>.<t>` and its `output.cache.<l>.<t>`
# are bound to the same `OrtValue`, so ONNX Runtime writes the step's update where it reads the
# cache from (the export writes a static cache with one `ScatterElements` on the cache input, see
# `cache_writes.py`); a step copies no cache in or out, only the logits come back. Whether ONNX
# Runtime really wrote into the bound buffer is checked on the first call (the output's address);
# where it did not, or refused the binding, the session copies the cache each step as the base
# `CacheSession` does and says why in `reason` (and in `record.details["cache_session"]`).
#
# The session options it sets over ONNX Runtime's defaults, and their typed override
# (`$HFEXPORT_ORT_SESSION_CONFIG`), are `session_options.py`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...errors import ExportError
from ...runner import CacheSession, Runner, to_numpy
from ...generation.arrays import as_array
from .artifact import HfOnnxProgram, scratch_session_options
from .graph_interface import GraphInterface
from .loaded import OnnxModelFiles
from .scratch import scratch_files, scratch_model
from .session_options import SESSION_CONFIG, SESSION_CONFIG_ENV, apply_session_config, session_config

__all__ = ["OnnxRunner", "OnnxCacheSession", "SESSION_CONFIG", "SESSION_CONFIG_ENV", "session_config"]

logger = logging.getLogger("hfexport")

#: ONNX Runtime's type strings of the logits a bound step preallocates
_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


class OnnxRunner(Runner):
    """Runs an ONNX model in ONNX Runtime on the CPU, fed by input name."""
    runtime = "ONNX Runtime (CPUExecutionProvider)"

    def __init__(self, artifact, record):
        super().__init__(artifact, record)
        import onnxruntime as ort

        self._mapped: tuple[str, ...] = ()
        self.session_config = session_config()
        record.details["ort_session"] = dict(self.session_config)
        if isinstance(artifact, HfOnnxProgram) and artifact.weights_external():
            # an export not yet written (validation): opened from a scratch file, its weights mapped
            # from the file the fusions' load check wrote (`scratch.py`), which the folder then takes
            with scratch_model(artifact.model) as source:
                self.session = self._session(ort, source, scratch_session_options())
            self._mapped = scratch_files(artifact.model)
        else:
            options = ort.SessionOptions()
            options.log_severity_level = 3
            # a loaded model: the private copies of its checked files (`loaded.py`), never the folder's
            source = str(artifact.path) if isinstance(artifact, OnnxModelFiles) else artifact.model_proto.SerializeToString()
            self.session = self._session(ort, source, options)
        self.input_names = [i.name for i in self.session.get_inputs()]
        # a graph whose interface differs from the record's (GroupQueryAttention's, `gqa.py`): fed by name
        self.interface = GraphInterface.of(record)
        taken = set(self.input_names)
        self.input_map = {name: graph for name, graph in zip(record.input_names, record.named_inputs()) if graph in taken}
        given = {o.name for o in self.session.get_outputs()}
        self.output_map = {name: graph for name, graph in zip(record.output_names, record.named_outputs())
                           if graph in given}

    def _session(self, ort: Any, source: str | bytes, options: Any) -> Any:
        return ort.InferenceSession(source, apply_session_config(options, self.session_config),
                                    providers=["CPUExecutionProvider"])

    @property
    def precision(self) -> str:
        return "the model's own dtypes (ONNX Runtime CPU runs each op in its inputs' dtype)"

    @property
    def mapped_files(self) -> tuple[str, ...]:
        """The scratch files of the external weights, which ONNX Runtime maps (prepacking off)."""
        return self._mapped

    def run_flat(self, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.interface is not None:
            return self._run_translated(leaves)
        if len(leaves) != len(self.input_names):
            raise ValueError(f"the ONNX model takes {len(self.input_names)} inputs, got {len(leaves)} tensors")
        feed = {name: to_numpy(leaf) for name, leaf in zip(self.input_names, leaves)}
        return [torch.from_numpy(np.asarray(out)) for out in self.session.run(None, feed)]

    def _run_translated(self, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run on `leaves` in the record's interface, translated to the graph's (`GraphInterface`).

        Each cache input the graph writes in place is copied into one buffer bound as both input and
        output, as `OnnxCacheSession` binds it: GroupQueryAttention then writes the new rows into it
        and leaves every other slot as it was, as eager's `StaticLayer` does (given two buffers, its
        present output holds only the slots up to the attended length)."""
        import onnxruntime as ort

        names = self.record.input_names
        if len(leaves) != len(names):
            raise ValueError(f"the ONNX model's record takes {len(names)} inputs, got {len(leaves)} tensors")
        named = {name: to_numpy(leaf) for name, leaf in zip(names, leaves)}
        binding = self.session.io_binding()
        shared = {}
        for name, value in self.interface.feed(named).items():
            graph_name = self.input_map[name]
            if name in self.output_map and graph_name in self._written_in_place():
                shared[name] = ort.OrtValue.ortvalue_from_numpy(np.array(value))  # a copy: the caller's stays
                binding.bind_ortvalue_input(graph_name, shared[name])
                binding.bind_ortvalue_output(self.output_map[name], shared[name])
            else:
                binding.bind_cpu_input(graph_name, np.ascontiguousarray(value))
        returned = [name for name in self.output_map if name not in shared]
        for name in returned:
            binding.bind_output(self.output_map[name], "cpu")
        self.session.run_with_iobinding(binding)
        outputs = dict(zip([*shared, *returned], binding.get_outputs()))
        added = self.interface.outputs(named)
        return [torch.from_numpy(np.array(added[name] if name in added else outputs[name].numpy()))
                for name in self.record.output_names]

    def _written_in_place(self) -> set[str]:
        """The graph's cache inputs whose paired output is written into them (recorded at export)."""
        recorded = self.record.details.get("in_place_cache")
        if recorded is None:
            pairs = {graph: self.output_map[name] for name, graph in self.input_map.items() if name in self.output_map}
            recorded = [name for name, ok in in_place_writers(self.graph_proto(), pairs).items() if ok]
            self.record.details["in_place_cache"] = sorted(recorded)
        return set(recorded)

    def graph_proto(self) -> Any:
        """The model's `GraphProto` (a loaded model's external weights not read)."""
        import onnx

        if hasattr(self.artifact, "model_proto"):
            return self.artifact.model_proto.graph
        return onnx.load(str(self.artifact.path), load_external_data=False).graph

    def cache_session(self, cache: dict[str, torch.Tensor]) -> CacheSession:
        """A session holding `cache` in ONNX Runtime buffers, each cache input bound to the buffer
        of its paired output (see the module docstring)."""
        return OnnxCacheSession(self, cache)


class OnnxCacheSession(CacheSession):
    """The cache of one component kept in bound `OrtValue`s between calls (IO binding).

    A cache output written in place on its own input (a scatter, GroupQueryAttention's shared
    past/present buffer) shares that input's buffer; write counters a GroupQueryAttention graph no
    longer takes (`graph_interface.GraphInterface`) are kept and counted here; any other cache output (a
    growing dynamic cache, a write counter, a prefill's first cache) is
    taken from ONNX Runtime after each call and bound as the next call's input: a copy, listed
    in `copied` with why.

    Attributes:
        in_place: whether the aliased buffers really are written in place (checked on the first call).
        reason: why not, when `in_place` is False (the session then copies every leaf each call).
        copied: `{leaf: why}` for the leaves copied each call while `in_place` holds.
    """

    def __init__(self, runner: OnnxRunner, cache: dict[str, torch.Tensor]):
        super().__init__(runner, cache)
        import onnxruntime as ort

        record = runner.record
        self._interface = runner.interface
        if self._interface is not None:  # the graph's names, where it takes or gives a leaf
            self._inputs, self._outputs = runner.input_map, runner.output_map
        else:
            self._inputs = dict(zip(record.input_names, runner.input_names))
            self._outputs = dict(zip(record.output_names, [o.name for o in runner.session.get_outputs()]))
        # write counters the graph no longer takes (GroupQueryAttention counts from the mask): kept here
        self._counters = list(self._interface.counters) if self._interface is not None else []
        self.in_place, self.reason, self._checked = True, None, False
        self._arrays = {name: np.array(to_numpy(value)) for name, value in cache.items()}  # owned buffers
        pairs = {self._inputs[name]: self._outputs[name] for name in cache if name in self._outputs}
        recorded = record.details.get("in_place_cache")  # found at export: the graph is not read again
        writers = ({source: source in recorded for source in pairs} if recorded is not None
                   else in_place_writers(runner.graph_proto(), pairs))
        self._aliased = [name for name in cache if name in self._outputs and writers[self._inputs[name]]]
        self._values = {name: ort.OrtValue.ortvalue_from_numpy(self._arrays[name]) for name in self._aliased}
        self._taken = [name for name in record.output_names if name.startswith("cache.") and name not in self._aliased
                       and name not in self._counters]
        self._returned = [name for name in record.output_names if not name.startswith("cache.")]
        self.copied = {name: "its output is not written by a scatter on its input (grows, or is read after "
                       "the write)" for name in self._taken}
        self._binding = runner.session.io_binding()
        for name, value in self._values.items():
            self._binding.bind_ortvalue_input(self._inputs[name], value)
            self._binding.bind_ortvalue_output(self._outputs[name], value)
        for name in cache:
            if name not in self._values and name not in self._counters:
                self._binding.bind_cpu_input(self._inputs[name], self._arrays[name])
        self._order = [*self._aliased, *self._taken, *self._returned]  # the binding's output order
        self._positions = {name: index for index, name in enumerate(self._order)}

    def run(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run one call on `feed` (no cache leaves); the cache is updated in its bound buffers."""
        if not self.in_place:
            return super().run(feed)
        named, counted = {name: as_array(tensor) for name, tensor in feed.items()}, {}
        if self._interface is not None:
            counters = {name: self._arrays[name] for name in self._counters}
            named, counted = self._interface.feed({**named, **counters}), self._interface.outputs({**named, **counters})
        for name, array in named.items():
            self._binding.bind_cpu_input(self._inputs[name], array)
        for name in (*self._taken, *self._returned):  # rebound each call: a bound output keeps its last shape
            self._binding.bind_output(self._outputs[name], "cpu")
        try:
            self.runner.session.run_with_iobinding(self._binding)
        except Exception as error:  # noqa: BLE001 - only the first call: the binding itself refused
            if self._checked:
                raise
            self._fall_back(f"ONNX Runtime refused one buffer for a cache input and its output: "
                            f"{str(error).splitlines()[0][:200]}", self.cache())
            return super().run(feed)
        outputs = _BoundOutputs(self._binding, self._positions)
        self._arrays.update(counted)
        for name in self._taken:
            self._arrays[name] = np.array(outputs[name].numpy())
            if name in self._inputs:
                self._binding.bind_cpu_input(self._inputs[name], self._arrays[name])
        if not self._checked:
            self._checked = True
            moved = [name for name in self._aliased if outputs[name].data_ptr() != self._values[name].data_ptr()]
            if moved:
                updated = {name: torch.from_numpy(np.array(outputs[name].numpy())) if name in self._aliased
                           else torch.from_numpy(self._arrays[name].copy()) for name in self._arrays}
                self._fall_back(f"ONNX Runtime wrote {moved[0]} outside the bound buffer", updated)
        return {name: torch.from_numpy(np.array(outputs[name].numpy())) for name in self._returned}

    def bind(self, feed: dict[str, torch.Tensor], masks: tuple[str, ...] = (),
             longest: int = 0) -> Callable[[int], dict[str, np.ndarray]] | None:
        """`CacheSession.bind`: the feed's arrays bound once, the logits bound to one buffer of
        their one-token shape, and each step only the mask rebound: the first `total` entries of
        one row of ones (GroupQueryAttention's 2-D mask over the cached and new tokens, `gqa.py`).

        None where a step needs more: a cache copied each call (not in place, or an output not
        written into its input), the first call not yet run (the in-place check), a mask the graph
        takes as the record gives it (no `GraphInterface`: a 4-D mask over a static cache's slots),
        an output other than the logits, or logits whose shape is not `[1, 1, vocabulary]`."""
        import onnxruntime as ort

        if not (self.in_place and self._checked) or self._taken or self._returned != ["logits"]:
            return None
        if masks and (self._interface is None or any(self._inputs.get(name) is None for name in masks)):
            return None
        logits_type = dict((o.name, o) for o in self.runner.session.get_outputs())[self._outputs["logits"]]
        shape, dtype = logits_type.shape, _NUMPY_TYPES.get(logits_type.type)
        if dtype is None or len(shape) != 3 or not isinstance(shape[-1], int):
            return None
        arrays = {name: as_array(value) for name, value in feed.items() if name not in masks}
        if self._interface is not None:  # the record's inputs the graph no longer takes are left out
            arrays = {name: array for name, array in arrays.items() if name not in self._interface.unfed}
        if any(name not in self._inputs for name in arrays):
            return None
        logits = np.empty((1, 1, shape[-1]), dtype=dtype)
        binding, session = self._binding, self.runner.session
        for name, array in arrays.items():
            binding.bind_cpu_input(self._inputs[name], array)  # read from the array at each run
        binding.bind_ortvalue_output(self._outputs["logits"], ort.OrtValue.ortvalue_from_numpy(logits))
        ones = np.ones((1, max(longest, 1)), dtype=np.int64)
        mask_names = [self._inputs[name] for name in masks]
        counters: dict[Any, list[str]] = {}  # by dtype: one array of the count per dtype a step
        for name in self._counters:
            counters.setdefault(self._arrays[name].dtype, []).append(name)
        kept, outputs = self._arrays, {"logits": logits}

        def call(total: int) -> dict[str, np.ndarray]:
            if total > ones.shape[1]:
                raise ExportError(f"the bound greedy steps were set up for {ones.shape[1]} tokens, not {total}",
                                  remedy="bind again for the longer generation")
            for name in mask_names:
                binding.bind_cpu_input(name, ones[:, :total])
            session.run_with_iobinding(binding)
            for kind, names in counters.items():  # what the generic call would have counted (read, never written)
                value = np.asarray(total, dtype=kind)
                for name in names:
                    kept[name] = value
            return outputs

        return call

    def cache(self) -> dict[str, torch.Tensor]:
        """The cache leaves after the last call, copied out of the bound buffers."""
        if not self.in_place:
            return super().cache()
        return {name: torch.from_numpy(array.copy()) for name, array in self._arrays.items()}

    def _fall_back(self, reason: str, cache: dict[str, torch.Tensor]) -> None:
        """Copy `cache` in and out each step from now on (the base session), with `reason` recorded."""
        self._cache = cache
        self.in_place, self.reason = False, reason
        self.runner.record.details["cache_session"] = {"in_place": False, "reason": reason}
        logger.warning("ONNX Runtime cache session copies the cache each step: %s", reason)


def in_place_writers(graph: Any, pairs: dict[str, str]) -> dict[str, bool]:
    """For each `{input name: output name}` pair, whether one buffer can hold both: the output is
    written into the input (`_writes_in_place`: a scatter, GroupQueryAttention's shared past/present), and nothing else reads the input's values
    (a `Shape` reads only its shape), so no op can read the input after its output was written.
    `graph`: a `GraphProto` or an ONNX IR graph."""
    nodes = [(node.op_type, list(node.input), list(node.output)) if hasattr(node, "input") else
             (node.op_type, [v.name if v is not None else "" for v in node.inputs], [v.name for v in node.outputs])
             for node in (graph if callable(getattr(graph, "node", None)) else graph.node)]
    producers = {out: node for node in nodes for out in node[2]}
    readers: dict[str, list] = {}
    for node in nodes:
        for name in node[1]:
            readers.setdefault(name, []).append(node)
    result = {}
    for source, target in pairs.items():
        writer = producers.get(target)
        others = [n for n in readers.get(source, []) if n is not writer and n[0] != "Shape"]
        result[source] = writer is not None and _writes_in_place(writer, source, target) and not others
    return result


def _writes_in_place(writer: tuple, source: str, target: str) -> bool:
    """Whether the node `writer` `(op, inputs, outputs)` writes its output `target` into its input
    `source`: a scatter's data, or GroupQueryAttention's past key/value as its present one
    (ONNX Runtime shares the buffer when both are bound to it, `past_present_share_buffer`)."""
    op, inputs, outputs = writer
    if op in ("ScatterElements", "ScatterND"):
        return inputs[0] == source
    if op == "GroupQueryAttention":  # present_key (output 1) over past_key (input 3), value: 2 over 4
        index = outputs.index(target)
        return index in (1, 2) and len(inputs) > index + 2 and inputs[index + 2] == source
    return False


class _BoundOutputs:
    """A binding's outputs after a run, by name (`positions`: each name's place in the binding's
    outputs), each fetched when asked for: an ONNX Runtime value with `numpy()` and `data_ptr()`.

    # NOTE: why not `IOBinding.get_outputs()`: it wraps every output in a Python `OrtValue`, the
    # 16 cache buffers a step does not read among them (16 us a step on the random Llama, more
    # than the rest of the step's binding work; iterating the C vector, 55 us). Indexing the C
    # binding's vector (`IOBinding._iobinding`, read from onnxruntime 1.32.0's
    # `onnxruntime_inference_collection.py`) gives one value in 0.5 us; without it, the public call.
    """

    def __init__(self, binding: Any, positions: dict[str, int]):
        inner = getattr(binding, "_iobinding", None)
        self._values = inner.get_outputs() if inner is not None else binding.get_outputs()
        self._index = positions

    def __getitem__(self, name: str) -> Any:
        return self._values[self._index[name]]
