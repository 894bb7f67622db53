"""Benchmark: what a quantized export of a real LLM looks like against fp32 eager, per format and scheme.

    python bench/quant_criteria.py                                 # every format's recipes, and broken ones
    python bench/quant_criteria.py --runs onnx:int4-weights,onnx:int4-weights/wrong-group --json /tmp/q.json
    python bench/quant_criteria.py --cache 0 --runs onnx:int4-weights   # the default dynamic-cache export

The numbers the quantized-export criteria (`hfexport.job.default_min_cosine`,
`generation.accuracy.default_min_agreement`) are set from. Each run (`format:scheme`, `fp32` meaning
unquantized, `/wrong-scale` or `/wrong-group` a deliberately broken quantizer) is one subprocess:
SmolLM2-135M-Instruct (`real_model.smollm2_folder()`, 30 layers) exported by the export job as the
flagship recipe does (`export_to_folder(..., generation=GenerationOptions(static_cache=CACHE),
quantize=scheme)`, the CLI's `hfexport export DIR --generate --multi-token-decode --static-cache 512
--quantize scheme`), with its validation run but every floor lowered so that the export is written
whatever it shows, then:
  - the validation table, per case (sample, resized, smallest): the logits' cosine with eager, the
    logits' greedy token at each position against eager's, and the lowest cosine of a KV-cache tensor;
  - the accuracy gate over the sample prompt and over each chat prompt (`real_model.CHAT_PROMPTS`,
    chat-templated): the share of teacher-forced greedy tokens equal to fp32 eager `generate`'s over
    TOKENS steps, the mean and the lowest per-step logits cosine, the mean top-10 overlap (the
    table shows the lowest of each over the prompts).

Broken quantizers (ONNX int4 only: `MatMulNBits` keeps its scales in initializers one can edit):
`wrong-scale` multiplies every block's scale by 1.1, `wrong-group` gives each block its neighbour's
scale (a layout bug), `noisy-scale` multiplies each by a random factor (lognormal, sigma 0.3).
The real model's sample prompt comes from its tokenizer ("Hello, world!").
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

from decode import SCHEMES  # noqa: E402 - the recipe each runtime deploys

CACHE, TOKENS = 512, 64
BROKEN = ("wrong-scale", "wrong-group", "noisy-scale")


def default_runs() -> list[str]:
    """Every format at fp32 and each of its recipes, then the broken int4 quantizers on ONNX."""
    runs = [f"{fmt}:{scheme}" for fmt, schemes in SCHEMES.items() for scheme in ("fp32", *schemes.values())]
    return runs + [f"onnx:int4-weights/{broken}" for broken in BROKEN]


def broken_quantizer(how: str):
    """ONNX Runtime's int4 quantizer, with its `MatMulNBits` scales spoiled afterwards (`BROKEN`)."""
    import numpy as np
    import onnx_ir as ir

    from hfexport.quantization import OrtQuantizer

    class Broken(OrtQuantizer):
        def quantize_model(self, artifact, samples):
            program = super().quantize_model(artifact, samples)
            for value in program.model.graph.initializers.values():
                if value.name.endswith("_scales"):
                    scales = value.const_value.numpy()
                    spoiled = _spoiled(scales, how)
                    value.const_value = ir.Tensor(np.ascontiguousarray(spoiled), name=value.name)
            return program

    return Broken("int4-weights")


def _spoiled(scales, how: str):
    """`scales` (one row of block scales per output channel) as a broken quantizer would write them."""
    import numpy as np

    if how == "wrong-scale":
        return scales * np.float32(1.1)
    if how == "wrong-group":  # each block gets the next block's scale, across rows where a row has one block
        return np.roll(scales.reshape(-1), 1).reshape(scales.shape)
    if how == "noisy-scale":  # each block's scale off by a random factor (lognormal, sigma 0.3)
        return scales * np.exp(np.random.default_rng(0).normal(0, 0.3, scales.shape)).astype(scales.dtype)
    raise ValueError(f"unknown broken quantizer {how!r}; choose one of {', '.join(BROKEN)}")


def _summary(reports: dict) -> list[dict]:
    """One row per component and case: the logits' cosine and greedy tokens, the worst cache tensor."""
    rows = []
    for component, report in reports.items():
        for case in report.cases:
            logits = [o for o in case.outputs if o.name.endswith("logits")]
            caches = [o for o in case.outputs if not o.name.endswith("logits") and o.cosine is not None]
            worst = min(caches, key=lambda o: o.cosine, default=None)
            rows.append({
                "component": component, "case": case.label, "error": case.error,
                "logits_cosine": logits[0].cosine if logits else None,
                "logits_max_abs": logits[0].max_abs if logits else None,
                "cache_min_cosine": worst.cosine if worst else None,
                "cache_min_name": worst.name if worst else None,
                "cache_mean_cosine": sum(o.cosine for o in caches) / len(caches) if caches else None,
                "cache_max_abs": max((o.max_abs for o in caches), default=None),
            })
    return rows


def run_one(fmt: str, scheme: str, cache: int, tokens: int) -> dict:
    """One export and its measurements, in this (fresh) process."""
    import torch
    from real_model import CHAT_PROMPTS, chat_inputs, smollm2_folder
    from transformers import GenerationConfig

    from hfexport import AutoExportConfig
    from hfexport.errors import ValidationError
    from hfexport.generation.accuracy import greedy_agreement
    from hfexport.job import GenerationOptions, JudgingOptions, export_to_folder
    from hfexport.loading import load_model

    torch.manual_seed(0)
    recipe, _, broken = scheme.partition("/")
    quantize = None if recipe == "fp32" else (broken_quantizer(broken) if broken else recipe)
    loaded = load_model(str(smollm2_folder()))
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True})
    # cache 0: the default export's dynamic cache (prefill + decode), as a plain `--generate` writes
    generation_config = GenerationConfig(cache_implementation="static", max_cache_len=cache) if cache else None
    lowered = {} if quantize is None else {"min_cosine": -1.0, "min_agreement": 0.0}
    out: dict = {"run": f"{fmt}:{scheme}", "cache": cache}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "export"
        start = time.perf_counter()
        try:
            result = export_to_folder(loaded, config, folder,
                                      generation=GenerationOptions(generate=True, static_cache=cache or None),
                                      judging=JudgingOptions(accuracy_tokens=tokens, **lowered), quantize=quantize)
        except ValidationError as error:  # fp32 under its strict tolerance: the reports say where
            out.update(seconds=round(time.perf_counter() - start, 1), refused=str(error),
                       validation=_summary(getattr(error, "reports", {})))
            return out
        out["seconds"] = round(time.perf_counter() - start, 1)
        out["job_seconds"] = result.report.get("job_seconds")
        out["validation"] = _summary(result.reports)
        if quantize is not None:
            out["sample_accuracy"] = result.report["accuracy"]
        chats = []
        for prompt in CHAT_PROMPTS:
            found = greedy_agreement(folder, loaded.model, dict(chat_inputs(loaded.tokenizer, prompt)),
                                     generation_config=generation_config, new_tokens=tokens)
            chats.append({"prompt": prompt, **found.to_dict()})
        out["chat_accuracy"] = chats
        del result
    return out


def _fmt(value, spec=".4f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(rows: list[dict]) -> str:
    """The measurements as the RESULTS table: one line per run, worst case over validation cases."""
    lines = ["| run | logits cosine (min over cases) | logits max abs | cache cosine min (tensor) | "
             "agreement sample / chat min / chat mean | steps' logits cosine: mean (lowest step) | top-10 overlap | "
             "seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row and "validation" not in row:
            lines.append(f"| {row['run']} | failed: {row['error'][:120]} | | | | | | |")
            continue
        cases = [c for c in row.get("validation", []) if not c["error"]]
        logits = min((c["logits_cosine"] for c in cases if c["logits_cosine"] is not None), default=None)
        max_abs = max((c["logits_max_abs"] for c in cases if c["logits_max_abs"] is not None), default=None)
        worst = min((c for c in cases if c["cache_min_cosine"] is not None), key=lambda c: c["cache_min_cosine"],
                    default=None)
        chats = row.get("chat_accuracy", [])
        sample = row.get("sample_accuracy")
        agreement = " / ".join([_fmt(sample["agreement"], ".2f") if sample else "-",
                                _fmt(min((c["agreement"] for c in chats), default=None), ".2f"),
                                _fmt(sum(c["agreement"] for c in chats) / len(chats) if chats else None, ".2f")])
        steps = [*chats, *([sample] if sample else [])]
        cos = min((c["min_cosine"] for c in steps), default=None)
        mean = min((c["mean_cosine"] for c in steps), default=None)
        overlap = min((c["top_k_overlap"] for c in steps if c.get("top_k_overlap") is not None), default=None)
        refused = " (fp32 refused)" if row.get("refused") else ""
        cache = f"{_fmt(worst['cache_min_cosine'])} ({worst['cache_min_name']})" if worst else "-"
        lines.append(f"| {row['run']}{refused} | {_fmt(logits)} | {_fmt(max_abs, '.3g')} | {cache} | {agreement} | "
                     f"{_fmt(mean)} ({_fmt(cos)}) | {_fmt(overlap, '.2f')} | {row.get('seconds', '-')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default=",".join(default_runs()), help="format:scheme[/broken], comma-separated")
    parser.add_argument("--cache", type=int, default=CACHE,
                        help="the static cache's length; 0: the default dynamic cache (prefill + decode components)")
    parser.add_argument("--tokens", type=int, default=TOKENS)
    parser.add_argument("--json", type=Path, help="append each run's measurements to this file (JSON lines)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a single run, in this process (the subprocess)
    args = parser.parse_args()
    if args.one:
        fmt, scheme = args.one.split(":", 1)
        print(json.dumps(run_one(fmt, scheme, args.cache, args.tokens)))
        return
    rows = []
    for run in args.runs.split(","):
        done = subprocess.run([sys.executable, __file__, "--one", run, "--cache", str(args.cache),
                               "--tokens", str(args.tokens)], capture_output=True, text=True)
        try:
            row = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            row = {"run": run, "error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
        rows.append(row)
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps(row) + "\n")
        print(markdown([row]).splitlines()[-1], flush=True)
    print(markdown(rows))


if __name__ == "__main__":
    main()
