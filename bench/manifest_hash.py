"""Benchmark: what checking every file of an export folder costs (issue 39).

    python bench/manifest_hash.py              # a 1 GiB weights file
    python bench/manifest_hash.py --gib 4

A folder like an export's is written to a scratch folder beside this machine's temporary files: a
weights file of `--gib` GiB of random bytes and a small graph and config. Measured side by side in
one run, each three times (median), with the file in the page cache (as right after an export or
a copy; a cold read is the disk's speed whatever is done with the bytes):
  - `write_manifest`: what saving adds (every file's size and full SHA-256);
  - `read_manifest(verify=True)`: what opening adds by default (`GenerationRunner.load`);
  - `read_manifest(verify=False)`: the paths and the shape only (`--no-verify`);
  - reading the same bytes with nothing done to them (the floor of any full check).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from hfexport.folder.manifest import read_manifest, write_manifest  # noqa: E402


def _median_seconds(work, runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _read_all(path: Path) -> None:
    with open(path, "rb") as stream:
        while stream.read(1 << 24):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the weights file (default 1)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="hfexport-hash-bench-"))
    try:
        weights = folder / "decode.onnx.data"
        with open(weights, "wb") as stream:
            for _ in range(int(args.gib * 64)):
                stream.write(os.urandom(1 << 24))
        (folder / "decode.onnx").write_bytes(os.urandom(1 << 20))
        (folder / "config.json").write_text("{}")
        manifest = {"kind": "generation", "format": "onnx",
                    "components": {"decode": {"files": ["decode.onnx", "decode.onnx.data"], "inputs": [],
                                              "outputs": []}}}
        _read_all(weights)  # in the page cache for every row
        size = sum(p.stat().st_size for p in folder.iterdir()) / 2**30
        rows = {
            "read the bytes, nothing else": _median_seconds(lambda: _read_all(weights)),
            "write_manifest (save)": _median_seconds(lambda: write_manifest(folder, manifest)),
            "read_manifest, verify=True (load, default)": _median_seconds(lambda: read_manifest(folder)),
            "read_manifest, verify=False (--no-verify)": _median_seconds(lambda: read_manifest(folder, verify=False)),
        }
        print(f"folder of {size:.2f} GiB, file in the page cache, median of 3, {os.cpu_count()} CPUs")
        print("| step | seconds | GiB/s |\n| --- | --- | --- |")
        for label, seconds in rows.items():
            print(f"| {label} | {seconds:.3f} | {size / seconds:.2f} |")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
