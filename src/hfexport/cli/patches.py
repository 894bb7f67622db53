"""`hfexport patches`: every registered patch and FX fix, with why it exists and when it can go."""

from __future__ import annotations

import argparse
from typing import Any

NAME = "patches"


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `hfexport patches` and its arguments to the command line's `subparsers`."""
    from ..extensions import format_names

    formats = format_names()
    parser = subparsers.add_parser(NAME, help="list registered patches and FX fixes")
    parser.add_argument("--format", "-f", choices=formats, metavar="FORMAT",
                        help="only those of this export format: %(choices)s")
    parser.add_argument("--backend", dest="format", choices=formats, help=argparse.SUPPRESS)  # its name before 0.2
    return parser


def run(args) -> int:
    """List the workarounds (those of `args.format` only when given); always 0."""
    from ..builtins import load_workarounds
    from ..workarounds import FX_NODE_FIXES, FX_PROGRAM_FIXES, PATCHES

    load_workarounds()
    entries = [("patch", p) for p in PATCHES.values()]
    entries += [("fx program fix", f) for f in FX_PROGRAM_FIXES.values()]
    entries += [("fx node fix", f) for f in FX_NODE_FIXES.values()]
    if args.format:
        entries = [(k, e) for k, e in entries if args.format in e.formats]
    if not entries:
        print("no patches or fixes registered" + (f" for {args.format}" if args.format else ""))
        return 0
    for kind, entry in sorted(entries, key=lambda item: (item[1].formats, item[1].name)):
        stage = getattr(entry, "stage", "export")
        print(f"{entry.name}  [{kind}; {', '.join(entry.formats)}{'; while quantizing' if stage == 'quantize' else ''}]")
        targets = getattr(entry, "targets", None)
        if targets:
            print(f"    targets:     {', '.join(targets)}")
        print(f"    why:         {entry.reason}")
        if entry.upstream:
            print(f"    upstream:    {entry.upstream}")
        if entry.seen_with:
            print(f"    seen with:   {', '.join(f'{k} {v}' for k, v in entry.seen_with.items())}")
        if entry.remove_when:
            due = " (met by the installed versions: try without it)" if entry.is_due_for_removal else ""
            print(f"    remove when: {entry.remove_when}{due}")
        if getattr(entry, "is_available", True) is False:
            print("    inactive:    its package is not installed")
    return 0
