"""`OpenVINORunner`: compiles an OpenVINO model for CPU, exactly as a user's `compile_model` does.

The CPU plugin's properties are its defaults (and the precision the export recorded), unless
`$HFEXPORT_OV_COMPILE_CONFIG` holds a JSON object of CPU plugin properties given to every compile
(`{"ENABLE_CPU_PINNING": false, "INFERENCE_NUM_THREADS": 1}`): what `LLMPipeline(folder, "CPU",
**properties)` is given on the vendor's side. They are recorded under `details["ov_compile"]`.

A stateful model (`stateful.py`: the cache as variables) runs through one infer request whose
state holds the cache; `run_flat` still takes and returns the cache leaves (it sets the state
from them and reads it back), so validation compares the same interface as for a stateless model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...errors import ExportError, RuntimeLoadError
from ...runner import CacheSession, Runner, json_object_from_env, to_numpy
from ...generation.arrays import as_array
from .stateful import BEAM_IDX, state_variables

__all__ = ["OpenVINORunner", "StatefulSession", "OpenVINOCacheSession", "COMPILE_CONFIG_ENV", "compile_properties"]

#: an environment variable holding a JSON object of CPU plugin properties for the runner's compiles
COMPILE_CONFIG_ENV = "HFEXPORT_OV_COMPILE_CONFIG"
_EXAMPLE = '{"ENABLE_CPU_PINNING": false, "INFERENCE_NUM_THREADS": 1}'


def compile_properties() -> dict[str, Any]:
    """The CPU plugin properties of `$HFEXPORT_OV_COMPILE_CONFIG` (`{}` when unset): a JSON object
    of property names to strings, numbers or booleans; anything else is refused with what to write."""
    properties = json_object_from_env(COMPILE_CONFIG_ENV, _EXAMPLE) or {}
    wrong = {k: v for k, v in properties.items() if not isinstance(v, (str, int, float, bool))}
    if wrong:
        raise RuntimeLoadError(f"{COMPILE_CONFIG_ENV}: {sorted(wrong)} have values that are no CPU plugin property "
                               f"value ({wrong})", remedy=f"give each a string, number or boolean, e.g. {_EXAMPLE}")
    return properties


class OpenVINORunner(Runner):
    """Compiles an OpenVINO model for the CPU plugin, as a user's `compile_model` does, and runs it."""
    runtime = "OpenVINO CPU plugin"

    def __init__(self, artifact, record):
        super().__init__(artifact, record)
        import openvino as ov

        properties = compile_properties()  # none unless asked: what users get
        try:
            self.compiled = ov.Core().compile_model(artifact, "CPU", properties or None)
        except RuntimeError as error:
            if not properties:
                raise
            raise RuntimeLoadError(f"the CPU plugin refused {COMPILE_CONFIG_ENV}={json.dumps(properties)}: "
                                   f"{(str(error).strip().splitlines() or [type(error).__name__])[-1]}",
                                   remedy="use the CPU plugin's property names and values (openvino.properties), "
                                   f"e.g. {_EXAMPLE}, or unset it") from error
        if properties:
            record.details["ov_compile"] = dict(properties)
        self.variables = state_variables(artifact)
        # by position, not by name: the runtime's port names need not be the record's
        # (`encoder_outputs.last_hidden_state`); a stateful model lost its cache inputs and ends with `beam_idx`
        fed = [name for name in record.input_names if name not in self.variables]
        self.input_ports = dict(zip(fed, self.compiled.inputs))
        self.output_ports = dict(zip([n for n in record.output_names if n not in self.variables], self.compiled.outputs))
        self.input_dtypes = {name: port.get_element_type().to_dtype() for name, port in self.input_ports.items()}

    @property
    def precision(self) -> str:
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT")  # what the compiled model runs in
        return f"{hint.to_string() if hasattr(hint, 'to_string') else hint} (CPU plugin INFERENCE_PRECISION_HINT)"

    @property
    def is_stateful(self) -> bool:
        """Whether the model keeps its cache as state (variables named by the cache leaves)."""
        return bool(self.variables)

    @property
    def starts_empty(self) -> bool:
        """Whether the model's state grows with the tokens from an empty cache (its reset value),
        so a generation starts with no cache given (`genai.py`: one model prefills and decodes)."""
        return (self.record.details.get("state") or {}).get("layout") == "growing"

    def run_flat(self, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.is_stateful:
            values = dict(zip(self.record.input_names, leaves))
            session = StatefulSession(self, {name: values[name] for name in self.variables})
            outputs = session.run({name: value for name, value in values.items() if name not in self.variables})
            outputs.update(session.cache())
            return [outputs[name] for name in self.record.output_names]
        feed = [to_numpy(leaf) for leaf in leaves]
        result = self.compiled(feed)
        return [torch.from_numpy(np.array(result[out])) for out in self.compiled.outputs]

    def cache_session(self, cache: dict[str, torch.Tensor]) -> CacheSession:
        """A stateful model: one infer request whose state holds `cache`; a stateless one: the
        cache kept as OpenVINO tensors, each call's outputs bound as the next call's inputs."""
        if self.is_stateful:
            return StatefulSession(self, cache)
        return OpenVINOCacheSession(self, cache)


class StatefulSession(CacheSession):
    """The cache in the state of one infer request: set once from `cache`, then each call feeds
    only the other inputs (and `beam_idx = 0..batch-1`); `cache()` reads the state back."""

    def __init__(self, runner: OpenVINORunner, cache: dict[str, torch.Tensor]):
        import openvino as ov

        missing = [name for name in runner.variables if name not in cache and not runner.starts_empty]
        if missing:
            from ...errors import RuntimeLoadError

            raise RuntimeLoadError(f"the stateful OpenVINO model needs initial values for its state {missing}",
                                   remedy="pass every cache leaf the manifest lists (zeros for an empty static cache)")
        self.runner = runner
        self.request = runner.compiled.create_infer_request()
        self.request.reset_state()
        for state in self.request.query_state():
            if state.name not in cache:
                continue  # a growing state starts as its reset value, the empty cache
            # a variable's type may be narrower than the leaf's (`stateful.py`: int64 kept as int32)
            value = to_numpy(cache[state.name]).astype(state.state.data.dtype, copy=False)
            state.state = ov.Tensor(value)
        self._beam_port = runner.compiled.input(BEAM_IDX)
        self._batch: dict[int, np.ndarray] = {}
        self._beam_set: np.ndarray | None = None  # the `beam_idx` the request holds

    def _beam_idx(self, feed: dict[str, torch.Tensor]) -> np.ndarray:
        batch = int(next(iter(feed.values())).shape[0]) if feed else 1
        if batch not in self._batch:
            self._batch[batch] = np.arange(batch, dtype=np.int32)
        return self._batch[batch]

    def run(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One call on `feed` (no cache leaves); the state advances in place; the outputs by name."""
        import openvino as ov

        request = self.request
        beam_idx = self._beam_idx(feed)
        if beam_idx is not self._beam_set:  # set once per batch size: the request keeps it
            request.set_tensor(self._beam_port, ov.Tensor(beam_idx, shared_memory=True))
            self._beam_set = beam_idx
        _infer(request, self.runner, feed)
        return {name: torch.from_numpy(np.array(request.get_tensor(port).data))
                for name, port in self.runner.output_ports.items()}

    def bind(self, feed: dict[str, torch.Tensor], masks: tuple[str, ...] = (),
             longest: int = 0) -> Callable[[int], dict[str, np.ndarray]] | None:
        """`CacheSession.bind`: each input of `feed` set once on the request (its array shared),
        and each step only the mask set: the first `total` entries of one row of ones (the 2-D
        mask over the cached and new tokens the stateful model takes); the logits are the
        request's output tensor, read in place. None where an input's array is not of its port's
        element type (OpenVINO would convert a copy, which the caller's writes would not reach),
        or a mask is not 2-D."""
        import openvino as ov

        ports, dtypes = self.runner.input_ports, self.runner.input_dtypes
        arrays = {name: as_array(value) for name, value in feed.items()}
        if any(name not in ports or not arrays[name].ndim or arrays[name].dtype != dtypes[name] for name in arrays):
            return None
        if any(arrays[name].ndim != 2 or arrays[name].shape[0] != 1 for name in masks):
            return None
        request = self.request
        beam_idx = self._beam_idx(feed)
        if beam_idx is not self._beam_set:
            request.set_tensor(self._beam_port, ov.Tensor(beam_idx, shared_memory=True))
            self._beam_set = beam_idx
        for name, array in arrays.items():
            if name not in masks:
                request.set_tensor(ports[name], ov.Tensor(array, shared_memory=True))
        masked = [(ports[name], np.ones((1, max(longest, 1)), dtype=dtypes[name])) for name in masks]
        outputs = self.runner.output_ports
        set_tensor, start, wait, get_tensor = request.set_tensor, request.start_async, request.wait, request.get_tensor

        def call(total: int) -> dict[str, np.ndarray]:
            for port, ones in masked:
                if total > ones.shape[1]:
                    raise ExportError(f"the bound greedy steps were set up for {ones.shape[1]} tokens, not {total}",
                                      remedy="bind again for the longer generation")
                set_tensor(port, ov.Tensor(ones[:, :total], shared_memory=True))
            start()  # `start_async` + `wait`, as `_infer` runs a request (why there)
            wait()
            return {name: get_tensor(port).data for name, port in outputs.items()}

        return call

    def cache(self) -> dict[str, torch.Tensor]:
        """The state now, as tensors (copies), by cache leaf name."""
        states = {state.name: state.state for state in self.request.query_state()}
        record = self.runner.record
        dtypes = dict(zip(record.input_names, record.input_dtypes))
        ranks = {name: len(shape) for name, shape in zip(record.input_names, record.input_shapes)}
        out = {}
        for name in self.runner.variables:
            value = torch.from_numpy(np.array(states[name].data))
            if ranks.get(name) == 0:  # NOTE: the CPU plugin (2026.4.1) hands a 0-d state back as [1]
                value = value.reshape(())
            out[name] = value.to(getattr(torch, dtypes[name])) if dtypes.get(name) else value
        return out


class OpenVINOCacheSession(CacheSession):
    """A stateless model's cache kept as OpenVINO tensors: two infer requests take turns, the
    cache outputs of one bound as the cache inputs of the other, so no step copies the cache
    through numpy."""

    def __init__(self, runner: OpenVINORunner, cache: dict[str, torch.Tensor]):
        import openvino as ov

        self.runner = runner
        self.requests = [runner.compiled.create_infer_request() for _ in range(2)]
        self.turn = 0
        self._cache = {name: ov.Tensor(to_numpy(value)) for name, value in cache.items() if name in runner.input_ports}

    def run(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One call on `feed` and the kept cache tensors; the outputs other than the cache."""
        request = self.requests[self.turn]
        self.turn = 1 - self.turn
        ports = self.runner.input_ports
        for name, tensor in self._cache.items():
            if name in ports:  # a prefill returns a cache it does not take
                request.set_tensor(ports[name], tensor)
        _infer(request, self.runner, feed)
        out = {}
        for name, port in self.runner.output_ports.items():
            if name.startswith("cache."):
                self._cache[name] = request.get_tensor(port)
            else:
                out[name] = torch.from_numpy(np.array(request.get_tensor(port).data))
        return out

    def cache(self) -> dict[str, torch.Tensor]:
        """The cache after the last call, as tensors (copies)."""
        return {name: torch.from_numpy(np.array(t.data)) for name, t in self._cache.items()}


def _infer(request, runner: OpenVINORunner, feed: dict[str, Any]) -> None:
    """Run `request` on `feed` (by record input name) and the tensors it holds: `start_async` then
    `wait`, as OpenVINO GenAI's `LLMPipeline` drives its request, not the synchronous `infer`.

    Each input whose array already has its port's element type is set as it is (shared, no
    copy: the request is waited for); where one does not (a bool mask's, a scalar), OpenVINO's own
    conversion takes the whole feed (`start_async(inputs, share_inputs=True)`), as before.

    # NOTE: why not `infer`: the CPU plugin (2026.4.1) runs a synchronous `infer` on the calling
    # (Python) thread, an asynchronous one on its own stream thread, the one its compile-time
    # threading (`INFERENCE_NUM_THREADS`, pinning) was set up for. Measured on the 2-layer test
    # Llama's `openvino_model.xml` (`tests/backends/openvino/test_genai.py`), 64 decode steps, one
    # process, 2 CPUs with other work on them: `infer` 0.68 ms a step at best (1.5 median),
    # `start_async` + `wait` 0.32 (0.48), `LLMPipeline` on the same file 0.33 (0.40). Same
    # compiled model, same inputs, same outputs: only the thread that runs the graph differs.
    """
    import openvino as ov

    ports, dtypes = runner.input_ports, runner.input_dtypes
    arrays = {name: as_array(value) for name, value in feed.items()}
    if all(array.ndim and array.dtype == dtypes[name] for name, array in arrays.items()):
        for name, array in arrays.items():
            request.set_tensor(ports[name], ov.Tensor(array, shared_memory=True))
        request.start_async()
    else:
        request.start_async({ports[name]: array for name, array in arrays.items()}, share_inputs=True)
    request.wait()
