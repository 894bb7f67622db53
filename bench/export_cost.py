"""Benchmark: what an export costs (seconds, peak memory, where the time goes).

    python bench/export_cost.py                                  # onnx, openvino, executorch
    python bench/export_cost.py --backends executorch --runs hfexport,hfexport-external
    python bench/export_cost.py --markdown bench/EXPORT_COST.md --json bench/export_cost.json

Each run (`tool:backend`) is one subprocess, so its peak memory is that export's alone: the random
Llama of `bench.py` (134 MB of fp32 weights, or `--model DIR`) is built, the process's RSS is
sampled every 5 ms from then on (the backend's libraries imported before, `_BACKEND_MODULES`), and
one dynamic single-graph export is made and saved:
  - `hfexport`: the export job, `export_to_folder(..., judging=JudgingOptions(validate=False))`
    (capture, conversion, fusions, save), its seconds split by stage (`record.details["stage_seconds"]`, the report's
    `job_seconds`), then validation timed on its own, after the export (`hfexport.utils.validate`,
    what the job adds by default, kept apart so the export columns compare exports alone);
  - `hfexport-external`: the same with the weights outside the program (`external_data=True` on
    ONNX, `external_weights=True` on ExecuTorch; OpenVINO's `.bin` always is);
Columns: export seconds, peak RSS growth over the weight bytes and the anonymous part of it (what
no file backs: a model loaded with `from_pretrained` maps its safetensors, so its pages are the
file's, read when touched and dropped under pressure), the stages, and validation's seconds and
anonymous peak (over the same baseline as the export's: the artifact is still in memory).
Targets (issue 18, this 2-CPU machine): peak growth <= 1.2x the weights on every backend; export
time <= 0.7x the reference's. Nothing in this repository imports the reference
(`transformers.exporters`, a competitor): its seconds are measured with its own documented calls
outside the repository and compared in `bench/RESULTS.md`. A miss is marked, never hidden.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import _rss_bytes, build_model, print_and_write  # noqa: E402 - bench.py's pieces

BACKENDS = ("onnx", "openvino", "executorch")
TOOLS = ("hfexport", "hfexport-external")
TARGET_MEMORY = 1.2


def _anonymous_bytes() -> int:
    """This process's resident memory that no file backs (RSS less its mapped file pages): what an
    export needs, beside the weights' pages mapped from a checkpoint or an artifact, which the
    kernel can drop and read again."""
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")


class _PeakRss:
    """The highest RSS, and the highest anonymous part, of this process while active, sampled every
    5 ms on a thread."""

    def __init__(self) -> None:
        self.peak = _rss_bytes()
        self.peak_anonymous = _anonymous_bytes()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, _rss_bytes())
            self.peak_anonymous = max(self.peak_anonymous, _anonymous_bytes())

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())
        self.peak_anonymous = max(self.peak_anonymous, _anonymous_bytes())


#: What each backend's export imports: imported before the baseline, so the growth measured is the
#: export's own. Importing them costs a fixed ~100 MB (torch.onnx, onnxscript and onnx's reference
#: ops; openvino; executorch), which on the 134 MB Llama alone read as 0.7x of the weights.
_BACKEND_MODULES = {"onnx": ("torch.onnx", "onnxscript", "onnxscript.rewriter.ort_fusions", "onnxruntime",
                             "onnx.reference"),
                    "openvino": ("openvino", "openvino.frontend.pytorch"),
                    "executorch": ("executorch.exir", "executorch.backends.xnnpack.partition.xnnpack_partitioner",
                                   "executorch.runtime")}


def _import_backend(backend: str) -> None:
    import importlib

    import hfexport.auto  # noqa: F401 - hfexport's own modules

    for module in _BACKEND_MODULES[backend]:
        importlib.import_module(module)


def run_one(tool: str, backend: str, source: str | None) -> dict:
    """One export and its measurements, in this (fresh) process."""
    import gc

    import torch

    model = build_model(source)
    inputs = {"input_ids": torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))}
    weight_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    _import_backend(backend)
    gc.collect()
    baseline, baseline_anonymous = _rss_bytes(), _anonymous_bytes()
    result = {"tool": tool, "format": backend, "weight_bytes": weight_bytes}
    with tempfile.TemporaryDirectory() as tmp, _PeakRss() as rss:
        start = time.perf_counter()
        from hfexport import AutoExportConfig
        from hfexport.job import JudgingOptions, export_to_folder

        options = {"export_format": backend, "dynamic": True}
        if tool == "hfexport-external":
            options.update({"onnx": {"external_data": True}, "executorch": {"external_weights": True}}.get(backend, {}))
        job = export_to_folder((model, inputs), AutoExportConfig.from_dict(options), Path(tmp) / "export",
                               judging=JudgingOptions(validate=False))
        stages = job.report["components"]["model"]["record"].get("stage_seconds", {})
        result["stages"] = {**stages, "job": job.report.get("job_seconds", {})}
        result["artifact_files"] = job.manifest["components"]["model"]["files"]
        result["export_seconds"] = round(time.perf_counter() - start, 2)
    result["peak_growth"] = round((rss.peak - baseline) / weight_bytes, 2)
    result["peak_anonymous_growth"] = round((rss.peak_anonymous - baseline_anonymous) / weight_bytes, 2)
    from hfexport.utils import validate

    start = time.perf_counter()
    with _PeakRss() as rss:
        result["validation_passed"] = validate(job.artifacts["model"], model, inputs).passed
    result["validate_seconds"] = round(time.perf_counter() - start, 2)
    result["validate_peak_anonymous_growth"] = round((rss.peak_anonymous - baseline_anonymous) / weight_bytes, 2)
    return result


def _child(run: str, source: str | None) -> dict:
    command = [sys.executable, __file__, "--one", run] + (["--model", source] if source else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tool, backend = run.split(":")
        return {"tool": tool, "format": backend, "error": ((done.stderr.strip().splitlines() or ["no output"])[-1])[:300]}
    return json.loads(lines[-1])


def markdown(results: list[dict]) -> str:
    """The results as a Markdown table, misses marked."""
    rows = [f"| backend | tool | export s | peak RSS growth / weights (target <= {TARGET_MEMORY}) "
            "| of it anonymous | stages s | validation s | validation's peak anonymous |",
            "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['format']} | {r['tool']} | error: {r['error']} | | | | | |")
            continue
        memory = f"{r['peak_growth']}{' **miss**' if r['peak_growth'] > TARGET_MEMORY else ''}"
        stages = ", ".join(f"{k} {v}" for k, v in r.get("stages", {}).items() if k != "job")
        validation = f"{r['validate_seconds']} ({'passed' if r['validation_passed'] else 'FAILED'})"
        rows.append(f"| {r['format']} | {r['tool']} | {r['export_seconds']} | {memory} "
                    f"| {r.get('peak_anonymous_growth', '')} | {stages} | {validation} "
                    f"| {r.get('validate_peak_anonymous_growth', '')} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--runs", default=",".join(TOOLS), help="tools to run: " + ", ".join(TOOLS))
    parser.add_argument("--model", default=None, help="a local model folder (default: bench.py's random Llama)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        tool, backend = args.one.split(":")
        print(json.dumps(run_one(tool, backend, args.model)))
        return
    results = []
    for backend in args.backends.split(","):
        for tool in args.runs.split(","):
            if tool == "hfexport-external" and backend == "openvino":
                continue  # OpenVINO's weights are always their own .bin
            results.append(_child(f"{tool}:{backend}", args.model))
            print(json.dumps(results[-1]), flush=True)
    print_and_write(results, markdown(results), args.json, args.markdown)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
