"""`hfexport export-many LIST --format F[,F...] -o DIR`: each model of a list to each format
(`hfexport.job.batch.run_batch`), here or on Ray; prints each export as it finishes and the summary.

Exit codes: 0 every export ok; 1 otherwise; 2 the output folder refused, before any export
(`hfexport.job.batch.check_batch_folder`); 130 interrupted (`--resume` continues).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .arguments import add_ray_arguments

NAME = "export-many"


def _this_run(args) -> str:
    formats = f" --format {args.format}" if args.format else ""
    return f"hfexport export-many {args.list}{formats}" + (" --resume" if args.resume else "")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `hfexport export-many` and its arguments to the command line's `subparsers`."""
    from ..extensions import format_names

    formats = format_names()
    parser = subparsers.add_parser(NAME, help="export each model of a list to each format, each in its own "
                                   "subprocess, here or on Ray; write DIR/summary.json and DIR/summary.md")
    parser.add_argument("list", help="a .txt (one model a line: tiny:llama, a folder, a hub id; # comments) or a "
                        '.json (a list of models, or of objects {"model": ..., "generate": true, ...})')
    parser.add_argument("--format", "-f", default="dynamo", help=f"comma-separated: {','.join(formats)} "
                        "(default: %(default)s)")
    parser.add_argument("--output", "-o", required=True, help="the folder: DIR/<model>/<format> per export (new or "
                        "empty, or an earlier batch's with --resume)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per export (default 1800)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="exports run at once here (default 1)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the exports DIR/summary.json lists as done and run only the others; exports "
                        "that crashed or timed out run again")
    add_ray_arguments(parser)
    return parser


def run(args) -> int:
    """Run `hfexport export-many` with the parsed `args`; return the exit code."""
    from ..job.batch import SUMMARY, read_model_list, render_summary, run_batch
    from ..job.executors import choose_executor

    items = read_model_list(args.list)
    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    executor = choose_executor(args.jobs, args.ray, args.ray_address)
    finished = []

    def progress(result) -> None:
        finished.append(result)
        detail = f": {result.detail}" if result.status != "ok" else ""
        seconds = f" ({result.seconds:.0f} s)" if result.seconds is not None else ""
        print(f"[{len(finished)}] {result.model} {result.format}: {result.status}{seconds}{detail}",
              file=sys.stderr, flush=True)

    output = Path(args.output)
    try:
        results = run_batch(items, formats, output, executor=executor, timeout=args.timeout, resume=args.resume,
                            run=_this_run(args), on_result=progress)
    except KeyboardInterrupt:
        print(f"hfexport: interrupted; {len(finished)} finished exports saved in {output / SUMMARY} "
              "(--resume runs the others)", file=sys.stderr)
        return 130
    print(render_summary(results), end="")
    failed = [r for r in results if r.status != "ok"]
    print(f"hfexport: {len(results)} exports, {len(failed)} not ok; wrote {output / SUMMARY} and "
          f"{output / 'summary.md'}", file=sys.stderr)
    return 1 if failed else 0
