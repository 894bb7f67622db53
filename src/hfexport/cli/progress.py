"""Step-by-step progress on stderr, so stdout keeps only the report."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator


class Progress:
    """Prints `[i/total] label ...` as each step starts and how long it took when it ends; the
    job running the steps sets `total` once it knows how many there are."""

    def __init__(self, total: int | None = None, *, enabled: bool = True):
        self.total = total
        self.index = 0
        self.enabled = enabled

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[None]:
        """Report the step `label` around the block."""
        self.index += 1
        where = f"[{self.index}/{self.total}]" if self.total else f"[{self.index}]"
        start = time.perf_counter()
        self._say(f"{where} {label} ...")
        try:
            yield
        except BaseException:
            self._say(f"{where} {label}: failed after {time.perf_counter() - start:.1f}s")
            raise
        self._say(f"{where} {label}: done in {time.perf_counter() - start:.1f}s")

    def _say(self, text: str) -> None:
        if self.enabled:
            print(text, file=sys.stderr, flush=True)
