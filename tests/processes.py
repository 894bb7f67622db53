"""Test helpers for the executors: a local Ray instance, and a watcher that kills one cell's process."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance of 2 CPUs for the module's tests (one already running is reused)."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2)
    yield ray
    if started:
        ray.shutdown()


class KillOnce:
    """Kills with SIGKILL, once, the first process running `-m entry` whose command line or
    environment holds `token`, `after` seconds after it is seen: a worker lost mid-cell."""

    def __init__(self, entry: str, token: str, after: float = 1.0):
        self.entry, self.token, self.after = entry.encode(), token.encode(), after
        self.killed: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> KillOnce:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _matches(self, pid: str) -> bool:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if self.entry not in cmdline.split(b"\0"):
                return False
            return self.token in cmdline or self.token in Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:  # gone, or not ours to read: not the process we wait for
            return False

    def _watch(self) -> None:
        seen: dict[int, float] = {}
        while not self._stop.is_set() and not self.killed:
            for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
                if int(pid) not in seen and self._matches(pid):
                    seen[int(pid)] = time.monotonic()
            for pid, since in list(seen.items()):
                if time.monotonic() - since >= self.after:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:  # it ended first: wait for another
                        del seen[pid]
                        continue
                    self.killed.append(pid)
                    break
            self._stop.wait(0.05)
