"""Benchmark: where an export's time goes, per format, a tiny and an 8-layer Llama side by side.

    python bench/export_time.py                                   # every format, both models
    python bench/export_time.py --formats onnx --markdown out.md
    python bench/export_time.py --formats executorch --without patch_xnnpack_idle_passes --rounds 2

Each export is the export job (`export_to_folder`, a dynamic single graph, validated), run once in
this process one after the other; its report's `timing` (`hfexport.timing`: seconds per phase,
summed over the components) is printed beside the job's wall time, and the rest of the wall time
(loading the model, preparing, everything outside a named phase) as `other`. Models: the
`tiny:llama` preset and a random Llama of vocabulary 8192, hidden 512, 8 layers (8 heads, 4 kv
heads), built with a fixed seed. One run: these are where the time goes, not a timing to the
tenth of a second.

`--without PATCH`: what one registered patch saves, as a user meets it. The CLI's export of
`bench/runner_vs_vendor.py`'s random Llama folder (vocabulary 8192, hidden 512, 8 layers: an LLM
package, validated), each in a fresh process, with the patch and without it (taken out of the
registry), alternating for `--rounds`; wall seconds of the process, the report's phases, and
whether the two artifacts are the same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FORMATS = ("dynamo", "onnx", "executorch", "openvino")


def eight_layer_llama():
    """`(model, inputs)`: the random 8-layer Llama of this benchmark."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    inputs = {"input_ids": torch.randint(0, 8192, (1, 16)), "attention_mask": torch.ones(1, 16, dtype=torch.long)}
    return model, inputs


def export_row(fmt: str, name: str, model, out: Path) -> dict:
    """One export's wall time and phases."""
    from hfexport import AutoExportConfig
    from hfexport.job import export_to_folder
    from hfexport.timing import PHASES

    start = time.perf_counter()
    result = export_to_folder(model, AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True}), out)
    wall = time.perf_counter() - start
    timing = result.report["timing"]
    phases = {p: round(sum(own.get(p, 0.0) for own in timing.values()), 2) for p in PHASES}
    return {"format": fmt, "model": name, "wall": round(wall, 2), **phases,
            "other": round(wall - sum(phases.values()), 2), "job_seconds": result.report["job_seconds"]}


def patch_child(fmt: str, patch: str, on: bool, out: Path) -> None:
    """One CLI export of the random Llama folder in this (fresh) process, `patch` in or out."""
    start = time.perf_counter()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from runner_vs_vendor import source_folder

    from hfexport.cli.main import main
    from hfexport.builtins import load_workarounds
    from hfexport.workarounds import PATCHES

    load_workarounds(fmt)
    if not on:
        PATCHES.remove(patch)
    code = main(["export", str(source_folder(out.parent)), "-f", fmt, "-o", str(out), "--overwrite"])
    timing = json.loads((out / "report.json").read_text())["timing"]
    print(json.dumps({"code": code, "wall": round(time.perf_counter() - start, 1), "timing": timing}))


def patch_rows(formats: list[str], patch: str, rounds: int, root: Path) -> list[dict]:
    """`--without PATCH`: fresh-process exports with and without `patch`, alternating."""
    rows = []
    for fmt in formats:
        for round_ in range(rounds):
            for on in (False, True):
                out = root / f"{fmt}-{'with' if on else 'without'}"
                done = subprocess.run([sys.executable, __file__, "--child", fmt, patch, "on" if on else "off", str(out)],
                                      capture_output=True, text=True)
                result = json.loads(done.stdout.strip().splitlines()[-1])
                own = next(iter(result["timing"].values()))
                rows.append({"format": fmt, "round": round_ + 1, "patch": "with" if on else "without",
                             "wall": result["wall"], **{k: own.get(k, 0.0) for k in ("trace", "convert", "validate")},
                             "load": round(os.getloadavg()[0], 1)})
                print(rows[-1], flush=True)
        artifacts = [sorted(p.name for p in (root / f"{fmt}-{v}").iterdir()) for v in ("with", "without")]
        same = artifacts[0] == artifacts[1] and all(
            (root / f"{fmt}-with" / name).read_bytes() == (root / f"{fmt}-without" / name).read_bytes()
            for name in artifacts[0] if name.endswith((".pte", ".ptd", ".onnx", ".data", ".xml", ".bin", ".pt2")))
        print(f"{fmt}: the artifacts with and without {patch} are {'the same bytes' if same else 'DIFFERENT'}")
    return rows


def markdown(rows: list[dict]) -> str:
    from hfexport.timing import PHASES

    head = ["format", "model", "wall", *PHASES, "other"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(str(row[k]) for k in head) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--without", metavar="PATCH", help="compare fresh-process CLI exports with and without PATCH")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "hfexport-export-time")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        fmt, patch, on, out = args.child
        return patch_child(fmt, patch, on == "on", Path(out))
    if args.without:
        rows = patch_rows(args.formats.split(","), args.without, args.rounds, args.root)
        head = list(rows[0])
        print("\n".join(["| " + " | ".join(head) + " |", "|" + " --- |" * len(head),
                         *("| " + " | ".join(str(row[k]) for k in head) + " |" for row in rows)]))
        return None
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for fmt in args.formats.split(","):
            for name, model in (("tiny:llama", "tiny:llama"), ("llama 8 layers", eight_layer_llama())):
                rows.append(export_row(fmt, name, model, Path(scratch) / f"{fmt}-{len(rows)}"))
                print(rows[-1], flush=True)
    table = markdown(rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")


if __name__ == "__main__":
    main()
