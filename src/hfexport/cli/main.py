"""`hfexport` entry point: parses arguments, runs a command, turns errors into one clear line, and
ends quietly when the reader of its output left first."""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from typing import Any

from ..errors import (DtypeRefusedError, ExportError, ExportFolderError, OutputFolderError, RefusedFileError,
                      TaskError, ValidationError)

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
    from ..backends.executorch.config import DELEGATES
    from ..extensions import format_names
    from ..fuzz import add_arguments as add_fuzz_arguments
    from ..loading import DTYPES
    from ..quantization import CLI_SCHEMES
    from ..generation.tasks import TASKS
    from .quantize import add_arguments as add_quantization_arguments

    formats = format_names()
    schemes = list(dict.fromkeys(scheme for fmt in formats for scheme in CLI_SCHEMES.get(fmt, {})))

    parser = argparse.ArgumentParser(prog="hfexport", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs (implies --verbose)")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="show other packages' log records, warnings and native output (hidden by default)")
    sub = parser.add_subparsers(dest="command", required=True)

    export = sub.add_parser("export", help="export a model, validate it against eager, write artifact + report",
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog=_export_epilog(formats, CLI_SCHEMES))
    export.add_argument("model", help="a local folder, a hub id, a .gguf file (dequantized to float32; pip install "
                        "\"hfexport[gguf]\"), or a tiny random model tiny:NAME (`hfexport presets` lists them)")
    export.add_argument("--gguf-file", metavar="NAME", help="the GGUF file to load in the folder or hub repo MODEL "
                        "names")
    export.add_argument("--revision", metavar="REV", default=None,
                        help="the hub revision of MODEL to load: a branch, tag or commit (default: main)")
    export.add_argument("--trust-remote-code", action="store_true",
                        help="run the Python code MODEL's repository names in its config (auto_map); off by default")
    export.add_argument("--dtype", default="float32", choices=DTYPES, metavar="DTYPE",
                        help="%(choices)s: load, export and validate the model in this dtype (auto: the "
                        "checkpoint's own); a format refuses one its runtime cannot run (default: %(default)s)")
    export.add_argument("--format", "-f", default="dynamo", choices=formats, metavar="FORMAT",
                        help="%(choices)s (default: %(default)s)")
    export.add_argument("--output", "-o", required=True, help="output folder (must be new or empty, see --overwrite)")
    export.add_argument("--task", default="auto", choices=["auto", *TASKS], metavar="TASK",
                        help="what to export: %(choices)s (default: auto: a causal LM gets its runtime's LLM package "
                        "(text-generation-with-past), other models one graph (forward); --generate keeps its meaning). "
                        + "; ".join(f"{task.name}: {task.description}" for task in TASKS.values()))
    export.add_argument("--static", action="store_true", help="export static shapes (default: dynamic=True)")
    export.add_argument("--delegate", choices=DELEGATES, metavar="DELEGATE",
                        help="with --format executorch: the delegate, %(choices)s (default: xnnpack)")
    export.add_argument("--backend", dest="delegate", choices=DELEGATES, help=argparse.SUPPRESS)  # its name before 0.2
    export.add_argument("--stateless", action="store_true",
                        help="with --format openvino: keep the cache as inputs/outputs (default: OpenVINO variables)")
    export.add_argument("--external-weights", action=argparse.BooleanOptionalAction, default=None,
                        help="with --format executorch or onnx: the weights in <name>.ptd beside <name>.pte, or "
                        "<name>.onnx.data beside <name>.onnx (default: when they exceed 64 MiB)")
    export.add_argument("--max-sequence-length", type=int, metavar="N", default=None,
                        help="with --format executorch: the longest sequence the program takes; memory planning "
                        "sizes every intermediate for it (default: the config's max_position_embeddings; with "
                        "--generate, the LLM-runner program's cache: default the model's positions up to 2048)")
    export.add_argument("--max-batch-size", type=int, metavar="N", default=None,
                        help="with --format executorch: the largest batch the program takes (default 8)")
    export.add_argument("--generate", action="store_true",
                        help="export the generation components (prefill, decode, encoder, ...) with a manifest")
    export.add_argument("--static-cache", type=int, metavar="N", default=None,
                        help="the LLM package's cache length (--task auto or text-generation-with-past; default: "
                        "the model's positions up to 2048); with --generate --multi-token-decode (implied with "
                        "--format executorch): one decode graph over a static cache of N tokens")
    export.add_argument("--llm-runner", action=argparse.BooleanOptionalAction, default=None,
                        help="with --format executorch --generate: one program for ExecuTorch's own LLM runner "
                        "(TextLLMRunner) and hfexport generate: the cache inside it (--static-cache N tokens, else "
                        "--max-sequence-length N, else the model's positions up to 2048), written by update_cache and "
                        "read by custom_sdpa; tokenizer.json beside it. Default: that program where the model allows "
                        "it, else the static-cache components (--static-cache N, with a warning) or the dynamic-cache "
                        "ones, the report saying why; --llm-runner: that program or an error; --no-llm-runner: the "
                        "components (the cache as method inputs, which TextLLMRunner cannot load)")
    export.add_argument("--multi-token-decode", action="store_true",
                        help="with --generate: decode takes any number of new tokens (query axis kept dynamic)")
    export.add_argument("--quantize", metavar="SCHEME", default=None, choices=schemes,
                        help="%(choices)s (which ones depend on --format, see below; static schemes calibrate on "
                        "the calibration prompts: --calibration-data, else built-in ones)")
    add_quantization_arguments(export)
    export.add_argument("--min-cosine", type=float, default=None,
                        help="with --quantize: pass if the logits' (each output's but the cache's) cosine "
                        "similarity with fp32 eager reaches this, and with --generate their mean over the "
                        "accuracy gate's steps (default 0.99 for int4 schemes, 0.995 otherwise; with --generate "
                        "the defaults are advisory, the gate decides: a value given binds validation)")
    export.add_argument("--min-cache-cosine", type=float, default=None,
                        help="with --quantize: the same for each cache tensor (default 0.9 for int4 schemes, "
                        "0.95 otherwise, at most --min-cosine; advisory with --generate unless given)")
    export.add_argument("--min-agreement", type=float, default=None,
                        help="with --generate --quantize: pass if the greedy tokens equal fp32 eager generate()'s "
                        "on this share of 64 teacher-forced steps (default 0.6 for int4 schemes, 0.7 otherwise)")
    export.add_argument("--overwrite", action="store_true",
                        help="replace an earlier hfexport export in the output folder (only the files it wrote; a "
                        "folder holding other files is refused)")
    export.add_argument("--no-validate", action="store_true", help="skip the comparison with eager")
    export.add_argument("--tolerance", type=float, default=None, help="absolute tolerance (default per format)")
    export.add_argument("--rtol", type=float, default=None, help="relative tolerance (default per format)")
    export.add_argument("--prompt", default="Hello, world!", help="sample prompt when the model has a tokenizer")
    export.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")

    generate = sub.add_parser("generate", help="generate tokens with an export written by `export --generate`")
    generate.add_argument("export_dir", help="the folder `hfexport export --generate -o DIR` wrote")
    prompt = generate.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", help="the prompt as token ids: 1,2,3")
    prompt.add_argument("--prompt", help="the prompt as text (needs a tokenizer saved with the export)")
    prompt.add_argument("--chat", metavar="MESSAGE",
                        help="one user message, templated with the chat template saved with the export; prints "
                        "the answer, stopping at the model's end-of-turn token")
    generate.add_argument("--system", help="with --chat: a system message before it")
    image = generate.add_mutually_exclusive_group()
    image.add_argument("--image", metavar="PATH",
                       help="with an image-text export and --prompt: an image file (Pillow: pip install "
                       "\"hfexport[vision]\"), read with the processor saved in the export; the prompt is "
                       "formatted with its chat template where it has one")
    image.add_argument("--image-inputs", metavar="FILE.npz",
                       help="with an image-text export: the processor's image arrays (pixel_values, and "
                       "image_grid_thw for Qwen2-VL) saved with numpy.savez; the prompt holds the image tokens")
    # speech (issue 52): the clip is the whole input, in place of a prompt (checked by generate._check_audio_options)
    prompt.required = False
    audio = generate.add_mutually_exclusive_group()
    audio.add_argument("--audio", metavar="PATH",
                       help="with a speech export (Whisper), in place of a prompt: a WAV or FLAC file (soundfile: pip "
                       "install \"hfexport[audio]\"), mixed to mono, resampled and turned into features by the "
                       "feature extractor saved in the export; prints the transcript")
    audio.add_argument("--audio-inputs", metavar="FILE.npz",
                       help="with a speech export, in place of a prompt: the feature extractor's arrays "
                       "(input_features) saved with numpy.savez")
    generate.add_argument("--max-new-tokens", type=int, default=None, help="default 16, 256 with --chat")
    generate.add_argument("--min-new-tokens", type=int, default=0)
    generate.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    generate.add_argument("--temperature", type=float, default=None)
    generate.add_argument("--top-k", type=int, default=None)
    generate.add_argument("--top-p", type=float, default=None)
    generate.add_argument("--repetition-penalty", type=float, default=None)
    generate.add_argument("--seed", type=int, default=None, help="seed for --do-sample (reproducible tokens)")
    _add_engine(generate)
    generate.add_argument("--json", action="store_true", help="print the result as JSON (token ids, text, timings)")
    generate.add_argument("--ids", action="store_true",
                          help="print the generated token ids after the text (printed anyway where the export "
                          "holds no tokenizer)")
    _add_no_verify(generate)

    chat = sub.add_parser("chat", help="talk with an export written by `export --generate`: each line on stdin "
                          "is a user turn, answered as it is generated (/reset starts over; /quit or end of input ends)")
    chat.add_argument("export_dir", help="the folder `hfexport export --generate -o DIR` wrote (with a chat template)")
    chat.add_argument("--system", help="a system message to start the conversation with")
    chat.add_argument("--max-new-tokens", type=int, default=256, help="most tokens per answer (default 256)")
    _add_engine(chat)
    _add_no_verify(chat)
    chat.add_argument("--json", action="store_true",
                      help="print each answer as one JSON line (tokens, text, timings) instead of streaming it")

    verify = sub.add_parser("verify", help="check an export folder as generate and chat open it (its manifest, "
                            "every file's SHA-256, the files its models name), running nothing")
    verify.add_argument("export_dir", help="the folder `hfexport export -o DIR` wrote")
    verify.add_argument("--upgrade", action="store_true",
                        help="for a folder written by hfexport 0.3 or older (manifest version 1-2, no hashes): "
                        "record the SHA-256 of the files it holds now, then check it. Only on a copy you trust: "
                        "the hashes prove the files stay as they are now, not that they are what was exported. "
                        "For one written by hfexport 0.4 (version 3, which opens as it is): rewrite its runtime "
                        "package as version 4's one entry")

    coverage = sub.add_parser("coverage", help="export every tiny architecture to every backend, check each "
                              "against eager, write the matrix (Markdown + JSON)")
    coverage.add_argument("--backends", help="comma-separated (default: dynamo,onnx,openvino,executorch)")
    coverage.add_argument("--modes", help="comma-separated: export,generate,generate-image (default: all)")
    coverage.add_argument("--only", help="comma-separated architectures (preset names; default: all)")
    coverage.add_argument("--output", "-o", default="docs/coverage.md",
                          help="the Markdown page; the JSON goes beside it (default: docs/coverage.md); each "
                          "replaces only a page or JSON hfexport wrote")
    coverage.add_argument("--timeout", type=float, default=900, help="seconds per case (default 900)")
    coverage.add_argument("--jobs", "-j", type=int, default=1, help="cases run at once (default 1)")
    coverage.add_argument("--merge", action="store_true",
                          help="keep the other cases of the JSON beside --output; replace only those run now")
    coverage.add_argument("--resume", action="store_true",
                          help="keep the cases of the JSON beside --output (saved after each case) and run only the "
                          "others; cases that crashed or timed out run again")
    _add_ray_arguments(coverage)

    many = sub.add_parser("export-many", help="export each model of a list to each format, each in its own "
                          "subprocess, here or on Ray; write DIR/summary.json and DIR/summary.md")
    many.add_argument("list", help="a .txt (one model a line: tiny:llama, a folder, a hub id; # comments) or a "
                      '.json (a list of models, or of objects {"model": ..., "generate": true, ...})')
    many.add_argument("--format", "-f", default="dynamo", help=f"comma-separated: {','.join(formats)} "
                      "(default: %(default)s)")
    many.add_argument("--output", "-o", required=True, help="the folder: DIR/<model>/<format> per export (new or "
                      "empty, or an earlier batch's with --resume)")
    many.add_argument("--timeout", type=float, default=1800, help="seconds per export (default 1800)")
    many.add_argument("--jobs", "-j", type=int, default=1, help="exports run at once here (default 1)")
    many.add_argument("--resume", action="store_true",
                      help="keep the exports DIR/summary.json lists as done and run only the others; exports "
                      "that crashed or timed out run again")
    _add_ray_arguments(many)

    fuzz = sub.add_parser("fuzz", help="draw random tiny decoders, export them dynamic to each backend, compare "
                          "with eager; print a shrunk reproduction of each failure")
    add_fuzz_arguments(fuzz)

    sub.add_parser("env", help="installed backends, versions, drift from the tested set")
    sub.add_parser("presets", help="list the tiny random models `export tiny:NAME` builds offline")
    patches = sub.add_parser("patches", help="list registered patches and FX fixes")
    patches.add_argument("--format", "-f", choices=formats, metavar="FORMAT",
                         help="only those of this export format: %(choices)s")
    patches.add_argument("--backend", dest="format", choices=formats, help=argparse.SUPPRESS)  # its name before 0.2
    return parser


def _version() -> str:
    """`hfexport --version`: the package's version and the torch and transformers it was tested with."""
    from .. import __version__
    from .._versions import TESTED_VERSIONS

    return (f"hfexport {__version__} (tested with torch {TESTED_VERSIONS['torch']}, transformers "
            f"{TESTED_VERSIONS['transformers']}; `hfexport env` compares what is installed)")


def _export_epilog(formats: list[str], schemes: dict[str, dict]) -> str:
    """The `export --help` text after the options: the --quantize schemes each format takes."""
    width = max(map(len, formats))
    lines = [f"  {fmt + ':':<{width + 1}} {', '.join(schemes.get(fmt, {})) or 'none'}" for fmt in formats]
    from .quantize import epilog

    return ("--quantize schemes per --format:\n" + "\n".join(lines) + "\n\n" + epilog(formats)
            + "\n\n`hfexport presets` lists the tiny:NAME models.")


def _add_engine(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=("auto", "runtime", "hfexport"), default="auto",
                        help="what generates: auto (default) the runtime's own engine (og.Generator, LLMPipeline, "
                        "TextLLMRunner) on a runtime's LLM package where it is installed and runs the options given, "
                        "else hfexport's loop; runtime: the engine or exit 2 saying why not; hfexport: hfexport's loop")


def _add_no_verify(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-verify", action="store_true",
                        help="skip the SHA-256 check of every file the folder's manifest lists (about a second per "
                        "GB; for a folder you wrote or trust): its paths are still confined to the folder")


def _add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ray", action="store_true",
                        help='run each cell as a Ray task (pip install "hfexport[ray]"): on the cluster of '
                        "RAY_ADDRESS, or a local instance")
    parser.add_argument("--ray-address", metavar="ADDR",
                        help="the Ray cluster to join (auto, HOST:6379; implies --ray)")


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
    from .quiet import is_quiet, progress_bars_off

    argv = sys.argv[1:] if argv is None else argv
    # before the parser imports torch, which imports tqdm, which reads its environment then
    with progress_bars_off() if is_quiet(argv) else contextlib.nullcontext():
        return _command(_parser().parse_args(argv))


def _command(args: argparse.Namespace) -> int:
    from . import chat, coverage, env, export, export_many, fuzz, generate, patches, presets, verify
    from .quantize import UsageError
    from .quiet import command_output

    command = {"export": export.run, "generate": generate.run, "chat": chat.run, "coverage": coverage.run,
               "fuzz": fuzz.run, "env": env.run, "patches": patches.run, "presets": presets.run,
               "export-many": export_many.run, "verify": verify.run}[args.command]
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
        if isinstance(error, (OutputFolderError, TaskError, UsageError, DtypeRefusedError, ExportFolderError,
                              RefusedFileError)):
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
