"""What the CLI writes on stderr besides its progress: hfexport's own log lines, and what other packages
say during a command (log records, Python warnings, native writes), held back unless `--verbose`."""

# NOTE: why hook `logging.Logger.callHandlers` rather than install a handler or a filter. torch gives
# each of its loggers a handler of its own and turns propagation off when it is imported; no handler on
# the root logger sees those records, and a filter would have to be added to handlers that a lazily
# imported package has not created yet. Every record that passes its logger's level and filters goes
# through `Logger.callHandlers`, whoever configured what.
#
# Native code reaches the console two ways: writes to file descriptor 2 (onnxruntime's log, C++
# loggers generally), held by pointing fd 2 at a temporary file; and writes through Python's
# `sys.stderr` (ExecuTorch's Python bindings write its runtime log there), held by their
# `[file.cpp:N] ...` form, the only thing that tells them from hfexport's own progress lines.

from __future__ import annotations

import contextlib
import faulthandler
import io
import logging
import os
import re
import sys
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

__all__ = ["Hidden", "command_output"]

LOGGER = "hfexport"
NATIVE = "native code"
# ExecuTorch's runtime log (`[method.cpp:123] ...`), the form hfexport.coverage reads its failures from
_NATIVE_LINE = re.compile(r"\[[\w.]+:\d+\] ")
_NATIVE_START = re.compile(r"\[(?:[\w.]+(?::(?:\d+\]?)?)?)?")  # what may still become one
_PIECES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")  # lines, each with its end
_HFEXPORT_DIR = Path(__file__).resolve().parents[1]


class Hidden:
    """What other packages said during a command that the CLI did not show, counted per package."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def summary(self) -> str | None:
        """The one stderr line that says what was hidden, or `None` when nothing was."""
        total = sum(self.counts.values())
        if not total:
            return None
        packages = ", ".join(name for name, _ in self.counts.most_common())
        return (f"hfexport: {total} message{'s' if total != 1 else ''} from other packages hidden ({packages}); "
                "--verbose shows them")


@contextlib.contextmanager
def command_output(*, verbose: bool = False, debug: bool = False) -> Iterator[Hidden]:
    """Give hfexport's logger its stderr handler and hold back other packages' output around a command.

    Args:
        verbose: let other packages' log records, warnings and native output through as they come.
        debug: hfexport's debug records too; implies `verbose`.

    Returns:
        A context manager yielding the `Hidden` tally; on exit it prints the tally's summary line. Native
        output held back is written out when the command raises, since it may say why.
    """
    hidden = Hidden()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_hfexport_handler(logging.DEBUG if debug else logging.WARNING))
        if not (verbose or debug):
            stack.callback(_print_summary, hidden)
            stack.enter_context(_records_held(hidden))
            stack.enter_context(_warnings_held(hidden))
            stack.enter_context(_native_held(hidden))
        yield hidden


def _print_summary(hidden: Hidden) -> None:
    if line := hidden.summary():
        print(line, file=sys.stderr, flush=True)


class _StderrHandler(logging.StreamHandler):
    """A `StreamHandler` on `sys.stderr` as it is at each record (pytest swaps it between tests)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)
        self.setFormatter(logging.Formatter(f"{LOGGER}: %(levelname)s: %(message)s"))

    @property
    def stream(self):  # noqa: D102 - the attribute StreamHandler.emit writes to
        return sys.stderr


@contextlib.contextmanager
def _hfexport_handler(level: int) -> Iterator[None]:
    logger = logging.getLogger(LOGGER)
    handler = _StderrHandler()
    before = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False  # printed once, here, even where a package configured the root logger
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before[0])
        logger.propagate = before[1]


def _is_ours(name: str) -> bool:
    return name == LOGGER or name.startswith(LOGGER + ".")


def _prints(handler: logging.Handler, consoles: tuple) -> bool:
    """Whether `handler` writes to the console (one of `consoles`, or fd 1 or 2) rather than to a file or nowhere."""
    if not isinstance(handler, logging.StreamHandler) or isinstance(handler, logging.FileHandler):
        return False
    stream = getattr(handler, "stream", None)
    if stream is None:  # torch's trace handler until TORCH_TRACE gives it a file
        return False
    if any(stream is console for console in consoles) or isinstance(stream, _Console):
        return True
    try:
        return stream.fileno() in (1, 2)
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
        return False


def _handlers(logger: logging.Logger) -> Iterator[logging.Handler]:
    """The handlers `Logger.callHandlers` offers a record of `logger`, in its order."""
    current: logging.Logger | None = logger
    while current is not None:
        yield from current.handlers
        current = current.parent if current.propagate else None


@contextlib.contextmanager
def _records_held(hidden: Hidden) -> Iterator[None]:
    call_handlers = logging.Logger.callHandlers
    consoles = (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)  # before `_native_held` swaps stderr

    def held(logger: logging.Logger, record: logging.LogRecord) -> None:
        """`Logger.callHandlers`, except that another package's record is counted where it would print;
        its other handlers (files, torch's `TORCH_TRACE` log) still get it."""
        if _is_ours(record.name):
            return call_handlers(logger, record)
        found = printed = False
        for handler in _handlers(logger):
            found = True
            if record.levelno < handler.level:
                continue
            if not _prints(handler, consoles):
                handler.handle(record)
            elif handler.filter(record):
                printed = True
        last_resort = logging.lastResort
        if printed or (not found and last_resort is not None and record.levelno >= last_resort.level):
            hidden.counts[record.name.partition(".")[0]] += 1

    logging.Logger.callHandlers = held
    try:
        yield
    finally:
        logging.Logger.callHandlers = call_handlers


def _package_of(filename: str) -> str:
    """The package of the file a warning names: `torch` for `.../site-packages/torch/...`, a module outside
    any package by its name (`copyreg`, where a `stacklevel` pointed)."""
    path = Path(filename)
    if path.resolve().is_relative_to(_HFEXPORT_DIR):
        return LOGGER
    for index, part in enumerate(path.parts[:-1]):
        if part in ("site-packages", "dist-packages"):
            return path.parts[index + 1].removesuffix(".py")
    return path.name.removesuffix(".py")


@contextlib.contextmanager
def _warnings_held(hidden: Hidden) -> Iterator[None]:
    showwarning = warnings.showwarning

    def held(message, category, filename, lineno, file=None, line=None) -> None:
        if (package := _package_of(filename)) == LOGGER:
            return showwarning(message, category, filename, lineno, file, line)
        hidden.counts[package] += 1

    warnings.showwarning = held
    try:
        yield
    finally:
        warnings.showwarning = showwarning


class _Console:
    """`sys.stderr` while native output is held: text reaches `console`, except lines in a native runtime's log
    form, which go to `sink_fd`; after `release`, writes go to `before`, for whoever kept a reference.

    ExecuTorch writes such a line in pieces (`[`, `method.cpp`, `:`, `123`, `] `, ...), each flushed, so a
    line is routed once its start decides, and a start that may still become `[file.cpp:N] ` waits.
    """

    def __init__(self, console, sink_fd: int, before) -> None:
        self._console, self._sink_fd, self._before = console, sink_fd, before
        self._start = ""  # the undecided start of the current line
        self._line_to: str | None = None  # where the rest of the current line goes: "console" | "sink"
        self._released = False

    def write(self, text: str) -> int:  # noqa: D102 - a text stream's
        if self._released:
            return self._before.write(text)
        for piece in _PIECES.findall(text):
            if self._line_to is None:
                piece, self._start = self._start + piece, ""
                if _NATIVE_LINE.match(piece):
                    self._line_to = "sink"
                elif _NATIVE_START.fullmatch(piece):
                    self._start = piece
                    continue
                else:
                    self._line_to = "console"
            if self._line_to == "sink":
                os.write(self._sink_fd, piece.encode(errors="backslashreplace"))
            else:
                self._console.write(piece)
            if piece.endswith(("\n", "\r")):
                self._line_to = None
        return len(text)

    def flush(self) -> None:  # noqa: D102 - a text stream's
        (self._before if self._released else self._console).flush()

    def release(self) -> None:
        """Write out an undecided line start, and send every later write to the `sys.stderr` of before."""
        if self._start:
            self._console.write(self._start)
        self._console.flush()
        self._released = True

    def __getattr__(self, name: str):
        return getattr(self._before if self._released else self._console, name)


def _writes_to_fd2(stream) -> bool:
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, ValueError):  # pytest's capture streams have no file descriptor
        return False


@contextlib.contextmanager
def _native_held(hidden: Hidden) -> Iterator[None]:
    """Point file descriptor 2 at a temporary file, and `sys.stderr` at a `_Console` that still reaches the
    console; count the lines held, or write them out when the block raises."""
    before = sys.stderr
    before.flush()
    with tempfile.TemporaryFile() as sink, contextlib.ExitStack() as undo:
        saved = os.dup(2)
        undo.callback(os.close, saved)
        console = before
        if _writes_to_fd2(before):  # Python's own writes must not follow fd 2 into the file
            console = io.TextIOWrapper(io.FileIO(os.dup(saved), "w"), encoding=before.encoding,
                                       errors="backslashreplace", write_through=True)
            undo.callback(console.close)
            if not faulthandler.is_enabled():  # a crash in native code would end the process without a word
                faulthandler.enable(file=console)
                undo.callback(faulthandler.disable)
        stderr = _Console(console, sink.fileno(), before)
        sys.stderr = stderr
        os.dup2(sink.fileno(), 2)
        undo.callback(os.dup2, saved, 2)
        undo.callback(stderr.release)
        failed = False
        try:
            yield
        except BaseException:
            failed = True
            raise
        finally:
            sys.stderr = before
            undo.close()
            sink.seek(0)
            native = sink.read().decode(errors="backslashreplace")
            if failed:
                before.write(native)
                before.flush()
            elif lines := len(native.splitlines()):
                hidden.counts[NATIVE] += lines
