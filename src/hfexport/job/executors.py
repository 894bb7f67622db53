"""Executors: run cells (a coverage case, a batch export) each in its own subprocess, here or on Ray.

```
executor.run(cells, on_result)     on_result(cell, result) as each cell finishes, in this thread
  LocalExecutor(jobs)              a pool of `jobs` threads, each waiting on one subprocess
  RayExecutor(address, num_cpus)   each cell a Ray task that runs the same subprocess
```
A cell is `function(*args)`, a module-level function that runs one subprocess (`run_subprocess`)
with a timeout and returns a result dict (`status`, `detail`, ...); both executors return those
dicts as they are, so the statuses and the saved JSON are the same whichever ran them.

# NOTE: a cell whose worker died (its subprocess killed by a signal, not by the timeout; on Ray a
# worker or node lost) runs once more, and only a second loss is reported, as `crash`. A signal
# is retried whatever it is, since a deterministic native crash costs one more run but an out-of-
# memory kill or a preempted node is usually gone the second time. A cell that ran to an answer
# (an export error, a mismatch) is not retried: running it again gives the same answer; nor is a
# timeout, which would cost the whole timeout again (`--resume` runs crashes and timeouts later).
# Ray's own task retries are off (`max_retries=0`) so that both executors retry the same way.
"""

from __future__ import annotations

import abc
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import first_line

__all__ = ["LOST", "Cell", "Executor", "LocalExecutor", "Outcome", "RayExecutor", "StageLines", "choose_executor",
           "run_subprocess"]

#: Key of a result dict saying that its attempt was lost (popped by the executor, never saved).
LOST = "lost"
#: Attempts a cell gets when its worker dies.
ATTEMPTS = 2


@dataclasses.dataclass(frozen=True)
class Cell:
    """One unit of work: `function(*args)` in a worker, returning a result dict.

    `function` is a module-level function (Ray sends it to its workers by name); `base` holds the
    fields that name the cell, from which an executor writes the result of a cell whose worker it lost.
    """

    key: tuple[str, ...]
    function: Callable[..., dict[str, Any]]
    args: tuple[Any, ...]
    base: dict[str, Any]


@dataclasses.dataclass
class Outcome:
    """How one cell's subprocess ended: its `RESULT` line, or why there is none."""

    result: dict[str, Any] | None
    timed_out: bool
    returncode: int | None
    stage: str
    stderr: str

    @property
    def is_lost(self) -> bool:
        """Whether the process was killed by a signal (not by the timeout, nor Ctrl-C) before its result."""
        return (self.result is None and not self.timed_out and self.returncode is not None
                and self.returncode < 0 and -self.returncode != signal.SIGINT)

    def how(self) -> str:
        """Why there is no result: `signal 9 in <stage>: <last stderr line>`."""
        code = self.returncode or 0
        cause = f"signal {-code}" if code < 0 else f"exit code {code}"
        tail = next((line for line in reversed(self.stderr.splitlines()) if line.strip()), "")[:300]
        return f"{cause} in {self.stage}: {tail}"


def run_subprocess(command: list[str], *, timeout: float, threads: int,
                   env: dict[str, str] | None = None) -> Outcome:
    """Run one cell's `command` with `timeout` seconds and `threads` threads; read its `STAGE` and `RESULT` lines.

    Args:
        command: the entry to run (`python -m hfexport.coverage.case ARCH BACKEND MODE`).
        timeout: seconds before the process is killed and the cell counts as timed out.
        threads: `OMP_NUM_THREADS` of the process.
        env: variables set on top of this process's environment.

    Returns:
        An `Outcome`; never raises for what the process did.
    """
    variables = dict(os.environ, **(env or {}), OMP_NUM_THREADS=str(threads))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=variables)
    except subprocess.TimeoutExpired as expired:
        return Outcome(None, True, None, _last_stage(expired.stdout), _text(expired.stderr))
    result = None
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            break
    return Outcome(result, False, done.returncode, _last_stage(done.stdout), done.stderr)


class StageLines:
    """A job's progress as `STAGE <label>` lines on stdout, the subprocess side of `run_subprocess`
    (which names the last stage of a cell that crashed or timed out)."""

    total: int | None = None

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[None]:
        """Print `STAGE label` as the step starts."""
        print(f"STAGE {label}", flush=True)
        yield


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def _last_stage(stdout: str | bytes | None) -> str:
    stages = [line.split(" ", 1)[1] for line in _text(stdout).splitlines() if line.startswith("STAGE ")]
    return stages[-1] if stages else "startup"


def _call(function: Callable[..., dict[str, Any]], args: tuple[Any, ...]) -> dict[str, Any]:
    """A cell in a worker (the body of the Ray task)."""
    return function(*args)


class Executor(abc.ABC):
    """Runs cells and reports each result as it comes; subclasses say where the cells run."""

    #: Threads each cell's subprocess gets (`OMP_NUM_THREADS`).
    threads: int = 1

    @abc.abstractmethod
    def run(self, cells: Iterable[Cell], on_result: Callable[[Cell, dict[str, Any]], None]) -> None:
        """Run every cell; call `on_result(cell, result)` in this thread as each finishes.

        Args:
            cells: the cells, started in this order.
            on_result: told each final result (a lost attempt that is retried is not reported).
        """

    @staticmethod
    def settle(cell: Cell, result: dict[str, Any], attempt: int) -> dict[str, Any] | None:
        """The result to report for attempt `attempt` (0-based) of `cell`, or `None` when that attempt
        was lost and the cell runs again."""
        if not result.pop(LOST, False):
            return result
        if attempt + 1 < ATTEMPTS:
            return None
        return {**result, "detail": f"{result.get('detail') or 'lost'} (retried once: the first attempt was lost too)"}

    @staticmethod
    def failed(cell: Cell, error: BaseException, *, lost: bool) -> dict[str, Any]:
        """The result of a cell that returned nothing: its worker was lost, or its function raised."""
        what = "worker lost" if lost else "the cell's function raised"
        return {**cell.base, "status": "crash", "detail": f"{what}: {first_line(error)}", LOST: lost}


class LocalExecutor(Executor):
    """Runs `jobs` cells at once on this machine, each subprocess with `cpu_count // jobs` threads."""

    def __init__(self, jobs: int = 1):
        self.jobs = max(1, jobs)
        self.threads = max(1, (os.cpu_count() or 1) // self.jobs)

    def run(self, cells: Iterable[Cell], on_result: Callable[[Cell, dict[str, Any]], None]) -> None:
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.jobs)
        pending = {pool.submit(_call, cell.function, cell.args): (cell, 0) for cell in cells}
        try:
            while pending:
                finished, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in finished:
                    cell, attempt = pending.pop(future)
                    try:
                        raw = future.result()
                    except Exception as error:  # noqa: BLE001 - one cell's bug is that cell's result
                        raw = self.failed(cell, error, lost=False)
                    result = self.settle(cell, raw, attempt)
                    if result is None:
                        pending[pool.submit(_call, cell.function, cell.args)] = (cell, attempt + 1)
                    else:
                        on_result(cell, result)
        finally:
            # on an interrupt, cells not started are dropped; those running end with their subprocess
            pool.shutdown(wait=not pending, cancel_futures=True)


class RayExecutor(Executor):
    """Runs each cell as a Ray task (`cpus_per_cell` CPUs, as many threads), on a cluster or a local instance.

    Args:
        address: the cluster to join (`auto`, `HOST:6379`); `None` joins `RAY_ADDRESS` if set, else
            starts a local instance for the run.
        num_cpus: CPUs of a local instance (default: all of this machine).
        cpus_per_cell: CPUs Ray reserves for each cell; its subprocess gets as many threads.
    """

    def __init__(self, address: str | None = None, num_cpus: int | None = None, cpus_per_cell: int = 1):
        from .._versions import require_extra

        require_extra("ray", purpose="running cells on Ray (--ray)")
        self.address = address
        self.num_cpus = num_cpus
        self.threads = max(1, cpus_per_cell)

    def run(self, cells: Iterable[Cell], on_result: Callable[[Cell, dict[str, Any]], None]) -> None:
        import ray

        started = not ray.is_initialized()
        if started:
            self._init(ray)
        try:
            task = ray.remote(num_cpus=self.threads, max_retries=0)(_call)
            pending = {task.remote(cell.function, cell.args): (cell, 0) for cell in cells}
            try:
                while pending:
                    ready, _ = ray.wait(list(pending), num_returns=1)
                    cell, attempt = pending.pop(ready[0])
                    result = self.settle(cell, self._get(ray, cell, ready[0]), attempt)
                    if result is None:
                        pending[task.remote(cell.function, cell.args)] = (cell, attempt + 1)
                    else:
                        on_result(cell, result)
            finally:
                for ref in pending:  # interrupted: the cells still running are stopped
                    ray.cancel(ref, force=True)
        finally:
            if started:
                ray.shutdown()

    def _init(self, ray: Any) -> None:
        if self.address:
            _check_reachable(self.address)
        try:
            ray.init(address=self.address, num_cpus=None if self.address else self.num_cpus)
        except Exception as error:
            where = f"the cluster at {self.address}" if self.address else "Ray (RAY_ADDRESS, or a local instance)"
            # a ValueError: the CLI reports it as a bad argument, in one line
            raise ValueError(f"running cells on Ray: could not start or join {where}: {first_line(error)}; check "
                             "that `ray status` on the head node answers, and the --ray-address") from error

    def _get(self, ray: Any, cell: Cell, ref: Any) -> dict[str, Any]:
        """The result of a finished task, or the result saying how its worker was lost."""
        lost_kinds = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                      ray.exceptions.LocalRayletDiedError, ray.exceptions.ObjectLostError,
                      ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError)
        try:
            return ray.get(ref)
        except lost_kinds as error:
            return self.failed(cell, error, lost=True)
        except ray.exceptions.RayTaskError as error:
            # a task that failed because something under it was lost, not because of its own code
            return self.failed(cell, error, lost=isinstance(error.cause, lost_kinds))


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Refuse a cluster address nothing answers at, within `timeout` seconds: `ray.init` itself
    retries an unreachable address for minutes before it fails."""
    import socket

    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # a form ray.init reads another way; let it say what it thinks
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as error:
        raise ValueError(f"running cells on Ray: nothing answers at {address} ({error}); start the head node with "
                         "`ray start --head --port=6379` and pass its HOST:6379 as --ray-address") from None


def choose_executor(jobs: int = 1, ray: bool = False, address: str | None = None) -> Executor:
    """The executor the CLI's flags ask for: `RayExecutor(address)` with `--ray` or `--ray-address`,
    else `LocalExecutor(jobs)`."""
    if ray or address:
        return RayExecutor(address=address)
    return LocalExecutor(jobs)
