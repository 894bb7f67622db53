"""`hfexport verify DIR [--upgrade]`: check an export folder as `generate` and `chat` open it,
running nothing; `--upgrade` first records the hashes an older manifest lacks (or writes a
version-3 manifest's runtime package as version 4's one entry)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["NAME", "register", "run"]

NAME = "verify"


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `hfexport verify` and its arguments to the command line's `subparsers`."""
    parser = subparsers.add_parser(NAME, help="check an export folder as generate and chat open it (its manifest, "
                                   "every file's SHA-256, the files its models name), running nothing")
    parser.add_argument("export_dir", help="the folder `hfexport export -o DIR` wrote")
    parser.add_argument("--upgrade", action="store_true",
                        help="for a folder written by hfexport 0.3 or older (manifest version 1-2, no hashes): "
                        "record the SHA-256 of the files it holds now, then check it. Only on a copy you trust: "
                        "the hashes prove the files stay as they are now, not that they are what was exported. "
                        "For one written by hfexport 0.4 (version 3, which opens as it is): rewrite its runtime "
                        "package as version 4's one entry")
    return parser


def run(args) -> int:
    """Open `args.export_dir` as `generate` does (`GenerationExport.load`: every check, every
    component loaded into its runtime; the config, tokenizer and processor read; nothing run) and
    print what was checked; exit 0, or 2 with the refusal."""
    from pathlib import Path

    from ..folder.generation_export import GenerationExport
    from ..folder.manifest import MANIFEST_VERSION, read_manifest, upgrade_manifest

    folder = Path(args.export_dir)
    if args.upgrade:
        upgraded = upgrade_manifest(folder)
        what = ("its runtime package written as one entry" if upgraded == 3
                else "the hashes of the files it holds now recorded")
        print(f"{folder}: manifest.json upgraded from version {upgraded} to {MANIFEST_VERSION}, {what}" if upgraded
              else f"{folder}: manifest.json is already version {MANIFEST_VERSION}; nothing upgraded")
    loaded = GenerationExport.load(folder)
    read = [what for what, value in (("config", loaded.config), ("tokenizer", loaded.tokenizer)) if value is not None]
    if loaded.has_processor:
        loaded.load_processor()
        read.append("processor")
    files = read_manifest(folder, verify=False)["files"]
    size = sum(entry["bytes"] for entry in files.values())
    print(f"{folder}: an hfexport {loaded.format} export; {len(files)} files ({size / 1e6:,.1f} MB), each the bytes "
          f"its manifest records; components {', '.join(loaded.components)} opened in their runtime"
          + (f"; {', '.join(read)} read by transformers, no code of the folder's run" if read else ""))
    return 0
