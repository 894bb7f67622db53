"""Run the coverage cases in subprocesses, judge them against the known failures, write the page."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..storage import atomic_file
from .known_failures import BACKENDS, KNOWN_FAILURES, MODES, KnownFailure

__all__ = ["KNOWN_FAILURES", "CaseResult", "KnownFailure", "applicable", "load_results", "merge_results",
           "render_markdown", "run_case", "run_matrix", "save_results"]

FAILED = ("export failure", "runtime failure", "mismatch", "timeout", "crash")


@dataclasses.dataclass
class CaseResult:
    """One cell of the matrix: a (architecture, backend, mode) case, its status and the first line of its error."""
    arch: str
    kind: str
    backend: str
    mode: str
    status: str
    detail: str | None = None
    seconds: float | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    known: KnownFailure | None = None

    @property
    def verdict(self) -> str:
        """The status judged against the known failures."""
        if self.known is None:
            return self.status
        return "unexpected pass" if self.status == "ok" else "known failure"

    def to_dict(self) -> dict[str, Any]:
        """The case as the results JSON stores it, its verdict against the known failures included."""
        out = dataclasses.asdict(self)
        out["verdict"] = self.verdict
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseResult:
        """Back from `to_dict` (a saved matrix); the known failure is looked up anew."""
        fields = {f.name for f in dataclasses.fields(cls)} - {"known"}
        result = cls(**{k: v for k, v in data.items() if k in fields})
        result.known = KNOWN_FAILURES.get((result.arch, result.backend, result.mode))
        return result


def merge_results(previous: list[CaseResult], new: list[CaseResult]) -> list[CaseResult]:
    """`previous` with the cases `new` re-ran replaced, and `new`'s other cases appended."""
    fresh = {(r.arch, r.backend, r.mode): r for r in new}
    merged = [fresh.pop((r.arch, r.backend, r.mode), r) for r in previous]
    return merged + list(fresh.values())


def applicable(arch: str, mode: str) -> bool:
    """`generate` only for models that generate."""
    from ..presets import PRESETS

    return mode == "export" or PRESETS[arch].generative


def run_case(arch: str, backend: str, mode: str, timeout: float = 900, threads: int | None = None) -> CaseResult:
    """Run one case in a subprocess (`python -m hfexport.coverage.case`) and read its result."""
    from ..presets import PRESETS

    kind = PRESETS[arch].kind
    known = KNOWN_FAILURES.get((arch, backend, mode))
    threads = threads or os.cpu_count() or 1
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    command = [sys.executable, "-m", "hfexport.coverage.case", arch, backend, mode]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as expired:
        stage = _last_stage(expired.stdout)
        return CaseResult(arch, kind, backend, mode, "timeout", f"no result after {timeout:.0f} s (in {stage})",
                          timeout, known=known)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            status, detail, seconds = result.pop("status"), result.pop("detail", None), result.pop("seconds", None)
            if status == "runtime failure" and (log := _runtime_log(done.stderr)):
                detail = f"{detail} [{log}]"
            return CaseResult(arch, kind, backend, mode, status, detail, seconds, result, known)
    # no RESULT line: the process died (a segfault in a runtime, out of memory, ...)
    stage = _last_stage(done.stdout)
    tail = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "")[:300]
    how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit code {done.returncode}"
    return CaseResult(arch, kind, backend, mode, "crash", f"{how} in {stage}: {tail}", known=known)


_RUNTIME_LOG = re.compile(r"^\[[\w.]+:\d+\] (.*(?:Check failed|KernelCall failed|Attempted to resize|Error|error).*)$")


def _runtime_log(stderr: str) -> str:
    """The lines a native runtime logged about its failure (ExecuTorch's `[op_x.cpp:N] Check failed ...`):
    its Python error is generic (`method->execute() failed with error 0x12`), its log says which kernel
    rejected which argument."""
    found = [m.group(1).strip() for line in stderr.splitlines() if (m := _RUNTIME_LOG.match(line.strip()))]
    return "; ".join(dict.fromkeys(found))[:400]


def _last_stage(stdout: str | bytes | None) -> str:
    text = stdout.decode(errors="replace") if isinstance(stdout, bytes) else (stdout or "")
    stages = [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("STAGE ")]
    return stages[-1] if stages else "startup"


def run_matrix(archs: Iterable[str] | None = None, backends: Iterable[str] = BACKENDS,
               modes: Iterable[str] = MODES, *, timeout: float = 900, jobs: int = 1,
               on_result: Callable[[CaseResult], None] | None = None) -> list[CaseResult]:
    """Run every applicable (architecture, backend, mode) case; results in table order.

    Args:
        archs: preset names (default: all of `hfexport.presets`).
        timeout: seconds one case may take before it counts as `timeout`.
        jobs: cases run at once; each gets `cpu_count // jobs` threads.
        on_result: called as each case finishes (progress).
    """
    from ..presets import PRESETS

    archs = list(archs or PRESETS)
    unknown = [a for a in archs if a not in PRESETS]
    if unknown:
        raise ValueError(f"unknown architectures {unknown}; known: {', '.join(PRESETS)}")
    cases = [(a, b, m) for a in archs for b in backends for m in modes if applicable(a, m)]
    threads = max(1, (os.cpu_count() or 1) // max(1, jobs))
    results: dict[tuple[str, str, str], CaseResult] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(run_case, *case, timeout, threads): case for case in cases}
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            results[futures[future]] = result
            if on_result:
                on_result(result)
    return [results[case] for case in cases]


_MARK = {"ok": "ok", "known failure": "known", "unexpected pass": "XPASS", "export failure": "export ✗",
         "runtime failure": "runtime ✗", "mismatch": "mismatch ✗", "timeout": "timeout ✗", "crash": "crash ✗"}


def _versions() -> dict[str, str]:
    from .._versions import TESTED_VERSIONS, package_status

    return {name: package_status(name).installed or "missing" for name in TESTED_VERSIONS}


def _cell(result: CaseResult | None) -> str:
    if result is None:
        return ""
    static_only = result.verdict == "ok" and result.extra.get("dynamic_checked") is False
    return _MARK[result.verdict] + (" (static only)" if static_only else "")


def save_results(path: Path, results: list[CaseResult], runs: list[str]) -> None:
    """The matrix as JSON: the commands it comes from and every case."""
    with atomic_file(path) as stream:
        json.dump({"runs": runs, "results": [r.to_dict() for r in results]}, stream, indent=1, default=str)


def load_results(path: Path) -> tuple[list[CaseResult], list[str]]:
    """The cases and the run descriptions of a results JSON written by `hfexport coverage`."""
    data = json.loads(path.read_text())
    return [CaseResult.from_dict(item) for item in data["results"]], list(data["runs"])


def render_markdown(results: list[CaseResult], runs: Sequence[str] = ("hfexport coverage",)) -> str:
    """The coverage page: the runs it comes from, the grid, the failures with their first error line,
    the known failures."""
    from ..presets import PRESETS

    present = {(r.backend, r.mode) for r in results}
    columns = [(b, m) for b in BACKENDS for m in MODES if (b, m) in present]
    cells = {(r.arch, r.backend, r.mode): r for r in results}
    archs = list(dict.fromkeys(r.arch for r in results))
    lines = [
        "# Coverage matrix",
        "",
        f"Generated {datetime.date.today().isoformat()} on {platform.machine()} ({os.cpu_count()} CPUs), "
        f"Python {platform.python_version()}, from " + ", then ".join(f"`{run}`" for run in runs) + ".",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in _versions().items()) + ".",
        "",
        "Each cell is one subprocess: a tiny random model of the architecture (`hfexport.presets`) is exported "
        "with `dynamic=True`, the artifact runs in its own runtime and is compared with eager PyTorch. "
        "`export`: the whole model as one graph, at the sample shape and at a second batch size and sequence "
        "length. `generate`: every component of `export_for_generation` against its eager submodule, then "
        "greedy tokens from the saved export (`GenerationRunner`) against `model.generate` (text models).",
        "",
    ]
    missing = [f"{b} {m}" for b in BACKENDS for m in MODES if (b, m) not in present]
    if missing:
        lines += ["Not run in these results: " + ", ".join(missing) + ".", ""]
    verdicts = [r.verdict for r in results]
    lines.append("Totals: " + ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(
        ["ok", "known failure", "unexpected pass", *FAILED]) if verdicts.count(v)) + f" (of {len(results)} cases).")
    lines += ["", "| architecture | kind | " + " | ".join(f"{b} {m}" for b, m in columns) + " |",
              "|---|---|" + "---|" * len(columns)]
    for arch in archs:
        row = [_cell(cells.get((arch, backend, mode))) for backend, mode in columns]
        lines.append(f"| {arch} | {PRESETS[arch].kind} | " + " | ".join(row) + " |")
    problems = [r for r in results if r.verdict != "ok"]
    if problems:
        lines += ["", "## Failures", "", "| case | status | first line |", "|---|---|---|"]
        for r in problems:  # what happened; the known ones' reasons are in the table below
            detail = (r.detail or "").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {r.arch} {r.backend} {r.mode} | {r.verdict} | {detail} |")
    unchecked = [r for r in results if r.status == "ok" and r.extra.get("dynamic_checked") is False]
    if unchecked:
        lines += ["", "Checked at the sample shape only (eager PyTorch itself rejects a resized input, e.g. an "
                  "audio length tied to its positions): " + ", ".join(f"{r.arch} {r.backend}" for r in unchecked) + "."]
    lines += ["", "## Known failures", "", "Declared in `hfexport.coverage.KNOWN_FAILURES`; a case that starts to "
              "pass shows as XPASS.", "", "| case | reason |", "|---|---|"]
    for (arch, backend, mode), known in KNOWN_FAILURES.items():
        bug = f" ({known.upstream})" if known.upstream else ""
        lines.append(f"| {arch} {backend} {mode} | {known.reason}{bug} |")
    return "\n".join(lines) + "\n"
