"""Benchmark: export cost and runtime speed per backend, against eager PyTorch in the same process.

    python bench/bench.py                         # a ~40M-parameter random Llama, every backend
    python bench/bench.py --backends onnx,openvino --model path/to/local/folder --repeats 10
    python bench/bench.py --json bench/results.json --markdown bench/RESULTS.md

Per backend, each in its own subprocess (so peak memory is that export's alone):
  - export seconds and peak RSS growth during export, over the model's weight bytes;
  - artifact bytes over weight bytes (fp32, unquantized);
  - forward latency at batch 1 x 128 tokens, median of --repeats runs, and eager's in the same process;
  - the forward's distance to the compute ceiling: its matmul FLOPs (2 x tokens x the Linear
    weights) over this machine's measured fp32 matmul rate, the least time any fp32 runtime can take;
  - decode tokens/s through the static-cache `decode` graph (multi-token decode, the prompt then
    one token per call, driven by `GenerationRunner`) against eager `generate` with a static cache,
    both counted from the second new token (the prefill is the first), and where a step's time goes:
    the decode graph's own call on a prepared feed, the runner's Python around it, and eager's
    one-token forward with a StaticCache (what `generate` spends most of a step in);
  - each decode rate as a fraction of the memory-bandwidth ceiling (weight bytes read per token
    over this machine's measured copy bandwidth).
Targets (issue 8) are printed next to each ratio; a miss is marked, not hidden. No test asserts
on these numbers: they are measurements.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BACKENDS = ("dynamo", "onnx", "openvino", "executorch")
TARGET_FORWARD = {"onnx": 2.0, "openvino": 2.0, "executorch": 1.5, "dynamo": 1.0}
TARGET_DECODE = {"onnx": 2.5, "openvino": 2.5, "executorch": 1.5, "dynamo": 1.0}
PROMPT_LEN, NEW_TOKENS, MAX_CACHE_LEN = 16, 32, 64


def build_model(source: str | None):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if source:
        return AutoModelForCausalLM.from_pretrained(source, attn_implementation="sdpa").eval()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def eager_generate_speed(model, prompt, generation_config, new_tokens: int, repeats: int = 3) -> dict:
    """Eager fp32 `generate` with `generation_config`'s cache: decode tokens/s from the second new
    token on (as `GenerationRunner` counts) and the time to the first token, medians of `repeats`."""
    import copy

    import torch

    def seconds(count: int) -> float:
        config = copy.deepcopy(generation_config)
        config.update(max_new_tokens=count, min_new_tokens=count, do_sample=False)
        with torch.inference_mode():
            return _median_seconds(lambda: model.generate(prompt, generation_config=config), repeats)

    first = seconds(1)
    return {"tokens_per_s": round((new_tokens - 1) / (seconds(new_tokens) - first), 1), "ttft_ms": round(first * 1000, 1)}


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_rate() -> float:
    """fp32 FLOP/s of a large matrix product on this machine (PyTorch's GEMM, all threads)."""
    import torch

    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    return 2 * 1024**3 / _median_seconds(lambda: a @ b, 10)


def copy_bandwidth() -> float:
    """Bytes per second of a large tensor copy (read + write counted once each)."""
    import torch

    src = torch.empty(64 * 1024 * 1024 // 4)
    dst = torch.empty_like(src)
    seconds = _median_seconds(lambda: dst.copy_(src), 5)
    return 2 * src.numel() * 4 / seconds


def run_one(backend: str, source: str | None, repeats: int) -> dict:
    """Everything for one backend, in this (fresh) process."""
    import torch
    from transformers import GenerationConfig

    from hfexport import AutoExportConfig, AutoHfExporter, FolderContents, GenerationRunner, record_of, save_folder
    from hfexport.runner import runner_for

    model = build_model(source)
    weight_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    linear_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    generator = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    inputs = {"input_ids": torch.randint(0, vocab, (1, 128), generator=generator),
              "attention_mask": torch.ones(1, 128, dtype=torch.long)}
    config = AutoExportConfig.from_dict({"export_format": backend, "dynamic": True})
    exporter = AutoHfExporter.from_config(config)

    before = _rss_bytes()
    start = time.perf_counter()
    artifact = exporter.export(model, inputs, config=config)
    export_seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    record = record_of(artifact)
    with tempfile.TemporaryDirectory() as tmp:
        files = exporter.save(artifact, tmp, name="model")
        artifact_bytes = sum(Path(f).stat().st_size for f in files)
        # the saved files, as a user runs them (an ONNX program still in memory is opened with
        # ONNX Runtime's prepacking off, to keep its weights mapped: not what a deployment runs)
        runner = runner_for(exporter.load(files), record)
        feed = record.artifact_inputs(inputs)
        with torch.inference_mode():
            eager_forward = _median_seconds(lambda: model(**inputs), repeats)
        artifact_forward = _median_seconds(lambda: runner.run(feed), repeats)
        precision = runner.precision
        del runner, artifact

    generation_config = GenerationConfig(cache_implementation="static", max_cache_len=MAX_CACHE_LEN)
    prompt = inputs["input_ids"][:, :PROMPT_LEN]
    components = exporter.export_for_generation(model, {"input_ids": prompt}, config=config,
                                                generation_config=generation_config, multi_token_decode=True)
    with tempfile.TemporaryDirectory() as tmp:
        save_folder(exporter, components, Path(tmp) / "export",
                    FolderContents("generation", model=model, generation_config=generation_config))
        generation = GenerationRunner.load(Path(tmp) / "export")
        rates = [generation.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS).tokens_per_s
                 for _ in range(max(1, repeats // 2))]
        graph_ms = decode_graph_ms(generation, prompt)
    eager = eager_decode(model, prompt, generation_config, repeats)
    return {
        "backend": backend,
        "precision": precision,
        "weight_bytes": weight_bytes,
        "export_seconds": round(export_seconds, 2),
        "export_peak_rss_over_weights": round(max(0, peak - before) / weight_bytes, 2),
        "artifact_over_weights": round(artifact_bytes / weight_bytes, 3),
        "forward_ms": round(artifact_forward * 1000, 2),
        "eager_forward_ms": round(eager_forward * 1000, 2),
        "forward_speedup": round(eager_forward / artifact_forward, 2),
        "forward_compute_floor_ms": round(2 * 128 * linear_weights / matmul_rate() * 1000, 2),
        "decode_tokens_per_s": round(statistics.median(rates), 1),
        "decode_graph_ms": round(graph_ms, 2),
        "decode_runner_overhead_ms": round(1000 / statistics.median(rates) - graph_ms, 2),
        **eager,
        "decode_speedup": round(statistics.median(rates) / eager["eager_static_generate_tokens_per_s"], 2),
    }


def decode_graph_ms(generation, prompt) -> float:
    """Median time of the `decode` graph's own call after the prompt, through the cache session the
    runner holds (the runner's feed, without the loop around it)."""
    from hfexport.generation.loop import DecodeState  # the runner's loop state: its feed, without the loop

    state = DecodeState(generation, prompt, None, {})
    state.step(prompt)
    session = state.session[1]
    record = generation.runners["decode"].record
    token = prompt[:, -1:]
    feed = {name: state._value(record, name, shape, dtype, token)
            for name, shape, dtype in zip(record.input_names, record.input_shapes, record.input_dtypes)
            if not name.startswith("cache.")}
    # Few calls: a static cache is written in place, one position per call.
    return _median_seconds(lambda: session.run(feed), 8) * 1000


def eager_decode(model, prompt, generation_config, repeats: int) -> dict:
    """Eager `generate` with a static cache, decode-only (from the second new token on, as the
    runner counts), and eager's one-token forward with a StaticCache on its own."""
    import torch
    from transformers import StaticCache

    def generate_seconds(new_tokens: int) -> float:
        config = copy.deepcopy(generation_config)
        config.update(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        with torch.inference_mode():
            return _median_seconds(lambda: model.generate(prompt, generation_config=config), max(1, repeats // 2))

    decode_seconds = (generate_seconds(NEW_TOKENS) - generate_seconds(1)) / (NEW_TOKENS - 1)
    cache = StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN)
    with torch.inference_mode():
        model(prompt, past_key_values=cache, use_cache=True)
        position = torch.tensor([prompt.shape[1]])
        forward = _median_seconds(lambda: model(prompt[:, -1:], past_key_values=cache, cache_position=position,
                                                use_cache=True), repeats)
    return {"eager_static_generate_tokens_per_s": round(1 / decode_seconds, 1),
            "eager_one_token_forward_ms": round(forward * 1000, 2)}


def _child(backend: str, source: str | None, repeats: int) -> dict:
    command = [sys.executable, __file__, "--one", backend, "--repeats", str(repeats)]
    if source:
        command += ["--model", source]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"backend": backend, "error": tail[:300]}
    return json.loads(lines[-1])


def markdown(results: list[dict], bandwidth: float, meta: dict) -> str:
    rows = [
        f"Measured {meta['date']} on {meta['machine']} ({meta['cpus']} CPUs), torch {meta['torch']}, "
        f"transformers {meta['transformers']}; model: {meta['model']} ({meta['weight_bytes'] / 1e6:.1f} MB fp32 "
        f"weights); copy bandwidth {bandwidth / 1e9:.1f} GB/s; fp32 matmul {meta['matmul_flops'] / 1e9:.0f} GFLOP/s. "
        f"Command: `python bench/bench.py`.",
        "",
        "| backend | precision | export s | export peak RSS / weights (target <= 1.5) | artifact / weights "
        "(<= 1.05) | forward 1x128 ms (eager) | speedup (target) | forward: compute floor ms, share reached "
        "(eager's) | decode tok/s (eager static) | speedup (target) | decode step ms: graph + runner (eager "
        "1-token forward) | decode / bandwidth ceiling |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['backend']} | error: {r['error']} |||||||||||")
            continue
        ceiling = bandwidth / r["weight_bytes"]
        floor = r["forward_compute_floor_ms"]

        def mark(ok: bool) -> str:
            return "" if ok else " **miss**"

        rows.append(
            f"| {r['backend']} | {r['precision']} | {r['export_seconds']} | {r['export_peak_rss_over_weights']}"
            f"{mark(r['export_peak_rss_over_weights'] <= 1.5)} | {r['artifact_over_weights']}"
            f"{mark(r['artifact_over_weights'] <= 1.05)} | {r['forward_ms']} ({r['eager_forward_ms']}) | "
            f"{r['forward_speedup']}x ({TARGET_FORWARD[r['backend']]}x){mark(r['forward_speedup'] >= TARGET_FORWARD[r['backend']])} | "
            f"{floor}, {floor / r['forward_ms']:.2f} ({floor / r['eager_forward_ms']:.2f}) | "
            f"{r['decode_tokens_per_s']} ({r['eager_static_generate_tokens_per_s']}) | {r['decode_speedup']}x "
            f"({TARGET_DECODE[r['backend']]}x){mark(r['decode_speedup'] >= TARGET_DECODE[r['backend']])} | "
            f"{r['decode_graph_ms']} + {r['decode_runner_overhead_ms']} ({r['eager_one_token_forward_ms']}) | "
            f"{r['decode_tokens_per_s'] / ceiling:.2f} of {ceiling:.0f} tok/s |")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--model", default=None, help="a local model folder (default: the random ~40M Llama)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--markdown", default=None, help="write the table here")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.model, args.repeats)))
        return
    import torch
    import transformers

    bandwidth = copy_bandwidth()
    results = [_child(b, args.model, args.repeats) for b in args.backends.split(",")]
    weight_bytes = next((r["weight_bytes"] for r in results if "weight_bytes" in r), 0)
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "torch": torch.__version__, "transformers": transformers.__version__,
            "model": args.model or "random Llama (8 layers, hidden 512, vocab 8192)", "weight_bytes": weight_bytes,
            "copy_bandwidth_bytes_per_s": bandwidth, "matmul_flops": matmul_rate()}
    table = markdown(results, bandwidth, meta)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    if args.markdown:
        write_markdown(Path(args.markdown), table)


NOTES_MARKER = "<!-- notes: kept when bench.py rewrites the table above -->"


def print_and_write(results: list[dict], table: str, json_path: str | None, markdown_path: str | None) -> None:
    """Print `table`; write `results` as JSON and `table` as Markdown where asked (a side script's outputs)."""
    print(table)
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2))
    if markdown_path:
        Path(markdown_path).write_text(table)


def write_markdown(path: Path, table: str) -> None:
    """Write the table, keeping the hand-written analysis below `NOTES_MARKER` in an existing file."""
    old = path.read_text() if path.exists() else ""
    notes = old[old.index(NOTES_MARKER):] if NOTES_MARKER in old else NOTES_MARKER + "\n"
    path.write_text(table + "\n" + notes)


if __name__ == "__main__":
    main()
