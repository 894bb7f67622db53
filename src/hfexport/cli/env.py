"""`hfexport env`: installed backends, their versions, and drift from the tested set."""

from __future__ import annotations

import platform
import sys

from .._versions import EXTRAS, TESTED_VERSIONS, package_status


def run(args) -> int:
    """Print the installed backends and versions against the tested set; always 0."""
    print(f"hfexport {__import__('hfexport').__version__}  python {platform.python_version()}  {sys.platform}")
    print(f"{'package':<14} {'installed':<16} {'tested':<12} status")
    for name in TESTED_VERSIONS:
        status = package_status(name)
        state = "missing" if not status.is_installed else ("DRIFT" if status.has_drift else "ok")
        print(f"{name:<14} {status.installed or '-':<16} {status.tested:<12} {state}")
    print()
    for extra, names in EXTRAS.items():
        if extra == "dynamo":
            continue
        missing = [n for n in names if not package_status(n).is_installed]
        verdict = "available" if not missing else f'missing {", ".join(missing)}: pip install "hfexport[{extra}]"'
        what = "extra  " if extra in ("ray", "gguf") else "backend"  # ray runs cells elsewhere, gguf reads input
        print(f"{what} {extra:<13} {verdict}")
    return 0
