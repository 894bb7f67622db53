"""`hfexport coverage`: the architecture x backend x mode matrix, written as a Markdown page and JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .arguments import add_ray_arguments

NAME = "coverage"


def _names(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def _this_run(args) -> str:
    """The command line as the page's list of runs records it."""
    flags = "".join(f" --{flag} {value}" for flag, value in (
        ("backends", args.backends), ("modes", args.modes), ("only", args.only)) if value)
    return "hfexport coverage" + flags + "".join(f" --{flag}" for flag in ("merge", "resume") if getattr(args, flag))


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `hfexport coverage` and its arguments to the command line's `subparsers`."""
    parser = subparsers.add_parser(NAME, help="export every tiny architecture to every backend, check each "
                                   "against eager, write the matrix (Markdown + JSON)")
    parser.add_argument("--backends", help="comma-separated (default: dynamo,onnx,openvino,executorch)")
    parser.add_argument("--modes", help="comma-separated: export,generate,generate-image,generate-audio (default: all)")
    parser.add_argument("--only", help="comma-separated architectures (preset names; default: all)")
    parser.add_argument("--output", "-o", default="docs/coverage.md",
                        help="the Markdown page; the JSON goes beside it (default: docs/coverage.md); each "
                        "replaces only a page or JSON hfexport wrote")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per case (default 900)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="cases run at once (default 1)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other cases of the JSON beside --output; replace only those run now")
    parser.add_argument("--resume", action="store_true",
                        help="keep the cases of the JSON beside --output (saved after each case) and run only the "
                        "others; cases that crashed or timed out run again")
    add_ray_arguments(parser)
    return parser


def run(args) -> int:
    """Run `hfexport coverage` with the parsed `args`: 0 when every case is as expected, 1 otherwise."""
    from ..coverage import load_results, merge_results, render_markdown, run_matrix, save_results
    from ..job.executors import choose_executor
    from ..coverage.matrix import BACKENDS, FAILED, MODES, check_outputs, done_results
    from ..folder.storage import atomic_file

    backends = _names(args.backends) or list(BACKENDS)
    modes = _names(args.modes) or list(MODES)
    for name, given, allowed in (("backend", backends, BACKENDS), ("mode", modes, MODES)):
        wrong = [g for g in given if g not in allowed]
        if wrong:
            raise ValueError(f"unknown {name} {wrong}; choose from {', '.join(allowed)}")
    output = Path(args.output)
    saved = check_outputs(output)  # before any case: each a new file or one hfexport wrote
    executor = choose_executor(args.jobs, args.ray, args.ray_address)
    previous, runs = [], [_this_run(args)]
    if (args.merge or args.resume) and saved.exists():
        previous, previous_runs = load_results(saved)
        runs = previous_runs + runs
    done = done_results(previous) if args.resume else []
    finished = []

    def progress(result) -> None:
        finished.append(result)
        save_results(saved, merge_results(previous, finished), runs)  # an interrupted run loses only the cells running
        seconds = f" ({result.seconds:.0f} s)" if result.seconds is not None else ""
        detail = f": {result.detail}" if result.detail and result.verdict != "ok" else ""
        print(f"[{len(finished)}] {result.arch} {result.backend} {result.mode}: {result.verdict}{seconds}{detail}",
              file=sys.stderr, flush=True)

    if done:
        print(f"hfexport: resuming {saved}: {len(done)} cases done, not run again", file=sys.stderr)
    try:
        results = run_matrix(_names(args.only), backends, modes, timeout=args.timeout, executor=executor, done=done,
                             on_result=progress)
    except KeyboardInterrupt:
        print(f"hfexport: interrupted; {len(finished)} finished cases saved in {saved} (--resume runs the others)",
              file=sys.stderr)
        return 130
    results = merge_results(previous, results)
    check_outputs(output)  # a file put there while the cases ran is kept (the cases are in the JSON)
    with atomic_file(output) as page:
        page.write(render_markdown(results, runs))
    save_results(saved, results, runs)
    unexpected = [r for r in results if r.verdict in FAILED or r.verdict == "unexpected pass"]
    print(f"hfexport: {len(results)} cases, {len(unexpected)} unexpected; wrote {output} and {saved}",
          file=sys.stderr)
    return 1 if unexpected else 0
