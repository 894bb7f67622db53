"""Where an export's time goes: seconds per component and phase (the report's `timing`).

```python
phases = Phases()
with recording(phases, component="decode"):
    with phase("trace"):          # anywhere below: the exporter, a backend, validation
        ...
        with phase("optimise"):   # nested: the outer phase pauses while it runs
            ...
phases.to_dict()                  # {"decode": {"trace": 1.2, "optimise": 0.3}}
```
The phases an export reports (`PHASES`): `trace` (torch.export), `convert` (to ONNX, OpenVINO, or
edge + lowering for ExecuTorch), `optimise` (rewrites of the converted model: ONNX Runtime fusions,
OpenVINO's cache as state), `quantize`, `serialise` (files written), `validate` (each artifact
run against eager) and `gate` (the quantized export's greedy tokens against eager).

An export also runs inside `fewer_collections()`: Python's cyclic garbage collector, walking a heap
of imported modules again and again, took a tenth of an export's time.

# NOTE: why a context variable rather than a `phases` argument: the steps worth timing sit deep
# in backends and validation, several calls below the job that owns the accumulator; a context
# variable reaches them without threading an argument through every signature, and it is set
# only inside `recording` (reset on exit), so nothing leaks from one export into the next. A
# nested phase pauses the outer one, so the phases of one component never count a second twice
# and their sum stays within the wall time.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import threading
import time
from collections.abc import Iterator

__all__ = ["PHASES", "Phases", "recording", "phase", "summary_line", "fewer_collections", "EXPORT_GC_YOUNG"]

#: the phases in the order an export runs them (and `summary_line` prints them)
PHASES = ("trace", "convert", "optimise", "quantize", "serialise", "validate", "gate")


class Phases:
    """Seconds summed per `(component, phase)`; safe to fill from several threads at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[str, dict[str, float]] = {}
        self._open: dict[int, list[list]] = {}  # per thread: [component, phase, started] stack

    @contextlib.contextmanager
    def measure(self, component: str, name: str) -> Iterator[None]:
        """Count the time inside the block to `component`'s phase `name`, pausing the phase
        this thread has open (its time resumes when the block ends)."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; one of {', '.join(PHASES)}")
        stack = self._stack()
        now = time.perf_counter()
        if stack:
            self._close(stack[-1], now)
        stack.append([component, name, now])
        try:
            yield
        finally:
            now = time.perf_counter()
            self._close(stack.pop(), now)
            if stack:
                stack[-1][2] = now

    def add(self, component: str, seconds: dict[str, float]) -> None:
        """Add `{phase: seconds}` (an exporter's own, `record.details["stage_seconds"]`) to `component`."""
        with self._lock:
            own = self._seconds.setdefault(component, {})
            for name, value in seconds.items():
                own[name] = own.get(name, 0.0) + value

    def to_dict(self) -> dict[str, dict[str, float]]:
        """`{component: {phase: seconds}}`, phases in `PHASES` order, seconds rounded to ms."""
        with self._lock:
            return {component: {name: round(own[name], 3) for name in PHASES if name in own}
                    for component, own in self._seconds.items()}

    def _stack(self) -> list[list]:
        with self._lock:
            return self._open.setdefault(threading.get_ident(), [])

    def _close(self, entry: list, now: float) -> None:
        component, name, started = entry
        self.add(component, {name: now - started})


#: the accumulator and component of the current export (set only inside `recording`)
_CURRENT: contextvars.ContextVar[tuple[Phases, str] | None] = contextvars.ContextVar("hfexport_phases", default=None)


@contextlib.contextmanager
def recording(phases: Phases, component: str) -> Iterator[Phases]:
    """Within the block, `phase(...)` counts into `phases` under `component`."""
    token = _CURRENT.set((phases, component))
    try:
        yield phases
    finally:
        _CURRENT.reset(token)


def phase(name: str, component: str | None = None) -> contextlib.AbstractContextManager:
    """Time the block as phase `name` of the current recording's component (or `component`);
    nothing is timed outside `recording`."""
    current = _CURRENT.get()
    if current is None:
        return contextlib.nullcontext()
    phases, own = current
    return phases.measure(component or own, name)


def summary_line(timing: dict[str, dict[str, float]]) -> str:
    """`"time: trace 2.1s, convert 5.3s, validate 1.2s"`: each phase summed over the components."""
    totals = {name: sum(own.get(name, 0.0) for own in timing.values()) for name in PHASES}
    return "time: " + ", ".join(f"{name} {seconds:.1f}s" for name, seconds in totals.items() if seconds > 0)


#: the cyclic collector's youngest-generation threshold while an export runs (`fewer_collections`;
#: Python's default is 700)
EXPORT_GC_YOUNG = 50_000

_gc_lock = threading.Lock()
_gc_holders = 0
_gc_restore: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # (the thresholds before, those set)


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Within the block, the cyclic garbage collector runs less often: its youngest generation's
    threshold is raised to `EXPORT_GC_YOUNG` (never lowered), and restored when the last block
    open in the process ends (nested and concurrent exports share one raise).

    # NOTE: why. An export allocates millions of short-lived Python objects (torch.export's FX
    # nodes and fake tensors, sympy expressions, ONNX IR nodes) on a heap that imports have filled
    # with 0.2-0.6M objects that are never garbage (torch's op tables, transformers', onnxscript's
    # torchlib). At Python's thresholds (700, 10, 10) the oldest generation, that whole heap, was
    # walked 9 times an export, 0.1-0.34 s a walk: the collector took 1.5-1.7 s of a 12 s ONNX
    # export of a 134 MB Llama and of an 18 s one of a 1.25 GB Llama (`bench/gc_share.py`,
    # bench/RESULTS.md). With the youngest generation collected every 50,000 net allocations
    # (10,000 left one full walk), it takes 0.4-0.5 s with no full walk. Young cycles are still
    # collected young; one that reaches the oldest generation waits for its next walk (reference
    # counting frees the tensors either way), and the peak RSS measured the same (1902-1903 MB
    # against 1895-1915 on the 1.25 GB model). A threshold of 0 (the collector switched off by its
    # thresholds) is left as it is.
    """
    global _gc_holders, _gc_restore
    with _gc_lock:
        if _gc_holders == 0:
            before = gc.get_threshold()
            young, *older = before
            if young and young < EXPORT_GC_YOUNG:
                gc.set_threshold(EXPORT_GC_YOUNG, *older)
                _gc_restore = before, gc.get_threshold()
        _gc_holders += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_holders -= 1
            if _gc_holders == 0 and _gc_restore is not None:
                before, raised = _gc_restore
                if gc.get_threshold() == raised:  # else changed meanwhile by its owner: theirs stays
                    gc.set_threshold(*before)
                _gc_restore = None
