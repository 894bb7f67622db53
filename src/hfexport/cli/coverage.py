"""`hfexport coverage`: the architecture x backend x mode matrix, written as a Markdown page and JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _names(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def run(args) -> int:
    from ..coverage import render_markdown, run_matrix
    from ..coverage.matrix import BACKENDS, FAILED, MODES, CaseResult, merge_results
    from ..storage import atomic_write_text

    backends = _names(args.backends) or list(BACKENDS)
    modes = _names(args.modes) or list(MODES)
    for name, given, allowed in (("backend", backends, BACKENDS), ("mode", modes, MODES)):
        wrong = [g for g in given if g not in allowed]
        if wrong:
            raise ValueError(f"unknown {name} {wrong}; choose from {', '.join(allowed)}")
    output = Path(args.output)
    if not output.parent.is_dir():
        raise ValueError(f"{output.parent} does not exist; create it or choose another --output")
    done = []

    def progress(result) -> None:
        done.append(result)
        seconds = f" ({result.seconds:.0f} s)" if result.seconds is not None else ""
        detail = f": {result.detail}" if result.detail and result.verdict != "ok" else ""
        print(f"[{len(done)}] {result.arch} {result.backend} {result.mode}: {result.verdict}{seconds}{detail}",
              file=sys.stderr, flush=True)

    results = run_matrix(_names(args.only), backends, modes, timeout=args.timeout, jobs=args.jobs,
                         on_result=progress)
    saved = output.with_suffix(".json")
    if args.merge and saved.exists():
        previous = [CaseResult.from_dict(item) for item in json.loads(saved.read_text())]
        results = merge_results(previous, results)
    command = "hfexport coverage" + "".join(f" --{flag} {value}" for flag, value in (
        ("backends", args.backends), ("modes", args.modes), ("only", args.only)) if value) + (
        " (merged into the previous run's results)" if args.merge else "")
    atomic_write_text(output, render_markdown(results, command=command))
    atomic_write_text(saved, json.dumps([r.to_dict() for r in results], indent=1, default=str))
    unexpected = [r for r in results if r.verdict in FAILED or r.verdict == "unexpected pass"]
    print(f"hfexport: {len(results)} cases, {len(unexpected)} unexpected; wrote {output} and "
          f"{saved}", file=sys.stderr)
    return 1 if unexpected else 0
