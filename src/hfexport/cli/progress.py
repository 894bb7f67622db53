"""Step-by-step progress on stderr, so stdout keeps only the report.

Piped (or with `heartbeat=False`), each step is two lines: `[i/N] label ...` as it starts and
`[i/N] label: done in Xs` as it ends, and a step that runs long says so every `still_every` seconds
(`[i/N] label: still running (1m00s)`, with what it counted so far), so that a log shows the command
is alive. On a terminal, each step is one line that shows how long the step has been running, redrawn
in place every `interval` seconds, and ends as the same `done` line; what the step has counted so far
(`count`: `shape 3/5`) shows on it too.

`N` is the number of steps, known before the first one starts; a step made of several pieces (one
per component exported) shows each as a `part` under the same number.
"""

# NOTE: why `sys.stderr` is wrapped while a step's line is shown, rather than only drawing it with `\r`.
# Whatever else writes to stderr during a step (hfexport's warnings; a download's progress bar) would
# land after the half-drawn line; the wrapper erases the line first and draws it again below what was
# written. Writes to file descriptor 2 from native code do not go through it: the CLI holds those back
# unless --verbose, and turns the live line off with --verbose. Erasing pads with spaces rather than
# sending `ESC [K`, so that a terminal without ANSI support shows the same.

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

__all__ = ["Progress"]


class Progress:
    """Prints each step as it starts and how long it took when it ends; the job running the
    steps sets `total` before the first one.

    Args:
        total: how many steps there are, when known.
        enabled: print anything at all (`--quiet` turns it off).
        heartbeat: on a terminal, show the running step's elapsed time on its line.
        stream: where to print (default: `sys.stderr` as it is at each step).
        interval: seconds between redraws of the running step's line.
        still_every: piped (or without `heartbeat`), seconds between the lines that say a step is
            still running; 0 for none.
    """

    def __init__(self, total: int | None = None, *, enabled: bool = True, heartbeat: bool = True,
                 stream: TextIO | None = None, interval: float = 1.0, still_every: float = 30.0):
        self.total = total
        self.index = 0
        self.enabled = enabled
        self.heartbeat = heartbeat
        self.stream = stream
        self.interval = interval
        self.still_every = still_every
        self._line: _LiveLine | None = None  # the running step's live line, when it has one
        self._counted = ""  # what the running step counted last, for its still-running lines

    def count(self, done: int, total: int | None, what: str) -> None:
        """Show how far the running step is (`count(3, 5, "shape")`: `shape 3/5`) on its live line,
        or piped on its next still-running line; nothing between steps."""
        self._counted = f"{what} {done}/{total}" if total else f"{what} {done}"
        if self._line is not None:
            self._line.show_count(self._counted)

    def step(self, label: str) -> contextlib.AbstractContextManager[None]:
        """Report the next step, `label`, around the block."""
        self.index += 1
        return self._shown(label)

    def part(self, label: str) -> contextlib.AbstractContextManager[None]:
        """Report `label`, a part of the current step (the second component of an export), around
        the block, under the current step's number (the first step's, before any)."""
        self.index = max(self.index, 1)
        return self._shown(label)

    @contextlib.contextmanager
    def _shown(self, label: str) -> Iterator[None]:
        where = f"[{self.index}/{self.total}]" if self.total else f"[{self.index}]"
        stream = self.stream or sys.stderr
        start = time.perf_counter()
        self._counted = ""
        if not (self.enabled and self.heartbeat and _is_terminal(stream)):
            self._say(stream, f"{where} {label} ...")
            try:
                with self._still_running(stream, f"{where} {label}", start):
                    yield
            except BaseException:
                self._say(stream, f"{where} {label}: failed after {time.perf_counter() - start:.1f}s")
                raise
            self._say(stream, f"{where} {label}: done in {time.perf_counter() - start:.1f}s")
            return
        with _LiveLine(stream, f"{where} {label}", self.interval, wrap_stderr=stream is sys.stderr) as line:
            self._line = line
            try:
                yield
            except BaseException:
                line.finish(f"{where} {label}: failed after {time.perf_counter() - start:.1f}s")
                raise
            finally:
                self._line = None
            line.finish(f"{where} {label}: done in {time.perf_counter() - start:.1f}s")

    @contextlib.contextmanager
    def _still_running(self, stream: TextIO, head: str, start: float) -> Iterator[None]:
        """Around a piped step: a daemon thread that says `head: still running (...)` every `still_every` seconds."""
        if not (self.enabled and self.still_every > 0):
            yield
            return
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(self.still_every):
                counted = f", {self._counted}" if self._counted else ""
                self._say(stream, f"{head}: still running ({_elapsed(time.perf_counter() - start)}{counted})")

        thread = threading.Thread(target=tick, name="hfexport-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _say(self, stream: TextIO, text: str) -> None:
        if self.enabled:
            print(text, file=stream, flush=True)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):  # no isatty, or a closed stream
        return False


def _elapsed(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole}s" if whole < 60 else f"{whole // 60}m{whole % 60:02d}s"


class _LiveLine:
    """The running step's line on a terminal: `head ... 12s`, redrawn by a daemon thread until
    `finish` writes the step's last line in its place. Used as a context manager, which starts the
    thread and (with `wrap_stderr`) points `sys.stderr` at an `_Above` around `stream`."""

    def __init__(self, stream: TextIO, head: str, interval: float, *, wrap_stderr: bool):
        self.stream, self.head, self.interval = stream, head, interval
        self.wrap_stderr = wrap_stderr
        self.lock = threading.RLock()  # every write to the terminal while the line exists holds it
        self.start = time.perf_counter()
        self.shown = 0  # how many characters of the line are on the screen (0: none)
        self.at_line_start = True  # whether the cursor is at the start of a line (ours, or an empty one)
        self.finished = False
        self.counted = ""  # what the step counted last (`shape 3/5`), shown after its head
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="hfexport-progress", daemon=True)
        self._wrapper: _Above | None = None

    def __enter__(self) -> _LiveLine:
        with self.lock:
            self.draw(with_time=False)
        if self.wrap_stderr:
            self._wrapper = _Above(self, sys.stderr)
            sys.stderr = self._wrapper
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.finish(None)

    def finish(self, text: str | None) -> None:
        """Stop the redraws and write `text` (a line) where the step's line was; once."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self.lock:
            if self.finished:
                return
            self.finished = True
            if self._wrapper is not None and sys.stderr is self._wrapper:  # else someone swapped it since
                sys.stderr = self._wrapper.stream
            if text is not None:
                lead = "\r" if self.at_line_start else "\n"
                self.stream.write(f"{lead}{text}{' ' * (self.shown - len(text))}\n")
                self.stream.flush()
                self.shown, self.at_line_start = 0, True

    def show_count(self, counted: str) -> None:
        """Show `counted` on the line from now on, drawn at once (from the thread that counts)."""
        with self.lock:
            self.counted = counted
            self.draw()

    def draw(self, *, with_time: bool = True) -> None:
        """Write the line over itself (the caller holds `lock`); not while another line is half written."""
        if self.finished or not self.at_line_start:
            return
        tail = f" ... {_elapsed(time.perf_counter() - self.start)}" if with_time else " ..."
        tail = f" ({self.counted}){tail}" if self.counted else tail
        room = _width(self.stream) - 3  # the last columns stay free: a full row wraps on some terminals
        text = (self.head[:max(0, room - len(tail))] + tail)[:room]
        self.stream.write(f"\r{text}{' ' * (self.shown - len(text))}")
        self.stream.flush()
        self.shown = len(text)

    def erase(self) -> None:
        """Take the line off the screen (the caller holds `lock`)."""
        if self.shown:
            self.stream.write(f"\r{' ' * self.shown}\r")
            self.shown = 0

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            with self.lock:
                if not self._stop.is_set():
                    self.draw()


def _width(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (AttributeError, OSError, ValueError):  # a stream without a terminal behind its descriptor
        return 80


class _Above:
    """`sys.stderr` while a step's line is shown: each write goes above the line, which is drawn
    again once what was written ends its line."""

    def __init__(self, line: _LiveLine, stream: TextIO):
        self.line, self.stream = line, stream

    def write(self, text: str) -> int:  # noqa: D102 - a text stream's
        with self.line.lock:
            if not text:
                return 0
            self.line.erase()
            written = self.stream.write(text)
            self.line.at_line_start = text.endswith("\n")
            self.line.draw()
            return written

    def flush(self) -> None:  # noqa: D102 - a text stream's
        with self.line.lock:
            self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)
