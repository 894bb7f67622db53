"""`Runner`: runs an exported artifact in its own runtime, for validation and the CLI.

Each backend has a `runner.py` with a `Runner` subclass registered next to its exporter.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.utils._pytree as pytree

from .capture.record import ExportRecord
from .extensions import FORMATS

__all__ = ["Runner", "CacheSession", "runner_for", "to_numpy", "json_object_from_env"]


def to_numpy(tensor: torch.Tensor):
    """A C-contiguous numpy view of `tensor`, 0-d kept 0-d (`np.ascontiguousarray` makes it 1-d)."""
    return tensor.detach().cpu().contiguous().numpy()


class Runner:
    """Run one artifact on forward kwargs; return its outputs flattened in `record.output_names` order."""

    runtime: ClassVar[str] = ""

    def __init__(self, artifact: Any, record: ExportRecord):
        self.artifact = artifact
        self.record = record

    @property
    def precision(self) -> str:
        """The precision the runtime computes in (`"f32"`, `"bf16"`, ...)."""
        return "as exported"

    @property
    def mapped_files(self) -> tuple[str, ...]:
        """The files whose mapped pages hold this runner's weights (`resident.drop_clean_pages`
        takes them out of the resident set between two runs); none where the runtime copies them."""
        return ()

    def run(self, inputs: dict[str, Any]) -> list[torch.Tensor]:
        """Run on forward kwargs (caches as objects); outputs in `record.output_names` order."""
        return self.run_flat([leaf for leaf in pytree.tree_leaves(inputs) if isinstance(leaf, torch.Tensor)])

    def run_flat(self, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run on tensors in `record.input_names` order; outputs in `record.output_names` order."""
        raise NotImplementedError

    def run_named(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run on `{input name: tensor}` (names as in `record.input_names`); outputs by name."""
        missing = [name for name in self.record.input_names if name not in feed]
        if missing:
            raise KeyError(f"{self.record.model_class} ({self.record.format}) needs inputs {missing}")
        outputs = self.run_flat([feed[name] for name in self.record.input_names])
        return dict(zip(self.record.output_names, outputs))

    def bind_named(self, feed: dict[str, torch.Tensor]) -> Callable[[], dict[str, torch.Tensor]] | None:
        """A call that runs the artifact on the tensors of `feed` (by input name) as they hold when
        it is called, so a caller writes each step's values into them in place and builds no feed;
        it returns the outputs by name. None (this runner) where the runtime cannot be called
        again on the same tensors; `run_named` then serves."""
        return None

    def cache_session(self, cache: dict[str, torch.Tensor]) -> CacheSession:
        """A session that keeps the cache leaves `cache` (`{"cache.<layer>.<tensor>": tensor}`)
        between calls. This one feeds them and takes back the updated leaves each call; a backend
        whose runtime can keep the cache where it computes (bound buffers, runtime state) returns
        its own."""
        return CacheSession(self, cache)

    def flat_inputs(self, inputs: dict[str, Any]) -> list[Any]:
        """`inputs` flattened to the artifact's input leaves (caches expanded to their tensors)."""
        return pytree.tree_leaves(inputs)


class CacheSession:
    """The cache between the calls of one component, kept where the runtime computes it.

    `run(feed)` takes the component's other inputs by name and returns its outputs other than the
    cache by name; `cache()` gives the current cache leaves back as tensors (to hand them to
    another component, or to check them). This base class keeps them as tensors on the Python
    side: every call feeds the whole cache and takes the whole updated cache back.
    """

    def __init__(self, runner: Runner, cache: dict[str, torch.Tensor]):
        self.runner = runner
        self._cache = dict(cache)

    def run(self, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run one call on `feed` (no cache leaves) and the kept cache; the outputs other than the cache."""
        outputs = self.runner.run_named({**feed, **self._cache})
        self._cache.update({name: value for name, value in outputs.items() if name.startswith("cache.")})
        return {name: value for name, value in outputs.items() if not name.startswith("cache.")}

    def bind(self, feed: dict[str, torch.Tensor], masks: tuple[str, ...] = (),
             longest: int = 0) -> Callable[[int], dict[str, Any]] | None:
        """A call that runs one decode step on the tensors of `feed` (no cache leaves) as they hold
        when called, the caller writing each step's token and position into them; it takes
        `total`, the tokens the cache holds after the step, and returns the outputs other than the
        cache by name (arrays or tensors, valid until the next call).

        `masks` names the inputs of `feed` that are attention masks over the cached and new tokens:
        they change with `total` each step, and the session fills them itself (up to `longest`
        tokens). None where this session cannot: this one binds only a program that keeps its own
        cache (no leaves to pass in and out, `Runner.bind_named`) and takes no mask; a subclass,
        which keeps the cache its own way, binds only where it says how (its own `bind`)."""
        if type(self) is not CacheSession or self._cache or masks:
            return None
        call = self.runner.bind_named(feed)
        return None if call is None else (lambda total: call())

    def cache(self) -> dict[str, torch.Tensor]:
        """The cache leaves after the last call, as tensors."""
        return dict(self._cache)


def runner_for(artifact: Any, record: ExportRecord) -> Runner:
    """The runner of `record.format` (the format's registered `Runner`), opened on `artifact`."""
    return FORMATS.get(record.format).runner_class()(artifact, record)


def json_object_from_env(variable: str, example: str) -> dict[str, Any] | None:
    """The JSON object in environment variable `variable` (a runtime's settings for the runner),
    None when it is unset or empty; anything but a JSON object is refused, the remedy showing
    `example`.

    Raises:
        RuntimeLoadError: the value is not JSON, or not an object.
    """
    from .errors import RuntimeLoadError

    text = os.environ.get(variable)
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise RuntimeLoadError(f"{variable} is not JSON: {error}",
                               remedy=f"set it to a JSON object, e.g. {example}") from error
    if not isinstance(value, dict):
        raise RuntimeLoadError(f"{variable} is a JSON {type(value).__name__} ({text.strip()!r}), not an object",
                               remedy=f"set it to a JSON object, e.g. {example}")
    return value
