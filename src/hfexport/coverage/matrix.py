"""Run the coverage cases in subprocesses, judge them against the known failures, write the page.

The page and its JSON go where `check_outputs` allows: each a new file, or one hfexport wrote, known
by its content (a page that still starts with the header `render_markdown` writes, a JSON that
`load_results` reads); hfexport never replaces a file it did not write.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..errors import OutputFolderError
from ..folder.output_folder import check_writable
from ..folder.storage import atomic_file
from ..job.executors import LOST, Cell, Executor, LocalExecutor, run_subprocess
from .known_failures import BACKENDS, KNOWN_FAILURES, MODES, KnownFailure

__all__ = ["KNOWN_FAILURES", "RERUN_ON_RESUME", "CaseResult", "KnownFailure", "applicable", "case_cell",
           "check_outputs", "done_results", "is_coverage_page", "load_results", "merge_results", "reads_audio",
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
    """`generate` only for models that generate; `generate-image` only for image-text models that do,
    `generate-audio` only for those that generate from audio (`reads_audio`): a speech encoder-decoder
    or an audio-text LLM. An encoder of audio (wav2vec2) has neither, as a text model has no image."""
    from ..presets import PRESETS

    preset = PRESETS[arch]
    if mode == "generate-image":
        return preset.generative and preset.kind == "multimodal" and not reads_audio(arch)
    if mode == "generate-audio":
        return preset.generative and reads_audio(arch)
    return mode == "export" or preset.generative


def reads_audio(arch: str) -> bool:
    """Whether the preset `arch`'s model reads audio: an audio tower (Qwen2-Audio's `audio_config`),
    or audio features as its main input (Whisper's and Speech2Text's `input_features`)."""
    import transformers

    from ..presets import PRESETS

    preset = PRESETS[arch]
    model_class = getattr(transformers, preset.model_class)
    return "audio_config" in preset.config or model_class.main_input_name in ("input_features", "input_values")


def run_case(arch: str, backend: str, mode: str, timeout: float = 900, threads: int | None = None) -> CaseResult:
    """Run one case in a subprocess (`python -m hfexport.coverage.case`) and read its result: one
    attempt (the executors of `run_matrix` run a case once more when its process was killed)."""
    return _attempt(arch, backend, mode, timeout, threads)[0]


def case_cell(arch: str, backend: str, mode: str, timeout: float, threads: int | None) -> dict[str, Any]:
    """One case as an executor's cell (`hfexport.job.executors`): `run_case`'s result as a dict,
    marked `LOST` when its process was killed before it gave one."""
    result, lost = _attempt(arch, backend, mode, timeout, threads)
    return {**result.to_dict(), LOST: lost}


def _attempt(arch: str, backend: str, mode: str, timeout: float, threads: int | None) -> tuple[CaseResult, bool]:
    """`(result, whether the process was killed before giving one)`."""
    from ..presets import PRESETS

    kind = PRESETS[arch].kind
    known = KNOWN_FAILURES.get((arch, backend, mode))
    outcome = run_subprocess([sys.executable, "-m", "hfexport.coverage.case", arch, backend, mode],
                             timeout=timeout, threads=threads or os.cpu_count() or 1,
                             env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if outcome.timed_out:
        return CaseResult(arch, kind, backend, mode, "timeout", f"no result after {timeout:.0f} s (in {outcome.stage})",
                          timeout, known=known), False
    if outcome.result is not None:
        result = dict(outcome.result)
        status, detail, seconds = result.pop("status"), result.pop("detail", None), result.pop("seconds", None)
        if status == "runtime failure" and (log := _runtime_log(outcome.stderr)):
            detail = f"{detail} [{log}]"
        return CaseResult(arch, kind, backend, mode, status, detail, seconds, result, known), False
    # no RESULT line: the process died (a segfault in a runtime, out of memory, ...)
    return CaseResult(arch, kind, backend, mode, "crash", outcome.how(), known=known), outcome.is_lost


_RUNTIME_LOG = re.compile(r"^\[[\w.]+:\d+\] (.*(?:Check failed|KernelCall failed|Attempted to resize|Error|error).*)$")


def _runtime_log(stderr: str) -> str:
    """The lines a native runtime logged about its failure (ExecuTorch's `[op_x.cpp:N] Check failed ...`):
    its Python error is generic (`method->execute() failed with error 0x12`), its log says which kernel
    rejected which argument."""
    found = [m.group(1).strip() for line in stderr.splitlines() if (m := _RUNTIME_LOG.match(line.strip()))]
    return "; ".join(dict.fromkeys(found))[:400]


#: Statuses `--resume` runs again: a crash or a timeout may say more about the machine than the case.
RERUN_ON_RESUME = ("crash", "timeout")


def done_results(results: Iterable[CaseResult]) -> list[CaseResult]:
    """The cases of a saved matrix that a resumed run keeps: every status but `RERUN_ON_RESUME`."""
    return [r for r in results if r.status not in RERUN_ON_RESUME]


def run_matrix(archs: Iterable[str] | None = None, backends: Iterable[str] = BACKENDS,
               modes: Iterable[str] = MODES, *, timeout: float = 900, jobs: int = 1,
               executor: Executor | None = None, done: Iterable[CaseResult] = (),
               on_result: Callable[[CaseResult], None] | None = None) -> list[CaseResult]:
    """Run every applicable (architecture, backend, mode) case; results in table order.

    Args:
        archs: preset names (default: all of `hfexport.presets`).
        timeout: seconds one case may take before it counts as `timeout`.
        jobs: cases run at once by the default executor; each gets `cpu_count // jobs` threads.
        executor: where the cases run (default `LocalExecutor(jobs)`; `RayExecutor()` on Ray).
        done: cases already run (a resumed matrix, `done_results`): kept as they are, not run again.
        on_result: called as each case finishes (progress, saving).
    """
    from ..presets import PRESETS

    archs = list(archs or PRESETS)
    unknown = [a for a in archs if a not in PRESETS]
    if unknown:
        raise ValueError(f"unknown architectures {unknown}; known: {', '.join(PRESETS)}")
    cases = [(a, b, m) for a in archs for b in backends for m in modes if applicable(a, m)]
    kept = {(r.arch, r.backend, r.mode): r for r in done}
    results = {case: kept[case] for case in cases if case in kept}
    executor = executor or LocalExecutor(jobs)
    cells = [Cell(case, case_cell, (*case, timeout, executor.threads),
                  {"arch": case[0], "kind": PRESETS[case[0]].kind, "backend": case[1], "mode": case[2]})
             for case in cases if case not in kept]

    def finished(cell: Cell, data: dict[str, Any]) -> None:
        results[cell.key] = result = CaseResult.from_dict(data)
        if on_result:
            on_result(result)

    executor.run(cells, finished)
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


#: The type of each field of a `CaseResult` as the results JSON holds it.
_CASE_TYPES = {"arch": str, "kind": str, "backend": str, "mode": str, "status": str, "detail": (str, type(None)),
               "seconds": (int, float, type(None)), "extra": dict}


def load_results(path: Path) -> tuple[list[CaseResult], list[str]]:
    """The cases and the run descriptions of a results JSON written by `hfexport coverage`; a
    `ValueError` saying why when `path` is not one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8 text ({error.reason})") from None
    if not (isinstance(data, dict) and isinstance(data.get("runs"), list) and isinstance(data.get("results"), list)):
        raise ValueError("not an object with the runs and results of hfexport coverage")
    if not all(isinstance(run, str) for run in data["runs"]):
        raise ValueError("its runs are not command lines")
    for item in data["results"]:
        if not isinstance(item, dict) or not all(isinstance(item.get(k, {} if k == "extra" else None), t)
                                                 for k, t in _CASE_TYPES.items()):
            raise ValueError(f"a case is not what hfexport coverage writes: {str(item)[:80]}")
    return [CaseResult.from_dict(item) for item in data["results"]], list(data["runs"])


#: The first lines `render_markdown` writes: a file that still starts with them is a page hfexport wrote.
_PAGE_HEADER = re.compile(r"# Coverage matrix\n\nGenerated \d{4}-\d{2}-\d{2} on [^\n]*, "
                          r"from `hfexport coverage[^\n]*`\.\n")


def is_coverage_page(path: Path) -> bool:
    """Whether the file at `path` is a coverage page hfexport wrote: it starts with the header
    `render_markdown` writes (the title, then `Generated DATE on ..., from `hfexport coverage ...`.`)."""
    try:
        with open(path, "rb") as stream:
            start = stream.read(1 << 16)  # the header, however many runs it lists; not a whole large file
    except OSError:  # unreadable: nothing says hfexport wrote it
        return False
    text = start.decode("utf-8", errors="replace").replace("\r\n", "\n")  # as written on Windows
    return bool(_PAGE_HEADER.match(text))


def check_outputs(page: str | os.PathLike) -> Path:
    """Refuse, with `OutputFolderError` and before any case runs, a `page` path `hfexport coverage`
    may not write, or whose JSON beside it (`page` with the suffix `.json`) it may not: a path
    nothing can be written at (`check_writable`), or a file already there that hfexport did not
    write (`is_coverage_page`, `load_results`).

    Returns:
        The path of the results JSON.
    """
    given, page = Path(page), Path(os.path.abspath(page))
    saved = page.with_suffix(".json")
    other = f"name another page (-o {page.with_name(page.stem + '-coverage.md')})"
    if saved == page:
        raise OutputFolderError(f"cannot write the coverage page at {page}: its results JSON goes beside it, as "
                                f"{saved.name}, the page's own name", remedy="name the page's Markdown file (-o "
                                f"{page.with_suffix('.md')})")
    check_writable(page, "the coverage page", writes="file", new_name="coverage.md")
    check_writable(saved, "the coverage results", writes="file", new_name="coverage.json")
    if page.exists() and not is_coverage_page(page):
        raise OutputFolderError(f"{page} is not a coverage page hfexport wrote (it does not start with the title and "
                                "the 'Generated ... from `hfexport coverage ...`' line hfexport writes); hfexport "
                                "never replaces a file it did not write", remedy=f"{other}, or move {page} away")
    if saved.exists():
        try:
            load_results(saved)
        except (OSError, ValueError) as error:
            raise OutputFolderError(f"{saved}, where the page's results go, is not the results JSON of hfexport "
                                    f"coverage ({error}); hfexport never replaces a file it did not write",
                                    remedy=f"{other}, or move {saved} away") from None
    return given.with_suffix(".json")


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
        "greedy tokens from the saved export (`GenerationRunner`) against `model.generate` (text models and "
        "speech encoder-decoders, on the sample inputs; an image-text or audio-text model's components only). "
        "`generate-image`: the same for an image-text model, "
        "its greedy tokens generated from the prompt's image (image encoder, merge, language model, decode) "
        "against `model.generate`. `generate-audio`: the same for a model that generates from audio, on two "
        "generated clips (a tone with noise, a chirp) through the saved processor (`generate_from_audio`): a "
        "speech encoder-decoder's tokens against `model.generate(input_features=...)` of the model's feature "
        "extractor, an audio-text LLM's against `model.generate(**processor(text=..., audio=...))`.",
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
