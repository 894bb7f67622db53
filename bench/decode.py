"""Benchmark: quantized LLM decode per runtime, side by side with eager fp32 `generate` in one process.

    python bench/decode.py                                   # every runtime, fp32 + int8 + int4, caches 256 and 2048
    python bench/decode.py --runs onnx:fp32,onnx:int4-weights --caches 256 --markdown bench/DECODE.md

Each run (`format:scheme`, `fp32` meaning unquantized) is one subprocess: the random Llama of
`bench.py` (or `--model DIR`) exported with the export job (`export_to_folder(...,
generation=GenerationOptions(static_cache=N), quantize=scheme)`, the CLI's `hfexport export --generate --static-cache N
--quantize scheme`) for each cache length, then, in the same process:
  - decode tokens/s through `GenerationRunner.generate` (from the second new token on) and eager
    fp32 `generate` with a static cache of the same length, counted the same way;
  - time to first token for a 128-token prompt, both ways (the prefill);
  - the runner's per-step Python overhead (a step's time less the graph's own call);
  - artifact bytes and the share of the bandwidth ceiling: the artifact's weight bytes read once
    per token at this machine's measured copy bandwidth;
  - the accuracy gate's teacher-forced agreement and logits cosine against fp32 eager over 64
    steps (`generation.accuracy.greedy_agreement`).
Targets (issue 17, this 2-CPU machine): int4 decode >= 4x eager fp32 on ONNX Runtime, OpenVINO and
ExecuTorch; fp32 decode >= 0.7 of the bandwidth ceiling on ONNX Runtime and OpenVINO, 0.6 on
ExecuTorch; prefill at least as fast as eager. A miss is marked, never hidden.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import build_model, copy_bandwidth, decode_graph_ms, eager_generate_speed, print_and_write  # noqa: E402 - bench.py's pieces

#: The recipe each runtime deploys, by precision (the CLI's --quantize names).
SCHEMES = {
    "onnx": {"int8": "int8-dynamic", "int4": "int4-weights"},
    "openvino": {"int8": "int8-weights", "int4": "int4-weights"},
    "executorch": {"int8": "int8-dynamic", "int4": "int8-dynamic-int4-weights"},
    "dynamo": {"int8": "int8-dynamic"},
}
TARGET_INT4, TARGET_CEILING = 4.0, {"onnx": 0.7, "openvino": 0.7, "executorch": 0.6}
PROMPT_LEN, NEW_TOKENS = 128, 32


def default_runs() -> list[str]:
    """Every runtime at fp32 and each quantized precision it has."""
    return [f"{fmt}:{scheme}" for fmt, schemes in SCHEMES.items() for scheme in ("fp32", *schemes.values())]


def run_one(fmt: str, scheme: str, cache: int, source: str | None) -> dict:
    """One export and its measurements, in this (fresh) process."""
    import torch
    from transformers import GenerationConfig

    from hfexport import AutoExportConfig, GenerationRunner
    from hfexport.generation.accuracy import greedy_agreement
    from hfexport.job import GenerationOptions, JudgingOptions, export_to_folder

    model = build_model(source)
    weight_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    prompt = torch.randint(0, model.config.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    generation_config = GenerationConfig(cache_implementation="static", max_cache_len=cache)
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True})
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "export"
        start = time.perf_counter()
        result = export_to_folder((model, {"input_ids": prompt[:, :16]}), config, folder,
                                  generation=GenerationOptions(static_cache=cache),
                                  judging=JudgingOptions(validate=False), quantize=None if scheme == "fp32" else scheme)
        export_seconds = time.perf_counter() - start
        artifact_bytes = sum(entry["bytes"] for entry in result.manifest["components"].values())
        runner = GenerationRunner.load(folder)
        runs = [runner.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, eos_token_id=None)
                for _ in range(3)]
        rate = sorted(r.tokens_per_s for r in runs)[1]
        ttft = sorted(r.time_to_first_token_s for r in runs)[1]
        graph_ms = decode_graph_ms(runner, prompt)
        accuracy = greedy_agreement(folder, model, {"input_ids": prompt[:, :16]}, generation_config=generation_config)
    eager = eager_generate_speed(model, prompt, generation_config, NEW_TOKENS)
    bandwidth = copy_bandwidth()
    ceiling = bandwidth / artifact_bytes
    return {
        "format": fmt, "scheme": scheme, "cache": cache, "weight_bytes": weight_bytes,
        "artifact_bytes": artifact_bytes, "export_seconds": round(export_seconds, 1),
        "decode_tokens_per_s": round(rate, 1), "eager_tokens_per_s": eager["tokens_per_s"],
        "decode_speedup": round(rate / eager["tokens_per_s"], 2),
        "step_ms": round(1000 / rate, 2), "graph_ms": round(graph_ms, 2),
        "runner_overhead_ms": round(1000 / rate - graph_ms, 2),
        "ttft_ms": round(ttft * 1000, 1), "eager_ttft_ms": eager["ttft_ms"],
        "prefill_speedup": round(eager["ttft_ms"] / (ttft * 1000), 2),
        "ceiling_tokens_per_s": round(ceiling, 1), "ceiling_share": round(rate / ceiling, 2),
        "agreement": round(accuracy.agreement, 3), "min_cosine": round(accuracy.min_cosine, 4),
        "accuracy_tokens": accuracy.tokens,
    }




def _child(run: str, cache: int, source: str | None) -> dict:
    command = [sys.executable, __file__, "--one", run, "--caches", str(cache)] + (["--model", source] if source else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=5400)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        fmt, scheme = run.split(":")
        return {"format": fmt, "scheme": scheme, "cache": cache,
                "error": ((done.stderr.strip().splitlines() or ["no output"])[-1])[:300]}
    return json.loads(lines[-1])


def markdown(results: list[dict]) -> str:
    """The results as a Markdown table, misses marked."""
    rows = ["| runtime | scheme | cache | decode tok/s (eager fp32) | speedup (target) | step ms: graph + runner "
            "| share of bandwidth ceiling (target) | TTFT 128 tokens ms (eager) | artifact MB | agreement, min cosine "
            "| export s |", "|" + "---|" * 11]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['format']} | {r['scheme']} | {r['cache']} | error: {r['error']} |" + " |" * 7)
            continue
        int4 = "int4" in r["scheme"]
        speedup = f"{r['decode_speedup']}x" + (f" ({TARGET_INT4}x){' **miss**' if r['decode_speedup'] < TARGET_INT4 else ''}"
                                               if int4 and r["format"] != "dynamo" else "")
        target = TARGET_CEILING.get(r["format"]) if r["scheme"] == "fp32" else None
        share = f"{r['ceiling_share']} of {r['ceiling_tokens_per_s']}" + (
            f" ({target}){' **miss**' if r['ceiling_share'] < target else ''}" if target else "")
        prefill = f"{r['ttft_ms']} ({r['eager_ttft_ms']})" + (" **miss**" if r["prefill_speedup"] < 1 else "")
        rows.append(f"| {r['format']} | {r['scheme']} | {r['cache']} | {r['decode_tokens_per_s']} "
                    f"({r['eager_tokens_per_s']}) | {speedup} | {r['graph_ms']} + {r['runner_overhead_ms']} | {share} "
                    f"| {prefill} | {r['artifact_bytes'] / 1e6:.1f} | {r['agreement']}, {r['min_cosine']} "
                    f"| {r['export_seconds']} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    """Run the benchmark (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default=",".join(default_runs()), help="format:scheme,... (fp32 = unquantized)")
    parser.add_argument("--caches", default="256,2048", help="static cache lengths")
    parser.add_argument("--model", default=None, help="a local model folder (default: bench.py's random Llama)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    caches = [int(c) for c in args.caches.split(",")]
    if args.one:
        fmt, scheme = args.one.split(":")
        print(json.dumps(run_one(fmt, scheme, caches[0], args.model)))
        return
    results = []
    for run in args.runs.split(","):
        for cache in caches:
            results.append(_child(run, cache, args.model))
            print(json.dumps(results[-1]), flush=True)
    print_and_write(results, markdown(results), args.json, args.markdown)


if __name__ == "__main__":
    main()
