"""Step-by-step progress on stderr, so stdout keeps only the report."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator


class Progress:
    def __init__(self, total: int, *, enabled: bool = True):
        self.total = total
        self.index = 0
        self.enabled = enabled

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[None]:
        self.index += 1
        start = time.perf_counter()
        self._say(f"[{self.index}/{self.total}] {label} ...")
        try:
            yield
        except BaseException:
            self._say(f"[{self.index}/{self.total}] {label}: failed after {time.perf_counter() - start:.1f}s")
            raise
        self._say(f"[{self.index}/{self.total}] {label}: done in {time.perf_counter() - start:.1f}s")

    def _say(self, text: str) -> None:
        if self.enabled:
            print(text, file=sys.stderr, flush=True)
