"""Benchmark: hfexport's ONNX generation folder beside onnxruntime-genai's own model builder, in one run.

    python bench/onnx_genai.py                                        # random Llama + SmolLM2, fp32 + int4, caches 256, 2048
    python bench/onnx_genai.py --models random --precisions fp32 --caches 256 --markdown /tmp/genai.md
    python bench/onnx_genai.py --models random-gemma2 --precisions fp32 --caches 256  # softcap + window in GQA

For each model and precision the builder (`python -m onnxruntime_genai.models.builder -i HF_FOLDER
-o OUT -p fp32|int4 -e cpu`) runs once in its own subprocess; hfexport never imports it. Each
`(model, precision, cache)` is then one subprocess that exports with the export job
(`export_to_folder(..., generation=GenerationOptions(static_cache=N), quantize=None|"int4-weights")`,
the CLI's `hfexport export --format onnx --generate --static-cache N [--quantize int4-weights]`) and
measures, side by side:
  - eager fp32 `generate` with a static cache of N (the reference of every ratio);
  - `GenerationRunner` (`hfexport generate`) on the folder;
  - onnxruntime-genai's `Generator` on the same folder (its `genai_config.json`);
  - onnxruntime-genai's `Generator` on the builder's folder, its KV buffer sized to N (`max_length=N`).
Each: decode tokens/s from the second new token on (64 greedy tokens after a 32-token prompt, the
median of 3) and time to first token. On SmolLM2-135M-Instruct: whether the fp32 export's greedy
chat answers (48 tokens) are eager's, through hfexport and through genai, and the int4 export's
teacher-forced greedy agreement with fp32 eager over 48 tokens of each chat answer.

Targets (issue 31, this 2-CPU machine, ratios to eager fp32 in the same run): at cache 256 on the
random Llama fp32 >= 4x and int4 >= 12x eager, and >= 1.0x the builder's tokens/s; decode at 2048
>= 0.9x decode at 256; time to first token <= 0.3x eager's; SmolLM2 fp32 tokens = eager's, int4
agreement >= 0.8. A miss is marked, never hidden.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import eager_generate_speed, print_and_write  # noqa: E402 - bench.py's pieces

PROMPT_LEN, NEW_TOKENS, ACCURACY_TOKENS, REPEATS = 32, 64, 48, 3
TARGETS = {"fp32": 4.0, "int4": 12.0}
SCHEME = {"fp32": None, "int4": "int4-weights"}


def random_llama_folder(root: Path, family: str = "llama") -> Path:
    """The issue's random Llama (vocab 8192, hidden 512, intermediate 1408, 8 layers, 8 heads, 4 kv
    heads: 134 MB fp32) saved with `save_pretrained`, with SmolLM2's tokenizer files beside it (the
    builder saves a tokenizer; the runs feed token ids). `family="gemma2"`: a Gemma-2 of the same
    sizes (head size 64), its layers alternating a 64-token sliding window and full attention, its
    attention logits softcapped at Gemma-2's 50 (GroupQueryAttention's `softcap`)."""
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM

    from real_model import smollm2_folder

    folder = root / f"random-{family}"
    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(0)
    sizes = dict(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                 num_key_value_heads=4, max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=1,
                 eos_token_id=2, pad_token_id=0)
    if family == "gemma2":
        model = Gemma2ForCausalLM(Gemma2Config(**sizes, head_dim=64, sliding_window=64, attn_logit_softcapping=50.0))
    else:
        model = LlamaForCausalLM(LlamaConfig(**sizes))
    model.eval().save_pretrained(folder)
    for file in smollm2_folder().glob("tokenizer*"):
        shutil.copy(file, folder / file.name)
    return folder


def model_folder(name: str, root: Path) -> Path:
    from real_model import smollm2_folder

    if name == "random-gemma2":
        return random_llama_folder(root, "gemma2")
    return random_llama_folder(root) if name == "random" else smollm2_folder()


def run_builder(source: Path, precision: str, out: Path) -> dict:
    """onnxruntime-genai's builder on `source`, in its own process; its seconds, or its error."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(out),
                           "-p", precision, "-e", "cpu", "-c", str(out.parent / f"{out.name}-cache")],
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0 or not (out / "genai_config.json").exists():
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    return {"seconds": round(time.perf_counter() - start, 1)}


# -- one measured run (a subprocess) ------------------------------------------------------------


def run_one(source: Path, precision: str, cache: int, builder: Path | None, scratch: Path) -> dict:
    """Export `source` at `precision` with a static cache of `cache`, and measure every way."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from hfexport import AutoExportConfig, GenerationRunner
    from hfexport.job import GenerationOptions, JudgingOptions, export_to_folder

    model = AutoModelForCausalLM.from_pretrained(source).eval()
    vocab = model.config.vocab_size
    prompt = torch.randint(3, vocab, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    generation_config = GenerationConfig(cache_implementation="static", max_cache_len=cache)
    folder = scratch / f"hfexport-{precision}-{cache}"
    start = time.perf_counter()
    export_to_folder((model, {"input_ids": prompt[:, :16]}),
                     AutoExportConfig.from_dict({"export_format": "onnx", "dynamic": True}), folder,
                     generation=GenerationOptions(static_cache=cache), judging=JudgingOptions(validate=False),
                     quantize=SCHEME[precision], overwrite=True)
    export_seconds = time.perf_counter() - start
    record = json.loads((folder / "report.json").read_text())["components"]["decode"]["record"]
    row = {"model": source.name, "precision": precision, "cache": cache, "export_seconds": round(export_seconds, 1),
           "graph": record.get("ort_fusions", {}).get("fused"),
           "gqa": record.get("ort_fusions", {}).get("group_query_attention")}
    row["eager"] = eager_generate_speed(model, prompt, generation_config, NEW_TOKENS, REPEATS)
    runner = GenerationRunner.load(folder)
    row["hfexport"] = _timed(lambda: _runner_run(runner, prompt[0].tolist()))
    row["genai"] = _genai(folder, prompt[0].tolist(), cache)
    if builder is not None:
        row["builder"] = _genai(builder, prompt[0].tolist(), cache)
    tokenizer = AutoTokenizer.from_pretrained(source) if (source / "tokenizer_config.json").exists() else None
    if not source.name.startswith("random-") and tokenizer is not None:
        row["chat"] = _chat_accuracy(model, tokenizer, folder, runner, cache, precision)
    return row




def _timed(run) -> dict:
    """`run() -> (ttft s, decode s, tokens)` repeated: medians as tokens/s and ms, and the tokens."""
    run()  # warm-up
    results = [run() for _ in range(REPEATS)]
    ttft = statistics.median(r[0] for r in results)
    decode = statistics.median(r[1] for r in results)
    return {"tokens_per_s": round((NEW_TOKENS - 1) / decode, 1), "ttft_ms": round(ttft * 1000, 1),
            "tokens": results[0][2]}


def _runner_run(runner, prompt: list[int]) -> tuple[float, float, list[int]]:
    result = runner.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)  # eos suppressed, as eager and genai
    return result.time_to_first_token_s, (NEW_TOKENS - 1) / result.tokens_per_s, result.tokens


def _genai_tokens(model, prompt: list[int], new_tokens: int, cache: int) -> tuple[float, float, list[int]]:
    """onnxruntime-genai's greedy loop on `prompt`: (time to first token, the rest's time, tokens)."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    length = len(prompt) + new_tokens
    params.set_search_options(max_length=cache, do_sample=False, min_length=length)
    start = time.perf_counter()
    generator = og.Generator(model, params)
    generator.append_tokens([prompt])
    generator.generate_next_token()
    tokens = [int(generator.get_next_tokens()[0])]
    first = time.perf_counter()
    while len(tokens) < new_tokens:
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return first - start, time.perf_counter() - first, tokens


def _genai(folder: Path, prompt: list[int], cache: int) -> dict:
    import onnxruntime_genai as og

    try:
        model = og.Model(str(folder))
        return _timed(lambda: _genai_tokens(model, prompt, NEW_TOKENS, cache))
    except Exception as error:  # noqa: BLE001 - a refused folder is a result
        return {"error": str(error).splitlines()[0][:300]}


def _chat_accuracy(model, tokenizer, folder: Path, runner, cache: int, precision: str) -> dict:
    """Per chat prompt: eager's greedy answer (48 tokens) against the export's, through hfexport and
    genai (fp32: equal?), and the teacher-forced greedy agreement (`greedy_agreement`)."""
    import onnxruntime_genai as og
    import torch
    from transformers import GenerationConfig

    from hfexport.generation.accuracy import greedy_agreement
    from real_model import CHAT_PROMPTS, chat_inputs

    generation_config = GenerationConfig(cache_implementation="static", max_cache_len=cache)
    genai_model = og.Model(str(folder))
    out = []
    for text in CHAT_PROMPTS:
        inputs = chat_inputs(tokenizer, text)
        ids = inputs["input_ids"]
        config = copy.deepcopy(generation_config)
        config.update(max_new_tokens=ACCURACY_TOKENS, min_new_tokens=ACCURACY_TOKENS, do_sample=False)
        with torch.inference_mode():
            eager = model.generate(ids, generation_config=config)[0, ids.shape[1]:].tolist()
        ours = runner.generate(ids, max_new_tokens=ACCURACY_TOKENS, min_new_tokens=ACCURACY_TOKENS).tokens
        genai = _genai_tokens(genai_model, ids[0].tolist(), ACCURACY_TOKENS, cache)[2]
        agreement = greedy_agreement(folder, model, {"input_ids": ids}, generation_config=generation_config,
                                     new_tokens=ACCURACY_TOKENS)
        out.append({"prompt": text, "hfexport_equal": ours == eager, "genai_equal": genai == eager,
                    "agreement": round(agreement.agreement, 3), "answer": tokenizer.decode(ours, skip_special_tokens=True)})
    return {"prompts": out, "agreement": round(min(p["agreement"] for p in out), 3),
            "tokens_equal": all(p["hfexport_equal"] and p["genai_equal"] for p in out)}


# -- driver -------------------------------------------------------------------------------------


def _child(source: Path, precision: str, cache: int, builder: Path | None, scratch: Path) -> dict:
    command = [sys.executable, __file__, "--one", str(source), "--precision", precision, "--cache", str(cache),
               "--scratch", str(scratch)] + (["--builder", str(builder)] if builder else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=7200)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"model": source.name, "precision": precision, "cache": cache,
                "error": ((done.stderr.strip().splitlines() or ["no output"])[-1])[:300]}
    return json.loads(lines[-1])


def _ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}x" if reference else "-"


def markdown(results: list[dict], meta: dict) -> str:
    """The results as a Markdown table: ratios to eager fp32 in the same process, misses marked."""
    rows = [f"Machine: {meta['machine']}; load average at start {meta['load']}; prompt {PROMPT_LEN} tokens, "
            f"{NEW_TOKENS} greedy tokens, median of {REPEATS}.", "",
            "| model | precision | cache | eager fp32 tok/s, TTFT ms | hfexport generate tok/s (x eager) "
            "| genai on hfexport folder tok/s (x eager, x builder) | genai on builder folder tok/s (x eager) "
            "| hfexport generate / genai, same folder (target >= 0.9) "
            "| TTFT ms: hfexport / genai-hfexport / genai-builder (x eager) | 2048 vs 256 (genai-hfexport, builder) "
            "| tokens | SmolLM2 chat |", "|" + "---|" * 11]
    at_256 = {(r["model"], r["precision"]): r for r in results if r.get("cache") == 256 and "error" not in r}
    for r in results:
        if "error" in r:
            rows.append(f"| {r['model']} | {r['precision']} | {r['cache']} | error: {r['error']} |" + " |" * 7)
            continue
        eager = r["eager"]["tokens_per_s"]
        ours, genai, builder = r["hfexport"], r["genai"], r.get("builder", {})
        target = TARGETS[r["precision"]] if r["model"] == "random-llama" and r["cache"] == 256 else None

        def rate(entry: dict, mark_target: bool = False) -> str:
            if "error" in entry or not entry:
                return f"error: {entry.get('error', 'not run')}" if entry else "-"
            ratio = entry["tokens_per_s"] / eager
            miss = " **miss**" if mark_target and target and ratio < target else ""
            return f"{entry['tokens_per_s']} ({ratio:.2f}x{f' / {target}x' if mark_target and target else ''}{miss})"

        genai_text = rate(genai, True)
        if "tokens_per_s" in genai and "tokens_per_s" in builder:
            share = genai["tokens_per_s"] / builder["tokens_per_s"]
            genai_text += f", {share:.2f}x builder" + (" **miss**" if share < 1.0 else "")
        same_folder = "-"
        if "tokens_per_s" in ours and "tokens_per_s" in genai:
            share = ours["tokens_per_s"] / genai["tokens_per_s"]
            same_folder = f"{share:.2f}" + (" **miss**" if share < 0.9 else "")
        ttfts = [e.get("ttft_ms") for e in (ours, genai, builder)]
        ttft = " / ".join(f"{t} ({t / r['eager']['ttft_ms']:.2f}x)" if t else "-" for t in ttfts)
        if r["model"] == "random-llama" and any(t and t / r["eager"]["ttft_ms"] > 0.3 for t in ttfts[:2]):
            ttft += " **miss** (0.3x)"
        scaling = "-"
        base = at_256.get((r["model"], r["precision"]))
        if r["cache"] != 256 and base is not None:
            ours_scale = genai.get("tokens_per_s", 0) / base["genai"].get("tokens_per_s", 1)
            theirs = builder.get("tokens_per_s", 0) / max(base.get("builder", {}).get("tokens_per_s", 0), 1e-9)
            scaling = f"{ours_scale:.2f}, {theirs:.2f}" + (" **miss** (0.9)" if ours_scale < 0.9 else "")
        same = ("hfexport = genai" if ours.get("tokens") == genai.get("tokens") else "hfexport != genai")
        if "tokens" in builder:
            same += ", = builder" if builder["tokens"] == genai.get("tokens") else ", != builder"
        chat = r.get("chat")
        chat_text = "-" if not chat else (f"tokens = eager: {chat['tokens_equal']}; agreement {chat['agreement']}"
                                          + (" **miss** (0.8)" if chat["agreement"] < 0.8 else ""))
        rows.append(f"| {r['model']} | {r['precision']} | {r['cache']} | {eager}, {r['eager']['ttft_ms']} "
                    f"| {rate(ours)} | {genai_text} | {rate(builder)} | {same_folder} | {ttft} | {scaling} | {same} "
                    f"| {chat_text} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="random,smollm2", help="random,smollm2 (or random-gemma2)")
    parser.add_argument("--precisions", default="fp32,int4")
    parser.add_argument("--caches", default="256,2048")
    parser.add_argument("--scratch", default=None, help="folder for exports (default: a temporary one)")
    parser.add_argument("--no-builder", action="store_true", help="skip onnxruntime-genai's builder rows")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--precision", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--builder", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        builder = Path(args.builder) if args.builder else None
        print(json.dumps(run_one(Path(args.one), args.precision, args.cache, builder, Path(args.scratch))))
        return
    import os
    import platform

    meta = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
            "load": " ".join(f"{x:.1f}" for x in os.getloadavg())}
    with tempfile.TemporaryDirectory(prefix="hfexport-genai-bench-") as tmp:
        scratch = Path(args.scratch or tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        results = []
        for name in args.models.split(","):
            source = model_folder(name, scratch)
            for precision in args.precisions.split(","):
                builder = None
                if not args.no_builder:
                    out = scratch / f"builder-{source.name}-{precision}"
                    built = run_builder(source, precision, out) if not (out / "genai_config.json").exists() else {}
                    builder = out if "error" not in built else None
                    if builder is None:
                        print(f"builder failed: {built['error']}", file=sys.stderr)
                for cache in (int(c) for c in args.caches.split(",")):
                    row = _child(source, precision, cache, builder, scratch)
                    print(json.dumps({k: v for k, v in row.items() if k != "chat"}), file=sys.stderr)
                    results.append(row)
        meta["load_end"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print_and_write(results, markdown(results, meta) + f"\nLoad average at the end: {meta['load_end']}.\n",
                    args.json, args.markdown)


if __name__ == "__main__":
    main()
