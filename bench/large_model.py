"""Benchmark: export a model whose weights exceed the memory the export may use (issue 18).

    python bench/large_model.py --make /tmp/hfexport-large            # write the ~5.9 GB Llama once
    python bench/large_model.py --model /tmp/hfexport-large --backends onnx,openvino
    python bench/large_model.py --model DIR --cap 0.5 --markdown bench/LARGE.md --json bench/large.json

`--make` saves a random-weight Llama (1.47 B parameters, 5.9 GB of fp32 weights; `--layers`
scales it) with `save_pretrained`. Each backend is then exported by the CLI, as a user would run it
(`hfexport export DIR -f BACKEND -o OUT`, validation on), in its own Linux memory cgroup (v1,
`/sys/fs/cgroup/memory`, root) whose limit is `--cap` times the fp32 weight bytes: past the limit
the kernel reclaims the cgroup's page cache and, when no page can be reclaimed, kills the export.

Columns: whether the export finished and validated; its seconds; the cgroup's peak anonymous
memory over the weight bytes (`total_rss` of `memory.stat`, sampled every 50 ms: what the export
holds that no file backs, the bound's measure, target <= 0.5x); and the kernel's own peak charge
(`memory.max_usage_in_bytes`), which also counts the page cache of the checkpoint and the artifact
read and written through the cgroup and so sits at the cap by design.

Needs root and a cgroup v1 memory controller (this project's machines have both); without them
it says so and stops. `tests/test_large_model.py` runs a 3 GB case of the same script (a
documented command, not in CI).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import print_and_write  # noqa: E402 - bench.py's pieces

CGROUPS = Path("/sys/fs/cgroup/memory")
TARGET = 0.5


def make_model(folder: Path, layers: int) -> int:
    """Save a random Llama with `layers` layers to `folder`; return its fp32 weight bytes."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048,
                         tie_word_embeddings=False, dtype="float32")
    torch.manual_seed(0)
    with torch.no_grad():
        model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def weight_bytes(folder: Path) -> int:
    """The bytes of the tensors in `folder`'s safetensors files (their headers read, nothing else)."""
    total = 0
    for file in folder.glob("*.safetensors"):
        with open(file, "rb") as stream:
            header = json.loads(stream.read(int.from_bytes(stream.read(8), "little")))
        total += sum(end - start for key, entry in header.items() if key != "__metadata__"
                     for start, end in [entry["data_offsets"]])
    return total


class Cgroup:
    """A memory cgroup limited to `limit` bytes; `run` starts a command in it and samples its
    anonymous memory until the command ends."""

    def __init__(self, limit: int):
        self.path = CGROUPS / f"hfexport-bench-{os.getpid()}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit))
        self.peak_anonymous = 0

    def _anonymous(self) -> int:
        stat = dict(line.split() for line in (self.path / "memory.stat").read_text().splitlines())
        return int(stat["total_rss"])

    def run(self, command: list[str], log: Path) -> int:
        procs = self.path / "cgroup.procs"
        with open(log, "w") as out:
            child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                     preexec_fn=lambda: procs.write_text(str(os.getpid())))
            done = threading.Event()

            def sample() -> None:
                while not done.wait(0.05):
                    self.peak_anonymous = max(self.peak_anonymous, self._anonymous())

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            code = child.wait()
            done.set()
            sampler.join()
        return code

    @property
    def oom_kills(self) -> int:
        """How many processes the kernel killed for this cgroup's limit."""
        control = dict(line.split() for line in (self.path / "memory.oom_control").read_text().splitlines())
        return int(control.get("oom_kill", 0))

    @property
    def max_usage(self) -> int:
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def remove(self) -> None:
        self.path.rmdir()


def run_backend(model: Path, backend: str, cap: float, work: Path, validate: bool = True,
                executorch_bounds: tuple[int, int] = (256, 2), quantize: str | None = None) -> dict:
    """Export `model` to `backend` with the CLI inside a cgroup capped at `cap` x its weights
    (ExecuTorch's memory plan bounded at `executorch_bounds`: sequence length, batch; quantized
    with `quantize`, a CLI scheme, when given)."""
    weights = weight_bytes(model)
    out, log = work / f"export-{backend}", work / f"export-{backend}.log"
    shutil.rmtree(out, ignore_errors=True)
    group = Cgroup(int(cap * weights))
    command = [sys.executable, "-m", "hfexport", "export", str(model), "-f", backend, "-o", str(out), "--quiet",
               *([] if validate else ["--no-validate"]), *(["--quantize", quantize] if quantize else [])]
    if backend == "executorch":
        command += ["--max-sequence-length", str(executorch_bounds[0]), "--max-batch-size", str(executorch_bounds[1])]
    start = time.perf_counter()
    try:
        code = group.run(command, log)
        seconds = time.perf_counter() - start
        result = {"format": backend, "weight_bytes": weights, "cap": cap, "validate": validate, "quantize": quantize,
                  "returncode": code,
                  "seconds": round(seconds, 1), "peak_anonymous": round(group.peak_anonymous / weights, 3),
                  "max_usage": round(group.max_usage / weights, 3), "oom_kills": group.oom_kills}
    finally:
        group.remove()
    report = out / "report.json"
    if code == 0 and report.exists():
        validation = json.loads(report.read_text())["components"]["model"]["validation"]
        if validate:
            result["validated"] = bool(validation and validation["passed"])
        result["artifact_bytes"] = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    else:
        tail = log.read_text().strip().splitlines()[-3:]
        result["error"] = ("killed by the cgroup's memory limit" if result["oom_kills"] else " / ".join(tail))[:300]
    shutil.rmtree(out, ignore_errors=True)  # several GB each
    return result


def markdown(results: list[dict]) -> str:
    rows = [f"| backend | weights GB | cap | result | seconds | peak anonymous / weights (target <= {TARGET}) "
            "| cgroup peak charge / weights |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            outcome = f"**failed**: {r['error']}"
        elif "validated" in r:
            outcome = "exported, validated" if r["validated"] else "exported, validation FAILED"
        else:
            outcome = "exported (--no-validate)"
        anonymous = f"{r['peak_anonymous']}{' **miss**' if r['peak_anonymous'] > TARGET else ''}"
        rows.append(f"| {r['format']}{' ' + r['quantize'] if r.get('quantize') else ''} | {r['weight_bytes'] / 1e9:.2f} | {r['cap']}x | {outcome} | {r['seconds']} "
                    f"| {anonymous} | {r['max_usage']} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--make", default=None, help="write the random Llama to this folder and stop")
    parser.add_argument("--layers", type=int, default=22, help="with --make: decoder layers (22: 5.9 GB)")
    parser.add_argument("--model", default=None, help="the folder --make wrote")
    parser.add_argument("--backends", default="onnx,openvino,executorch")
    parser.add_argument("--cap", type=float, default=TARGET, help="the cgroup's limit, times the weight bytes")
    parser.add_argument("--no-validate", action="store_true", help="export with --no-validate")
    parser.add_argument("--work", default=None, help="where the exports are written (default: beside --model)")
    parser.add_argument("--executorch-bounds", default="256,2", metavar="SEQ,BATCH",
                        help="ExecuTorch's --max-sequence-length and --max-batch-size (its memory plan at the "
                        "config's 2048 tokens and batch 8 is 7 GiB of intermediates)")
    parser.add_argument("--quantize", default=None, metavar="SCHEME", help="export with --quantize SCHEME")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args()
    if args.make:
        print(f"{make_model(Path(args.make), args.layers) / 1e9:.2f} GB of fp32 weights in {args.make}")
        return
    if not args.model:
        parser.error("--model DIR (written by --make) is needed")
    if not (CGROUPS / "cgroup.procs").exists() or not os.access(CGROUPS, os.W_OK):
        sys.exit(f"no writable cgroup v1 memory controller at {CGROUPS}: run as root on a machine with one")
    model = Path(args.model).resolve()
    work = Path(args.work or model.parent).resolve()
    bounds = tuple(int(n) for n in args.executorch_bounds.split(","))
    results = []
    for backend in args.backends.split(","):
        results.append(run_backend(model, backend, args.cap, work, validate=not args.no_validate,
                                   executorch_bounds=bounds, quantize=args.quantize))
        print(json.dumps(results[-1]), flush=True)
    print_and_write(results, markdown(results), args.json, args.markdown)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
