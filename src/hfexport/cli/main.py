"""`hfexport` entry point: parses arguments, runs a command, turns errors into one clear line, and
ends quietly when the reader of its output left first. `entry` is the process's (the console script,
`python -m hfexport`); `main` runs one command line in a process that goes on (tests, scripts)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import select
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from typing import Any

from ..errors import (DtypeRefusedError, ExportError, ExportFolderError, OptionError, OutputFolderError,
                      RefusedFileError, TaskError, ValidationError)

#: The exit code when the reader of the output closed it first (`hfexport patches | head`): 128 +
#: SIGPIPE, what a shell reports for a command that signal ended (`seq 100000 | head -1`, seen under
#: `set -o pipefail`). Not 0: the output was cut short, and `export-many`'s 0 says every export was
#: ok; not 1, which says the command failed. Quiet: no traceback, no message.
READER_GONE = 141

#: What `hfexport --help` says the command is, for its users.
DESCRIPTION = ("Export a Hugging Face transformers model to torch.export (dynamo), ONNX, ExecuTorch or\n"
               "OpenVINO, check the export against eager PyTorch, and run it.")
EPILOG = """\
start with a tiny random model, which needs no files nor network:
  hfexport export tiny:llama -f onnx -o out/llama     export, validate, write out/llama
  hfexport generate out/llama --prompt-ids 1,2,3      run it
then a folder written by save_pretrained, a .gguf file or a hub id in place of tiny:llama.
`hfexport COMMAND --help` lists a command's options; `hfexport env` what is installed."""


def _parser() -> argparse.ArgumentParser:
    """The command line: its global options, then each subcommand's parser, added by its module."""
    parser = argparse.ArgumentParser(prog="hfexport", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs (implies --verbose)")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="show other packages' log records, warnings and native output (hidden by default)")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in _commands():
        command.register(sub)
    return parser


def _commands() -> tuple[Any, ...]:
    """The subcommands' modules, in `hfexport --help`'s order: each adds its parser (`register`) and
    runs it (`run`)."""
    from . import chat, coverage, env, export, export_many, fuzz, generate, patches, presets, verify

    return export, generate, chat, verify, coverage, export_many, fuzz, env, presets, patches


def _version() -> str:
    """`hfexport --version`: the package's version and the torch and transformers it was tested with."""
    from .. import __version__
    from .._versions import TESTED_VERSIONS

    return (f"hfexport {__version__} (tested with torch {TESTED_VERSIONS['torch']}, transformers "
            f"{TESTED_VERSIONS['transformers']}; `hfexport env` compares what is installed)")


def entry() -> int:
    """The `hfexport` command as a process runs it (the console script, `python -m hfexport`):
    `main()` on the process's arguments, then its heap frozen for the interpreter's exit."""
    try:
        return main()
    finally:
        # NOTE: the interpreter's exit ran the cyclic collector over the whole heap a command leaves
        # (the imported libraries' objects): 1.1-1.4 s after the 1.25 GB Llama's ONNX export, seen
        # with `perf` (gc_collect_main, visit_decref), 0.2 s with the heap frozen (`bench/RESULTS.md`).
        # The garbage there is collected once first, its finalizers run as the exit would have run
        # them; what is frozen was reachable then, and the exit frees it by reference counting
        # (cycles among it go with the process).
        gc.collect()
        gc.freeze()


def main(argv: list[str] | None = None) -> int:
    """Run the `hfexport` command line on `argv` (default: the process's); return the exit code
    (`READER_GONE` when the reader of its output left first: `hfexport patches | head`)."""
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()  # so that a reader gone shows here, not in the interpreter's exit
    except BrokenPipeError:
        gone = [stream for stream in (sys.stdout, sys.stderr) if _reader_gone(stream)]
        if not gone:
            raise  # a pipe of the command's own (a subprocess's), not its output: a real error
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in gone:  # what is still buffered for them goes nowhere, quietly, at exit
            os.dup2(devnull, stream.fileno())
        return READER_GONE


def _reader_gone(stream) -> bool:
    """Whether `stream` is a pipe (or socket) whose reader closed it."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an in-memory stream (a test's capture)
        return False
    if not hasattr(select, "poll"):  # Windows: no way to ask; the error came from writing the output
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _run(argv: list[str] | None) -> int:
    from ..timing import fewer_collections
    from .quiet import is_quiet, progress_bars_off

    argv = sys.argv[1:] if argv is None else argv
    # before the parser imports torch, which imports tqdm, which reads its environment then; the
    # collector runs less often from the first import on (an export's job would raise it anyway)
    with progress_bars_off() if is_quiet(argv) else contextlib.nullcontext(), fewer_collections():
        return _command(_parser().parse_args(argv))


def _command(args: argparse.Namespace) -> int:
    from . import export
    from .quantize import UsageError
    from .quiet import command_output

    command = {module.NAME: module.run for module in _commands()}[args.command]
    try:
        # the summary of what was hidden comes before an error line, so that the error is the last line
        with command_output(verbose=args.verbose, debug=args.debug), _terminated_as_interrupt():
            return command(args)
    except KeyboardInterrupt as interrupt:
        print("hfexport: interrupted; nothing was written", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(interrupt, _Terminated) else signal.SIGINT)
    except (ExportError, ImportError, ValueError, TypeError) as error:
        if args.debug:
            traceback.print_exc()
        message = str(error).replace("\n", " ")
        print(f"hfexport: error: {message}", file=sys.stderr)
        # refused before any work: an output folder, the options, a folder to open that is not one to open
        if isinstance(error, (OutputFolderError, TaskError, OptionError, UsageError, DtypeRefusedError,
                              ExportFolderError, RefusedFileError)):
            return export.OUTPUT_REFUSED
        return export.VALIDATION_FAILED if isinstance(error, ValidationError) else 1


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command was when it came."""


@contextlib.contextmanager
def _terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM (a service manager, `kill`) ends a command as Ctrl-C does: the staging folder and
    any parent folders the export created are removed, an earlier export is kept, and the exit
    code is 128 + the signal's number. Only where this is the main thread (signals reach no other)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
