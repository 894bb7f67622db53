"""What the CLI writes on stderr besides its progress: hfexport's own log lines, and what other packages
say during a command (log records, Python warnings, native writes), held back unless `--verbose`."""

# NOTE: each library that says much is quieted through its own control, restored on exit: transformers
# (`set_verbosity_error`, and `disable_progress_bar` for its bars: "Loading weights"), huggingface_hub
# (`disable_progress_bars`: downloads), torch (`torch._logging.set_logs`), ONNX Runtime (`set_default_logger_severity`,
# its C++ log) and NNCF (`nncf.set_log_level`), applied when the command starts or, for one imported later,
# as its import ends (`_OnImport`): what they no longer emit costs nothing and is not counted. What other
# packages still print is counted, not shown: a log record reaching a console handler that existed when
# the command started (a filter on it) or no handler at all (`logging.lastResort`), and a Python warning
# (`warnings.showwarning`, the hook the warnings module documents for this).
#
# tqdm itself has no switch but its environment (`TQDM_DISABLE`), read once, when tqdm is imported, which
# torch does: `progress_bars_off` sets it (and `HF_HUB_DISABLE_PROGRESS_BARS`, for huggingface_hub's bars in
# a subprocess) before the CLI imports torch, from a look at the options before the command; the bars
# transformers draws with plain tqdm (GGUF's "de-quantizing") are then never drawn.
#
# Native code with no verbosity control writes to the console two ways, both still held: writes to file
# descriptor 2, held by pointing fd 2 at a temporary file (OpenVINO's plugins and frontends, which have no
# log level in openvino 2026.4.1; torch's C++ warnings raised outside Python's warning handler); and writes
# through Python's `sys.stderr` (ExecuTorch 1.4.1's runtime log, `ET_LOG`, which its Python bindings write
# there), held by their `[file.cpp:N] ...` form, the only thing that tells them from hfexport's progress.

from __future__ import annotations

import contextlib
import copy
import dataclasses
import faulthandler
import importlib.abc
import io
import logging
import os
import re
import sys
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["Hidden", "command_output", "progress_bars_off", "is_quiet"]

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
            stack.enter_context(_libraries_quiet(CONTROLS))
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


@dataclasses.dataclass(frozen=True)
class Control:
    """A library's own verbosity control: `quiet()` turns its console output down to errors and returns
    what puts it back as it was."""

    package: str
    quiet: Callable[[], Callable[[], None]]


def _quiet_transformers() -> Callable[[], None]:
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    def restore() -> None:
        hf_logging.set_verbosity(before[0])
        if before[1]:
            hf_logging.enable_progress_bar()

    return restore


def _quiet_huggingface_hub() -> Callable[[], None]:
    from huggingface_hub import utils as hub_utils

    before = hub_utils.are_progress_bars_disabled()
    hub_utils.disable_progress_bars()
    return (lambda: None) if before else hub_utils.enable_progress_bars


def _quiet_torch() -> Callable[[], None]:
    # set_logs has no getter and resets what it is not given: the state it replaces is read and put
    # back through torch._logging._internal (_get_log_state, _set_log_state, _init_logs; torch 2.13.0)
    import torch._logging
    from torch._logging import _internal

    before = copy.deepcopy(_internal._get_log_state())
    torch._logging.set_logs(all=logging.ERROR)

    def restore() -> None:
        _internal._set_log_state(before)
        _internal._init_logs()

    return restore


def _quiet_onnxruntime() -> Callable[[], None]:
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)  # errors only
    # onnxruntime 1.32 has no getter for it: put back to its documented default, 2 (warnings)
    return lambda: onnxruntime.set_default_logger_severity(2)


def _quiet_nncf() -> Callable[[], None]:
    import nncf

    logger = logging.getLogger("nncf")  # the logger nncf.set_log_level sets, with its handlers (nncf 3.4.0)
    before = logger.level, [(handler, handler.level) for handler in logger.handlers]
    nncf.set_log_level(logging.ERROR)

    def restore() -> None:
        logger.setLevel(before[0])
        for handler, level in before[1]:
            handler.setLevel(level)

    return restore


#: The libraries quieted through their own controls, in this order (and restored in the reverse one).
CONTROLS = (Control("torch", _quiet_torch), Control("huggingface_hub", _quiet_huggingface_hub),
            Control("transformers", _quiet_transformers), Control("onnxruntime", _quiet_onnxruntime),
            Control("nncf", _quiet_nncf))

#: The environment that turns progress bars off where only the environment can (`progress_bars_off`).
PROGRESS_BARS_OFF = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def is_quiet(argv: list[str]) -> bool:
    """Whether the command line `argv` leaves other packages' output hidden: no `--verbose`, `-v` nor
    `--debug` among the options before the command (the only place the parser takes them)."""
    options = []
    for arg in argv:
        if not arg.startswith("-"):
            break
        options.append(arg)
    return not {"--verbose", "-v", "--debug"} & set(options)


@contextlib.contextmanager
def progress_bars_off() -> Iterator[None]:
    """Set `PROGRESS_BARS_OFF` in the environment for the block (a variable the user set is kept as set)."""
    set_here = {name: value for name, value in PROGRESS_BARS_OFF.items() if name not in os.environ}
    os.environ.update(set_here)
    try:
        yield
    finally:
        for name in set_here:
            os.environ.pop(name, None)


@contextlib.contextmanager
def _libraries_quiet(controls: tuple[Control, ...]) -> Iterator[None]:
    """Apply each control now when its package is imported, else as soon as its import ends; undo
    every one applied on exit, the last first."""
    undo: list[Callable[[], None]] = []

    def apply(control: Control) -> None:
        undo.append(control.quiet())

    hook = _OnImport({c.package: c for c in controls if c.package not in sys.modules}, apply)
    try:
        for control in controls:
            if control.package in sys.modules:
                apply(control)
        sys.meta_path.insert(0, hook)
        yield
    finally:
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
        while undo:
            undo.pop()()


class _OnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a package of `pending`, it wraps the loader the other finders give so
    that `then(control)` runs once the package's own import ends."""

    def __init__(self, pending: dict[str, Control], then: Callable[[Control], None]):
        self.pending, self.then = pending, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:  # noqa: D102 - a finder's
        if fullname not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenLoader(spec.loader, lambda: self.then(self.pending.pop(fullname)))
                return spec
        return None


class _ThenLoader(importlib.abc.Loader):
    """`loader`, and `then()` after it executed the module; the module keeps `loader` as its own."""

    def __init__(self, loader: Any, then: Callable[[], None]):
        self.loader, self.then = loader, then

    def create_module(self, spec: Any) -> Any:  # noqa: D102 - a loader's
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:  # noqa: D102 - a loader's
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.then()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


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


class _Counted(logging.Filter):
    """On a console handler: another package's record is counted in `hidden` (once, whichever handlers
    it reaches) and not printed; hfexport's own pass."""

    def __init__(self, hidden: Hidden):
        super().__init__()
        self.hidden = hidden

    def filter(self, record: logging.LogRecord) -> bool:  # noqa: D102 - a filter's
        if _is_ours(record.name):
            return True
        if not getattr(record, "_hfexport_counted", False):
            record._hfexport_counted = True
            self.hidden.counts[record.name.partition(".")[0]] += 1
        return False


class _CountedLastResort(logging.Handler):
    """`logging.lastResort` during a command: a record of a logger without any handler is counted."""

    def __init__(self, counted: _Counted, level: int):
        super().__init__(level)
        self.addFilter(counted)

    def emit(self, record: logging.LogRecord) -> None:  # noqa: D102 - a handler's; `filter` counted it
        pass


@contextlib.contextmanager
def _records_held(hidden: Hidden) -> Iterator[None]:
    """Count other packages' records that would print: through a filter on each console handler there is
    now (files and torch's `TORCH_TRACE` log still get them), and as `logging.lastResort`."""
    consoles = (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)  # before `_native_held` swaps stderr
    counted = _Counted(hidden)
    loggers = [logging.root, *(logger for logger in list(logging.root.manager.loggerDict.values())
                               if isinstance(logger, logging.Logger))]
    handlers = {id(h): h for logger in loggers for h in logger.handlers if _prints(h, consoles)}.values()
    last_resort = logging.lastResort
    for handler in handlers:
        handler.addFilter(counted)
    logging.lastResort = _CountedLastResort(counted, last_resort.level if last_resort else logging.WARNING)
    try:
        yield
    finally:
        logging.lastResort = last_resort
        for handler in handlers:
            handler.removeFilter(counted)


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
