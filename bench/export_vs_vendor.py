"""Benchmark: export time and peak RAM beside the vendors' own export tools, in one run (issue 43, the first table).

    python bench/export_vs_vendor.py --root /tmp/export-vendor-bench            # every row
    python bench/export_vs_vendor.py --root R --formats onnx,openvino --markdown /tmp/evv.md
    python bench/export_vs_vendor.py --root R --smollm2         # + our ExecuTorch LLM program of SmolLM2-135M
    python bench/export_vs_vendor.py --root R --model large --formats onnx --schemes fp32   # 1.25 GB, RSS
    python bench/export_vs_vendor.py --root R --model 1b --formats onnx --schemes fp32      # 4.4 GB, 16 layers
    python bench/export_vs_vendor.py --root R --model smollm2 --formats onnx --schemes fp32   # 30 layers
    python bench/export_vs_vendor.py --root R --schemes none --smollm2            # that row alone
    python bench/export_vs_vendor.py --table run.json           # the table of an earlier run's --json
    python bench/export_vs_vendor.py --root R --formats openvino --tools optimum-intel   # one tool's rows

The model: the random Llama of `runner_vs_vendor.py` (vocab 8192, hidden 512, intermediate 1408,
8 layers, 8 heads, 4 kv heads: 134 MB fp32) saved with its tokenizer by that script's
`source_folder` (made once under ``--root``, reused).

Set up once under ``--root`` and reused on later runs (the set-up's output in ``setup.log``):
  - ``ov-venv/``: a venv of its own (never the project's) with optimum-intel's ``optimum-cli``:
    ``optimum~=2.3.0``, ``transformers<5.6``, nncf, openvino and openvino-tokenizers at the project's
    pins (constraints.txt) and torch 2.13.0 (the CPU wheel), then ``optimum-intel==2.2.0`` with
    ``--no-deps``: its torchvision requirement has no wheel that imports beside this torch, and the
    Llama export does not import it;
  - ``et-venv/``: the same for optimum-executorch's: ``optimum-executorch==1.1.0`` (which pins
    ``optimum~=2.0.0`` and ``transformers==5.0.0rc1``) with ``executorch==1.4.1``, ``torchao==0.18.0``
    and torch 2.13.0;
  - the onnxruntime-genai model builder is the project venv's own (onnxruntime-genai is one of our
    dependencies); hfexport never imports any of these tools, it runs them as commands.

Rows, one after the other, each ONE fresh process (the same 2 CPUs, nothing else of this script
running beside it; the 1-minute load average `os.getloadavg()` is printed before each row):
  ours                ``hfexport export SRC -f onnx|openvino -o OUT [--weight-format int4]`` and
                      ``-f executorch [--weight-format 8da4w]``: the CLI's defaults, so the LLM package
                      with its validation against eager (and the int4 gate)
  builder             ``python -m onnxruntime_genai.models.builder -i SRC -o OUT -p fp32|int4 -e cpu``
  optimum-intel       ``optimum-cli export openvino -m SRC --task text-generation-with-past
                      --weight-format fp32|int4 OUT``
  optimum-executorch  ``optimum-cli export executorch --model SRC --task text-generation --recipe xnnpack
                      --use_custom_sdpa --use_custom_kv_cache [--qlinear 8da4w] --output_dir OUT``
                      ``--max_seq_len 2048`` (optimum-executorch 1.1.0's flags; 2048 is the cache ours
                      makes by default, its own default would be the model's 4096 positions)
  --smollm2           one more row, ours only: ``hfexport export SMOLLM2 -f executorch --static-cache 256``
                      (`real_model.smollm2_folder()`: 30 layers, 538 MB fp32; issue 43's target: under 3 minutes)
Per row: wall seconds of the command (imports included: what a user waits for) and its peak RSS
(`resource.getrusage(RUSAGE_CHILDREN).ru_maxrss` read by a small wrapper process that runs only
that command: the largest resident set of the command and anything it waited for; file-backed
pages of mapped safetensors count, as the kernel counts them). Targets (issue 43): ours at most 2x
the builder's and optimum-intel's seconds, at most optimum-executorch's, and peak RSS at most 1.5x
the fp32 weights' bytes; the peak RSS of a process of the same interpreter that only imports what
the tool imports (`IMPORTS`) is printed beside it, and the growth over it. An export of ours that
our validation or accuracy gate refuses (exit 3, nothing written: the gate is its last step) keeps
its seconds and says so. For our rows the report's `timing` (`report.json`: seconds per phase,
summed over the components) is printed beside the wall time; `other` is the rest (interpreter and
library imports, loading the model, preparing, writing the folder outside a named phase). A vendor
tool that cannot be installed or fails is a row with its error. One run: the table is one
measurement on a shared 2-CPU machine, the load says how busy it was.

Rounds and a baseline, for a ratio this machine's drift does not decide (its speed moves by more
than a cut between two runs: the same export 13 to 20 s within an hour):
  --rounds N          each pair's rows N times in turn (the vendor's, ours, the baseline's; then again),
                      and a table of each round's ours / vendor and their median against the target
  --baseline SRC      ours again from another checkout (`SRC`: its `src` folder, put first on
                      `PYTHONPATH`; e.g. a `git worktree` of the commit before a change), as a row
                      `baseline` beside ours in every round

    python bench/export_vs_vendor.py --root R --model large --formats onnx --schemes fp32 --tools ours,builder \\
        --rounds 3 --baseline /tmp/wt-base/src
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FORMATS = ("onnx", "openvino", "executorch")
#: (format, scheme, vendor tool); each is measured beside `ours` on the same scheme
PAIRS = (("onnx", "fp32", "builder"), ("onnx", "int4", "builder"),
         ("openvino", "fp32", "optimum-intel"), ("openvino", "int4", "optimum-intel"),
         ("executorch", "fp32", "optimum-executorch"), ("executorch", "8da4w", "optimum-executorch"))
#: ours over theirs, at most (issue 43)
TIME_TARGET = {"onnx": 2.0, "openvino": 2.0, "executorch": 1.0}
RSS_TARGET = 1.5
VENVS = {"optimum-intel": "ov-venv", "optimum-executorch": "et-venv"}
#: our CLI's default LLM-program cache here (the model's positions up to 2048), given to optimum-executorch too
ET_CACHE = 2048
#: what each row's tool imports before it exports: a process importing only these is its RSS baseline
IMPORTS = {("ours", "onnx"): "torch, transformers, onnx, onnxscript, onnxruntime, hfexport.backends.onnx",
           ("builder", "onnx"): "torch, transformers, onnx, onnxruntime_genai.models.builder",
           ("ours", "openvino"): "torch, transformers, openvino, nncf, hfexport.backends.openvino",
           ("optimum-intel", "openvino"): "torch, transformers, openvino, nncf, optimum.intel",
           ("ours", "executorch"): "torch, transformers, torchao, executorch.exir, hfexport.backends.executorch",
           ("optimum-executorch", "executorch"): "torch, transformers, torchao, executorch.exir, optimum.executorch"}


# -- set-up (run in the project's interpreter) -----------------------------------------------------


def _run(command: list[str], log: Path) -> None:
    """Run `command`, its output appended to `log`; a failure raises with the log's last lines."""
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{' '.join(command[:6])} ... failed (exit {done.returncode}); see {log}:\n{tail}")


def _pins() -> dict[str, str]:
    """The project's tested versions (constraints.txt), by package name."""
    pins = {}
    for line in (HERE.parent / "constraints.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            pins[name.strip()] = version.strip()
    return pins


def vendor_cli(root: Path, tool: str) -> Path:
    """`optimum-cli` of `tool`'s venv under `root`, installed there once (never in the project's venv)."""
    venv = root / VENVS[tool]
    cli = venv / "bin" / "optimum-cli"
    python = venv / "bin" / "python"
    module = {"optimum-intel": "optimum.intel", "optimum-executorch": "optimum.executorch"}[tool]
    if cli.exists() and subprocess.run([str(python), "-c", f"import {module}"], capture_output=True).returncode == 0:
        return cli
    log = root / "setup.log"
    if not python.exists():
        _run(["python3.11", "-m", "venv", str(venv)], log)
    pins = _pins()
    pip = [str(python), "-m", "pip", "install"]
    if tool == "optimum-intel":
        _run(pip + [f"torch=={pins['torch']}", "optimum~=2.3.0", "transformers<5.6", f"nncf=={pins['nncf']}",
                    f"openvino=={pins['openvino']}", f"openvino-tokenizers=={pins['openvino-tokenizers']}"], log)
        # its torchvision requirement: no wheel imports beside the CPU torch 2.13 here; unused by a Llama
        _run(pip + ["--no-deps", "optimum-intel==2.2.0"], log)
        _run(pip + ["huggingface-hub>=0.23.2,<1.22", "requests>=2.33,<3.0", "setuptools"], log)  # its other needs
    else:
        _run(pip + [f"torch=={pins['torch']}", "optimum-executorch==1.1.0", f"executorch=={pins['executorch']}",
                    f"torchao=={pins['torchao']}"], log)
    return cli


# -- one row: a wrapper process that runs the command and reads its peak RSS ------------------------


def large_folder(root: Path, small: Path, layers: int = 3) -> Path:
    """`bench/large_model.py`'s random Llama at `layers` layers (vocabulary 32000, hidden 2048,
    intermediate 8192, 16/4 heads, untied head: 3 layers 1.25 GB of fp32 weights, issue 53's model for
    peak RSS beside the builder's; 16 layers 4.4 GB, 1.1B parameters) with the small model's
    tokenizer, made once under `root`."""
    folder = root / ("large-llama" if layers == 3 else f"large-llama-{layers}")
    if not (folder / "config.json").exists():
        from large_model import make_model

        make_model(folder, layers=layers)
        for tokenizer_file in small.glob("tokenizer*.json"):
            shutil.copy(tokenizer_file, folder / tokenizer_file.name)
    return folder


def measure_command(log: str, command: list[str]) -> None:
    """(The wrapper, one per row.) Run `command` to `log`; print its seconds, peak RSS and exit status."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        start = time.perf_counter()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        wall = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: KiB
    print(json.dumps({"wall": round(wall, 1), "peak_mb": round(peak_kb / 1024), "rc": done.returncode}))


#: our rows: ours, and ours from `--baseline`'s checkout
OURS = ("ours", "baseline")


def command_of(tool: str, fmt: str, scheme: str, source: Path, out: Path, root: Path) -> list[str]:
    if tool in OURS:
        command = [sys.executable, "-m", "hfexport", "export", str(source), "-f", fmt, "-o", str(out)]
        return command + (["--weight-format", scheme] if scheme != "fp32" else [])
    if tool == "builder":
        return [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(out),
                "-p", scheme, "-e", "cpu", "-c", str(out) + "-cache"]
    cli = str(vendor_cli(root, tool))
    if tool == "optimum-intel":
        return [cli, "export", "openvino", "-m", str(source), "--task", "text-generation-with-past",
                "--weight-format", scheme, str(out)]
    command = [cli, "export", "executorch", "--model", str(source), "--task", "text-generation", "--recipe",
               "xnnpack", "--use_custom_sdpa", "--use_custom_kv_cache", "--output_dir", str(out)]
    command += ["--max_seq_len", str(ET_CACHE)]  # the cache ours makes by default (its own default: 4096 here)
    return command + (["--qlinear", scheme] if scheme != "fp32" else [])


def run_row(tool: str, fmt: str, scheme: str, source: Path, root: Path, extra: list[str] = (), tag: str = "",
            baseline: Path | None = None) -> dict:
    """One row in a fresh wrapper process: seconds, peak RSS, the load before it, and ours' phases
    (`tool="baseline"`: ours with `baseline`, a checkout's `src`, first on `PYTHONPATH`)."""
    out = root / "out" / f"{fmt}-{scheme}-{tool}{tag}"
    for stale in (out, Path(str(out) + "-cache")):
        shutil.rmtree(stale, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    row = {"format": fmt, "scheme": scheme, "tool": tool, "load": round(os.getloadavg()[0], 1),
           "weight_bytes": weight_bytes(source)}
    try:
        command = command_of(tool, fmt, scheme, source, out, root) + list(extra)
    except RuntimeError as error:  # the vendor tool could not be installed
        return {**row, "error": f"install failed: {str(error).splitlines()[-1][:300]}"}
    log = root / "logs" / f"{out.name}.log"
    log.parent.mkdir(exist_ok=True)
    log.unlink(missing_ok=True)  # this run's row only
    env = None
    if tool == "baseline":
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(baseline),
                                                                          os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, __file__, "--measure", str(log), "--", *command],
                          capture_output=True, text=True, env=env)
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    row.update(measured, command=" ".join(command))
    if measured["rc"]:  # its last line, before the baseline's command is appended to the log
        tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:]
        row["error"] = f"exit {measured['rc']}: {tail[0][:400] if tail else 'no output'} (see {log})"
        if tool in OURS:  # no report.json: the CLI's progress lines say where the time went
            row["steps"] = steps(log)
    elif tool in OURS:
        row["phases"] = phases(out)
    python = command[0] if tool in (*OURS, "builder") else str(Path(command[0]).with_name("python"))
    imported = subprocess.run([sys.executable, __file__, "--measure", str(log), "--", python, "-c",
                               f"import {IMPORTS['ours' if tool in OURS else tool, fmt]}"],
                              capture_output=True, text=True, env=env)
    imports = json.loads(imported.stdout.strip().splitlines()[-1])
    row["imports_mb"] = imports["peak_mb"] if imports["rc"] == 0 else None
    return row


def phases(folder: Path) -> dict:
    """Seconds per phase of the report's `timing`, summed over the components."""
    from hfexport.timing import PHASES

    report = json.loads((folder / "report.json").read_text())
    timing = report.get("timing", {})
    return {p: round(sum(own.get(p, 0.0) for own in timing.values()), 1) for p in PHASES}


def steps(log: Path) -> dict:
    """Seconds per step from the CLI's progress lines (`[3/5] exporting ...: done in 27.5s`) of the last run."""
    found = {}
    text = log.read_text(errors="replace")
    start = text.rfind("-m hfexport export")  # the last export's output, up to the next command
    end = text.find("\n$ ", start)
    for line in text[start:end if end >= 0 else None].splitlines()[1:]:
        match = re.match(r"\[\d+/\d+\] (.*?)(?: \.\.\.)?: (?:done in|failed after) ([\d.]+)s$", line.strip())
        if match:
            found[match.group(1)] = float(match.group(2))
    return found


def weight_bytes(source: Path) -> int:
    return sum(f.stat().st_size for f in source.glob("*.safetensors"))


# -- the table -----------------------------------------------------------------------------------------


def markdown(result: dict) -> str:
    from hfexport.timing import PHASES

    weights = result["weight_bytes"]
    lines = [f"{result['started']} - {result['ended']}, fp32 weights {weights / 1e6:.0f} MB (RSS / weights: over the "
             "row's model's fp32 weights); each row one process "
             "after the other, the load average (1 min) taken before it.", "",
             "| format | scheme | tool | wall s | peak RSS MB | RSS / weights | imports-only RSS MB "
             "| (peak - imports) / weights | ours / theirs (time) | target met | load |",
             "|" + "---|" * 11]
    rows = result["rows"]
    theirs = {(r["format"], r["scheme"], r.get("round")): r for r in rows if r["tool"] not in OURS}
    for r in rows:
        if "error" in r and "wall" not in r:
            lines.append(f"| {r['format']} | {r['scheme']} | {r['tool']} | - | - | - | - | - | - | {r['error']} | "
                         f"{r['load']} |")
            continue
        rss = r["peak_mb"] * 2**20 / r["weight_bytes"]
        ratio, verdict = "-", "-"
        # exit 3: our validation or accuracy gate refused the export after every step (the gate is the
        # last): its seconds are a whole export's, so the ratio is still shown, beside the refusal
        refused = r["tool"] in OURS and r["rc"] == 3
        if "error" in r and not refused:
            verdict = f"failed: {r['error']}"
        elif r["tool"] in OURS:
            vendor = theirs.get((r["format"], r["scheme"], r.get("round")))
            checks = []
            if vendor and "error" not in vendor:
                share = r["wall"] / vendor["wall"]
                ratio = f"{share:.2f}x"
                limit = TIME_TARGET[r["format"]]
                checks.append(f"time {'met' if share <= limit else '**miss**'} (<= {limit:g}x)")
                checks.append(f"RSS {'met' if r['peak_mb'] <= vendor['peak_mb'] else '**miss**'} (<= theirs, "
                              f"{r['peak_mb'] / vendor['peak_mb']:.2f}x)")
            elif "SmolLM2" in r["format"]:
                checks.append(f"time {'met' if r['wall'] <= 180 else '**miss**'} (< 3 min)")
            else:
                checks.append("time: no vendor row to compare")
            checks.append(f"RAM {'met' if rss <= RSS_TARGET else '**miss**'} (<= {RSS_TARGET:g}x)")
            if refused:  # the refusal's reason, without its advice (the log has it whole)
                reason = r["error"].partition("error: ")[2].partition(", their logits")[0] or r["error"]
                checks.append(f"**refused (exit 3), nothing written**: {reason}")
            verdict = ", ".join(checks)
        base = r.get("imports_mb")
        growth = f"{(r['peak_mb'] - base) * 2**20 / r['weight_bytes']:.2f}x" if base else "-"
        tool = r["tool"] if r.get("round") is None else f"{r['tool']} (round {r['round']})"
        lines.append(f"| {r['format']} | {r['scheme']} | {tool} | {r['wall']} | {r['peak_mb']} | {rss:.2f}x | "
                     f"{base or '-'} | {growth} | {ratio} | {verdict} | {r['load']} |")
    ours = [r for r in rows if "phases" in r]
    if ours:
        lines += ["", "Our rows' time by phase (`report.json`'s `timing`, seconds summed over the components; "
                  "`other`: imports, loading, preparing, writing outside a phase):", "",
                  "| row | wall s | " + " | ".join(PHASES) + " | other |", "|" + "---|" * (len(PHASES) + 3)]
        for r in ours:
            named = sum(r["phases"].values())
            who = "" if r["tool"] == "ours" else f" ({r['tool']})"
            who += "" if r.get("round") is None else f" round {r['round']}"
            lines.append(f"| {r['format']} {r['scheme']}{who} | {r['wall']} | "
                         + " | ".join(str(r["phases"][p]) for p in PHASES) + f" | {r['wall'] - named:.1f} |")
    lines += rounds_table(rows, theirs)
    for r in rows:
        if r.get("steps"):
            lines += ["", f"{r['format']} {r['scheme']} (ours, refused: no report.json), the CLI's steps: "
                      + "; ".join(f"{what} {seconds:g} s" for what, seconds in r["steps"].items())]
    return "\n".join(lines) + "\n"


def rounds_table(rows: list[dict], theirs: dict) -> list[str]:
    """`--rounds`' lines: per pair and row of ours, each round's seconds beside the vendor's in the
    same round, their ratio and its median against the target; nothing for a run of one round."""
    import statistics

    lines = []
    keys = dict.fromkeys((r["format"], r["scheme"], r["tool"]) for r in rows
                         if r["tool"] in OURS and r.get("round") is not None)
    for fmt, scheme, tool in keys:
        mine = [r for r in rows if (r["format"], r["scheme"], r["tool"]) == (fmt, scheme, tool) and "wall" in r]
        vendor_of = {r["round"]: theirs.get((fmt, scheme, r["round"]), {}) for r in mine}
        pairs = [(vendor_of[r["round"]], r) for r in mine if "wall" in vendor_of[r["round"]]]
        if not pairs:
            continue
        if not lines:
            lines = ["", "Rounds (each round the vendor's row, then ours, then the baseline's; ratios within a round):",
                     "", "| format | scheme | row | vendor s | row s | row / vendor | median | target |",
                     "|" + "---|" * 8]
        ratios = [r["wall"] / vendor["wall"] for vendor, r in pairs]
        middle = statistics.median(ratios)
        limit = TIME_TARGET[fmt]
        lines.append(f"| {fmt} | {scheme} | {tool} | {', '.join(str(v['wall']) for v, _ in pairs)} | "
                     f"{', '.join(str(r['wall']) for _, r in pairs)} | {', '.join(f'{x:.2f}' for x in ratios)} | "
                     f"{middle:.2f}x | {'met' if middle <= limit else '**miss**'} (<= {limit:g}x) |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=str(Path.home() / ".cache" / "hfexport" / "export-vendor-bench"),
                        help="the vendor venvs, the model folder, the exports and their logs (made once, reused)")
    parser.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated, from {', '.join(FORMATS)}")
    parser.add_argument("--schemes", default="fp32,int4,8da4w", help="comma-separated: fp32, int4 (onnx, openvino), "
                        "8da4w (executorch)")
    parser.add_argument("--tools", default="ours,vendor", help="comma-separated: ours, vendor (each format's), "
                        "or a vendor tool's name: builder, optimum-intel, optimum-executorch")
    parser.add_argument("--model", choices=("small", "large", "1b", "smollm2"), default="small",
                        help="small: the 134 MB random Llama; large: a 1.25 GB one (`large_folder`, issue 53's "
                        "memory row); 1b: the same at 16 layers (4.4 GB, 1.1B parameters); smollm2: "
                        "SmolLM2-135M-Instruct (30 layers, 538 MB; `real_model.smollm2_folder`)")
    parser.add_argument("--smollm2", action="store_true",
                        help="also our ExecuTorch LLM program of SmolLM2-135M (fp32, cache 256): one row, ours only")
    parser.add_argument("--rounds", type=int, default=1,
                        help="each pair's rows this many times in turn, with each round's ratio and their median")
    parser.add_argument("--baseline", type=Path,
                        help="also ours from this checkout's `src` (first on PYTHONPATH): a `baseline` row a round")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    parser.add_argument("--table", type=Path, help="print the table of an earlier run's --json, measure nothing")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.table:
        print(markdown(json.loads(args.table.read_text())))
        return
    if args.measure:
        measure_command(args.measure, rest[1:] if rest[:1] == ["--"] else rest)
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.rounds < 1:
        parser.error("--rounds takes a count of 1 or more")
    if args.baseline is not None:
        args.baseline = args.baseline.resolve()  # on PYTHONPATH, whatever folder the rows run in
        if not (args.baseline / "hfexport" / "__init__.py").is_file():
            parser.error(f"--baseline {args.baseline}: no hfexport package there (give a checkout's `src` folder)")
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE))
    from runner_vs_vendor import source_folder

    if args.model == "smollm2":
        from real_model import smollm2_folder

        source = smollm2_folder()
    else:
        source = (source_folder(root) if args.model == "small" else
                  large_folder(root, source_folder(root), layers=16 if args.model == "1b" else 3))
    tag = "" if args.model == "small" else f"-{args.model}"
    formats, schemes = args.formats.split(","), args.schemes.split(",")
    tools = args.tools.split(",")
    pairs = [p for p in PAIRS if p[0] in formats and p[1] in schemes]
    # the vendor venvs' set-up first, so that no install falls inside a timed row
    for tool in sorted({tool for _, _, tool in pairs} & set(VENVS) & set(tools)):
        try:
            vendor_cli(root, tool)
        except RuntimeError as error:
            print(f"{tool}: set-up failed, its rows will say so\n{error}", flush=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    for fmt, scheme, tool in pairs:
        who = [t for t in (tool, "ours") if t in tools or (t != "ours" and "vendor" in tools)]
        who += ["baseline"] if args.baseline is not None and "ours" in who else []
        for round_ in range(1, args.rounds + 1):
            for one in who:
                row = run_row(one, fmt, scheme, source, root, tag=tag, baseline=args.baseline)
                rows.append({**row, "round": round_} if args.rounds > 1 else row)
                print(json.dumps(rows[-1]), flush=True)
    if args.smollm2:
        from real_model import smollm2_folder

        row = run_row("ours", "executorch", "fp32", smollm2_folder(), root, ["--static-cache", "256"], "-smollm2")
        rows.append({**row, "format": "executorch (SmolLM2-135M, cache 256)"})
        print(json.dumps(rows[-1]), flush=True)
    result = {"started": started, "ended": time.strftime("%H:%M UTC", time.gmtime()),
              "weight_bytes": weight_bytes(source), "rows": rows}
    table = markdown(result)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.markdown:
        args.markdown.write_text(table)


if __name__ == "__main__":
    main()
