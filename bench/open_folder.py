"""Benchmark: what opening an export folder costs, seconds and peak memory (issue 49).

    python bench/open_folder.py --root /tmp/open-bench                  # ONNX, OpenVINO, ExecuTorch
    python bench/open_folder.py --root /tmp/open-bench --rev 2b893c3    # beside another revision

A random Llama (hidden 1024, 8 layers: ~0.5 GB of fp32 weights) is exported once per format with
the CLI's defaults (its LLM package) into `--root`. Each measurement is a fresh process, as a user
runs `hfexport generate`: import, `GenerationRunner.load(folder)` (every file's SHA-256 checked),
then 8 greedy tokens; it reports the load's seconds, the first token's, and the process's peak
RSS over the import's. With `--rev`, the same runs with that revision's source (a `git worktree`
under `--root`) interleave with this tree's, so both see the same machine load.

The imports (torch, transformers, each runtime) come before the clock and the memory baseline:
what is measured is reading, checking and loading the folder. Since this issue, a folder's files are read once and handed to the runtime as bytes (never a path
the runtime opens again): the runtime builds its copy while the bytes are held, so the peak grows
by up to the weights' size; ONNX Runtime's bytes are let go once its session holds them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_PROBE = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import hfexport, torch, transformers  # the imports a load makes, before the clock and the baseline
import importlib
for runtime in ("onnxruntime", "openvino", "executorch.runtime"):
    try:
        importlib.import_module(runtime)
    except ImportError:
        pass
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
from hfexport import GenerationRunner
start = time.perf_counter()
runner = GenerationRunner.load(sys.argv[2])
loaded = time.perf_counter()
result = runner.generate([5, 17, 42, 9], max_new_tokens=8, eos_token_id=None)
done = time.perf_counter()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("RESULT " + json.dumps({"load_s": loaded - start, "generate_s": done - loaded, "tokens": result.tokens,
                              "peak_over_import_mb": (peak - base) / 1024}))
"""


def _export(root: Path, fmt: str) -> Path:
    out = root / f"llama-{fmt}"
    if (out / "manifest.json").is_file():
        return out
    source = root / "source"
    if not (source / "config.json").is_file():
        subprocess.run([sys.executable, "-c", (
            "import sys, torch; from transformers import LlamaConfig, LlamaForCausalLM; torch.manual_seed(0); "
            "LlamaForCausalLM(LlamaConfig(vocab_size=8192, hidden_size=1024, intermediate_size=2816, "
            "num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=512))"
            ".save_pretrained(sys.argv[1])"), str(source)], check=True)
    subprocess.run([sys.executable, "-m", "hfexport.cli.main", "export", str(source), "-f", fmt, "-o", str(out),
                    "--static-cache", "256", "--no-validate", "--quiet"], check=True,
                   env={"PYTHONPATH": str(REPO / "src"), **__import__("os").environ})
    return out


def _probe(source: Path, folder: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", _PROBE, str(source), str(folder)], capture_output=True, text=True)
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(line.removeprefix("RESULT "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="where the exports (and --rev's worktree) go")
    parser.add_argument("--formats", default="onnx,openvino,executorch")
    parser.add_argument("--rev", help="a git revision to measure beside this tree")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    sources = {"this tree": REPO / "src"}
    if args.rev:
        other = args.root / f"rev-{args.rev}"
        if not other.exists():
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(other), args.rev], check=True)
        sources[args.rev] = other / "src"
    print(f"| format | source | load s | first 8 tokens s | peak RSS over import, MB | tokens agree |")
    print("|---|---|---|---|---|---|")
    for fmt in args.formats.split(","):
        folder = _export(args.root, fmt)
        runs: dict[str, list[dict]] = {name: [] for name in sources}
        for _ in range(args.rounds):
            for name, source in sources.items():
                runs[name].append(_probe(source, folder))
        tokens = {name: r[0].get("tokens") for name, r in runs.items()}
        for name, results in runs.items():
            if any("error" in r for r in results):
                print(f"| {fmt} | {name} | error: {results[0].get('error', '')[:80]} | | | |")
                continue
            med = {k: statistics.median(r[k] for r in results) for k in ("load_s", "generate_s", "peak_over_import_mb")}
            agree = len({json.dumps(t) for t in tokens.values() if t is not None}) == 1
            print(f"| {fmt} | {name} | {med['load_s']:.2f} | {med['generate_s']:.2f} | "
                  f"{med['peak_over_import_mb']:.0f} | {'yes' if agree else 'no'} |")


if __name__ == "__main__":
    main()
