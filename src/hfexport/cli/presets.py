"""`hfexport presets`: the tiny random models `hfexport export tiny:NAME` builds offline."""

from __future__ import annotations

import argparse
from typing import Any

NAME = "presets"


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `hfexport presets` (no arguments) to the command line's `subparsers`."""
    return subparsers.add_parser(NAME, help="list the tiny random models `export tiny:NAME` builds offline")


def run(args) -> int:
    """Print one line per preset: its `tiny:` name, kind, model class, and `--generate` where it applies; always 0."""
    from ..presets import PRESETS

    width = max(len(name) for name in PRESETS) + len("tiny:")
    kind_width = max(len(preset.kind) for preset in PRESETS.values())
    class_width = max(len(preset.model_class) for preset in PRESETS.values())
    for name, preset in PRESETS.items():
        line = f"{'tiny:' + name:<{width}}  {preset.kind:<{kind_width}}  {preset.model_class:<{class_width}}"
        print(f"{line}  --generate" if preset.generative else line.rstrip())
    return 0
