"""The cyclic garbage collector's share of an `hfexport export`, at Python's thresholds and at the
export's (`hfexport.timing.fewer_collections`), rounds alternating, each export in a fresh process.

    python bench/gc_share.py MODEL_DIR [--format onnx] [--rounds 3]

Each row: the command's wall seconds (`hfexport.cli.main.main`, imports included; not the process's
exit, which `entry` prepares with one collection of its own), the collections made and the seconds
spent in them (`gc.callbacks`), of which the full ones (generation 2, a walk of the whole heap),
and the peak RSS. "python default" runs the same code with `EXPORT_GC_YOUNG` set to 700, Python's
own threshold, so that `fewer_collections` raises nothing. Results: bench/RESULTS.md, "The
collector's share of an export".
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: the young threshold a row runs at: Python's default (nothing raised), and the export's own
SETTINGS = {"python default": 700, "hfexport": None}


def child(young: int | None, argv: list[str], result: Path) -> None:
    """(In the child process.) Run `hfexport <argv>` with the collector timed; write the row to `result`."""
    import hfexport.timing as timing

    if young is not None:
        timing.EXPORT_GC_YOUNG = young
    spent: list[tuple[int, float]] = []
    started: list[float] = []

    def watch(stage: str, info: dict) -> None:
        if stage == "start":
            started.append(time.perf_counter())
        elif started:
            spent.append((info["generation"], time.perf_counter() - started.pop()))

    gc.callbacks.append(watch)
    start = time.perf_counter()
    from hfexport.cli.main import main as command  # the command, not `entry`'s collection before the exit

    code = command(argv)
    full = [seconds for generation, seconds in spent if generation == 2]
    result.write_text(json.dumps({
        "rc": code, "wall": round(time.perf_counter() - start, 2), "collections": len(spent),
        "gc_seconds": round(sum(seconds for _, seconds in spent), 3), "full_walks": len(full),
        "full_seconds": round(sum(full), 3),
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "young_threshold": timing.EXPORT_GC_YOUNG}))


def main() -> None:
    if sys.argv[1:2] == ["--child"]:  # --child YOUNG RESULT hfexport-arguments...
        young, result, *argv = sys.argv[2:]
        child(None if young == "hfexport" else int(young), argv, Path(result))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model folder (a random Llama: bench/export_vs_vendor.py makes them)")
    parser.add_argument("--format", default="onnx")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="gc-share-"))  # the exports, removed at the end
    try:
        rows = []
        for round_ in range(args.rounds):
            for label, young in SETTINGS.items():
                target = out / f"{args.format}-{round_}"
                shutil.rmtree(target, ignore_errors=True)
                result = out / "row.json"
                result.unlink(missing_ok=True)  # a child that dies before writing its row leaves none
                env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
                subprocess.run([sys.executable, __file__, "--child", str(young or "hfexport"), str(result),
                                "export", args.model, "-f", args.format, "-o", str(target)],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
                if not result.exists():
                    raise SystemExit(f"the {label} export wrote no row: run it by hand to see why")
                row = {"round": round_, "setting": label, **json.loads(result.read_text())}
                if row["rc"] != 0:
                    raise SystemExit(f"the export failed (exit {row['rc']}): {json.dumps(row)}")
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print("| round | thresholds | wall s | collections | collector s | full walks | their s | peak MB |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['round']} | {row['setting']} (young {row['young_threshold']}) | {row['wall']} | "
              f"{row['collections']} | {row['gc_seconds']} | {row['full_walks']} | {row['full_seconds']} | "
              f"{row['peak_mb']} |")


if __name__ == "__main__":
    main()
