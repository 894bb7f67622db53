"""ExecuTorch's IR checks in a lowering: a tiny preset's ExecuTorch export with ExecuTorch's own
edge checks on (its default `EdgeCompileConfig`, every graph the lowering builds re-checked) and as
hfexport lowers (checks off, the dtype check once: `backends/executorch/edge_check.py`), rounds
alternating in one process.

    python bench/executorch_edge_checks.py [--presets llama,whisper] [--rounds 3]

Each row: `ExecutorchExporter().export(model, inputs, ExecutorchConfig(dynamic=True))` in seconds,
validation off. Results: bench/RESULTS.md, "ExecuTorch's IR checks once per lowering".
"""

from __future__ import annotations

import argparse
import statistics
import time

import executorch.exir as exir

from hfexport import ExecutorchConfig, ExecutorchExporter
from hfexport.presets import build_preset


def _lowering_with_checks(on: bool):
    """`to_edge_transform_and_lower` with ExecuTorch's IR checks `on`, everything else as hfexport asks."""
    lower = exir.to_edge_transform_and_lower

    def lowered(*args, **kwargs):
        kwargs["compile_config"] = exir.EdgeCompileConfig(_check_ir_validity=on)
        return lower(*args, **kwargs)

    return lowered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="llama,whisper")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    lower = exir.to_edge_transform_and_lower
    for preset in args.presets.split(","):
        model, inputs = build_preset(preset)
        seconds: dict[str, list[float]] = {"checks on": [], "checks once": []}
        for _ in range(args.rounds):
            for row, on in (("checks on", True), ("checks once", False)):
                exir.to_edge_transform_and_lower = _lowering_with_checks(on)  # exporter.py imports it per call
                start = time.perf_counter()
                ExecutorchExporter().export(model, inputs, ExecutorchConfig(dynamic=True))
                seconds[row].append(round(time.perf_counter() - start, 1))
        exir.to_edge_transform_and_lower = lower
        print(preset, {row: (values, statistics.median(values)) for row, values in seconds.items()}, flush=True)


if __name__ == "__main__":
    main()
