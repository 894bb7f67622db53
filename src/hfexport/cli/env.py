"""`hfexport env`: installed backends, their versions, and drift from the tested set."""

from __future__ import annotations

import argparse
import platform
import sys
from typing import Any

from .._versions import EXTRAS, TESTED_VERSIONS, package_status

NAME = "env"


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `hfexport env` (no arguments) to the command line's `subparsers`."""
    return subparsers.add_parser(NAME, help="installed backends, versions, drift from the tested set")


def run(args) -> int:
    """Print the installed backends and versions against the tested set; always 0."""
    print(f"hfexport {__import__('hfexport').__version__}  python {platform.python_version()}  {sys.platform}")
    rows = [("package", "installed", "tested", "status")]
    for name in TESTED_VERSIONS:
        status = package_status(name)
        state = "missing" if not status.is_installed else ("DRIFT" if status.has_drift else "ok")
        rows.append((name, status.installed or "-", status.tested, state))
    _print_columns(rows)
    print()
    extras = []
    for extra, names in EXTRAS.items():
        if extra == "dynamo":
            continue
        missing = [n for n in names if not package_status(n).is_installed]
        verdict = "available" if not missing else f'missing {", ".join(missing)}: pip install "hfexport[{extra}]"'
        what = "extra" if extra in ("ray", "gguf") else "backend"  # ray runs cells elsewhere, gguf reads input
        extras.append((what, extra, verdict))
    _print_columns(extras)
    return 0


def _print_columns(rows: list[tuple[str, ...]]) -> None:
    """`rows` in columns as wide as their widest cell, two spaces apart (the last column as it is)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join([*(cell.ljust(width) for cell, width in zip(row, widths)), row[-1]]))
