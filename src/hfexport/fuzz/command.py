"""The command line of the fuzzer: `python -m hfexport.fuzz` and `hfexport fuzz`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from ..config import BUILTIN_FORMATS
from ..errors import OutputFolderError
from .checks import run_example
from .driver import FuzzOptions, fuzz, quiet_upstream
from .example import DEFAULT_ARCHS, MODES, Example
from .reproductions import reproduction


def _names(value: str | None, default: Sequence[str]) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else tuple(default)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m hfexport.fuzz` and `hfexport fuzz`."""
    parser.add_argument("--examples", type=int, default=20, help="examples to run, shrinking apart (default 20)")
    parser.add_argument("--backends", help=f"comma-separated (default: dynamo; any of {','.join(BUILTIN_FORMATS)})")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed: the same seed draws the same examples")
    parser.add_argument("--archs", help=f"comma-separated presets (default: {','.join(DEFAULT_ARCHS)})")
    parser.add_argument("--seq2seq", action="store_true", help="also draw the encoder-decoder T5")
    parser.add_argument("--modes", help="comma-separated: export (one graph), generate (components); default both")
    parser.add_argument("--no-shrink", action="store_true", help="report failures as found, unshrunk (faster)")
    parser.add_argument("--shrink-budget", type=int, default=20,
                        help="examples run while shrinking the failures of one round (default 20)")
    parser.add_argument("--database", help="a hypothesis example database folder (default: none)")
    parser.add_argument("--report", help="append each distinct failure, with its reproduction, to this Markdown file")
    parser.add_argument("--replay", metavar="JSON", help="run one example (as printed with a failure) and exit")
    parser.add_argument("--quiet", "-q", action="store_true", help="no per-example progress on stderr")


def options_from_args(args: argparse.Namespace) -> FuzzOptions:
    """`FuzzOptions` from the parsed command line (`add_arguments`)."""
    archs = _names(args.archs, DEFAULT_ARCHS) + (("t5",) if args.seq2seq and not args.archs else ())
    return FuzzOptions(examples=args.examples, backends=_names(args.backends, ("dynamo",)), archs=archs,
                       modes=_names(args.modes, MODES), seed=args.seed, shrink=not args.no_shrink,
                       shrink_budget=args.shrink_budget,
                       database=args.database, report=args.report, progress=not args.quiet)


def replay(text: str, out: Any = sys.stdout) -> int:
    """Run the one example `text` (an `Example` as JSON); print its outcome; 1 if it failed."""
    example = Example.from_json(text)
    with quiet_upstream():
        outcome = run_example(example)
    print(f"{example.label()}: {outcome.status} ({outcome.seconds:.1f} s)", file=out)
    for entry in outcome.failures + outcome.refusals:
        print(f"  {entry.category}{' (refused)' if entry in outcome.refusals else ''}: {entry.message}", file=out)
    for note in outcome.notes:
        print(f"  note: {note}", file=out)
    for failure in outcome.failures[:1]:
        print(f"--- reproduction\n{reproduction(example, failure.stage)}", file=out)
    return 1 if outcome.failures else 0


def run(args: argparse.Namespace, out: Any = sys.stdout) -> int:
    """Run the command: 0 when no failure was found, 1 otherwise."""
    import importlib.util

    if args.replay:
        return replay(args.replay, out)
    if importlib.util.find_spec("hypothesis") is None:
        raise ImportError('hfexport fuzz draws its examples with hypothesis: pip install "hfexport[test]"')
    summary = fuzz(options_from_args(args), out)
    print(summary.line(), file=out)
    return 1 if summary.failed_examples else 0


def main(argv: list[str] | None = None) -> int:
    """`python -m hfexport.fuzz`: 0 no failure found, 1 failures found, 2 bad options."""
    parser = argparse.ArgumentParser(prog="python -m hfexport.fuzz",
                                     description="Differential fuzzer: tiny decoders exported dynamic vs eager.")
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except (ValueError, ImportError, OutputFolderError) as error:
        print(f"hfexport fuzz: error: {str(error).replace(chr(10), ' ')}", file=sys.stderr)
        return 2
