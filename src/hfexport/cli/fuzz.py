"""`hfexport fuzz`: the differential fuzzer (`hfexport.fuzz`): random tiny decoders exported with
dynamic shapes, run in their runtime and compared with eager; exit 1 when a failure was found."""

from __future__ import annotations

import argparse
from typing import Any

NAME = "fuzz"


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `hfexport fuzz` and its arguments to the command line's `subparsers`."""
    from ..fuzz import add_arguments as add_fuzz_arguments

    parser = subparsers.add_parser(NAME, help="draw random tiny decoders, export them dynamic to each backend, compare "
                                   "with eager; print a shrunk reproduction of each failure")
    add_fuzz_arguments(parser)
    return parser


def run(args) -> int:
    """Run `hfexport fuzz` with the parsed `args` (see `hfexport.fuzz`)."""
    from .. import fuzz

    return fuzz.run(args)
