"""The arguments more than one subcommand takes, each added in one place: the engine and the hash
check of `generate` and `chat`, the Ray options of `coverage` and `export-many`."""

from __future__ import annotations

import argparse

__all__ = ["add_engine", "add_no_verify", "add_ray_arguments"]


def add_engine(parser: argparse.ArgumentParser) -> None:
    """`--engine`: what generates (`generate`, `chat`)."""
    parser.add_argument("--engine", choices=("auto", "runtime", "hfexport"), default="auto",
                        help="what generates: auto (default) the runtime's own engine (og.Generator, LLMPipeline, "
                        "TextLLMRunner) on a runtime's LLM package where it is installed and runs the options given, "
                        "else hfexport's loop; runtime: the engine or exit 2 saying why not; hfexport: hfexport's loop")


def add_no_verify(parser: argparse.ArgumentParser) -> None:
    """`--no-verify`: skip the hashes of the folder opened (`generate`, `chat`)."""
    parser.add_argument("--no-verify", action="store_true",
                        help="skip the SHA-256 check of every file the folder's manifest lists (about a second per "
                        "GB; for a folder you wrote or trust): its paths are still confined to the folder")


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """`--ray`, `--ray-address`: where the cells run (`coverage`, `export-many`)."""
    parser.add_argument("--ray", action="store_true",
                        help='run each cell as a Ray task (pip install "hfexport[ray]"): on the cluster of '
                        "RAY_ADDRESS, or a local instance")
    parser.add_argument("--ray-address", metavar="ADDR",
                        help="the Ray cluster to join (auto, HOST:6379; implies --ray)")
