"""`hfexport fuzz`: the differential fuzzer (`hfexport.fuzz`): random tiny decoders exported with
dynamic shapes, run in their runtime and compared with eager; exit 1 when a failure was found."""

from __future__ import annotations


def run(args) -> int:
    """Run `hfexport fuzz` with the parsed `args` (see `hfexport.fuzz`)."""
    from .. import fuzz

    return fuzz.run(args)
