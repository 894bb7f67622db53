"""Batch exports: each model of a list to each format, each export in its own subprocess, here or on Ray.

```
run_batch(read_model_list("models.txt"), ["dynamo", "onnx"], "out", executor=RayExecutor())
  out/<model-slug>/<format>/   what `hfexport export` writes: artifacts, manifest, report.json
  out/summary.json             every export: status, first line of its error, seconds, artifact bytes
  out/summary.md               the same as a table
```
The output folder is new or empty, or holds an earlier batch that `resume=True` continues (its
`summary.json` says so) and nothing that batch did not write: `check_batch_folder`, before any export.
`summary.md` is replaced only while it is the page that batch wrote (`summary.json` holds its
SHA-256); hfexport never replaces a file it did not write.

Each export is the export job (`hfexport.job.export.export_to_folder`, validation included) run as
`python -m hfexport.job.batch_item` with a timeout, by the executors of the coverage matrix
(`hfexport.job.executors`): a crash or a hang costs one export, a killed worker is retried
once, and `summary.json` is saved after every finished export so that `resume=True` runs only
those not done. On a cluster, the output folder must be one that every node can write.

A list is a `.txt` file, one model a line (`tiny:llama`, a local folder, a hub id; `#` starts a
comment), or a `.json` list of models or of objects `{"model": ..., "generate": true, ...}` whose
other keys are options of the export job (`OPTIONS`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..errors import OutputFolderError
from ..folder.manifest import sha256_of
from ..folder.output_folder import check_writable, folder_entries, listing
from ..folder.storage import atomic_file
from .executors import LOST, Cell, Executor, LocalExecutor, run_subprocess
from .options import JobOptions

__all__ = ["OPTIONS", "PAGE", "RERUN_ON_RESUME", "SUMMARY", "BatchItem", "BatchResult", "EarlierBatch",
           "check_batch_folder", "export_cell", "load_summary", "name_problem", "read_model_list", "render_summary",
           "run_batch", "save_summary"]

#: Keys an object of a `.json` list may have besides `model`: `name` (the folder, instead of the
#: model's slug), `dynamic` (default true) and these options of the export job, by their own names
#: (`JobOptions.from_dict` puts each in its group).
OPTIONS = ("task", "generate", "multi_token_decode", "static_cache", "quantize", "validate", "atol", "rtol",
           "min_cosine", "min_cache_cosine", "prompt", "dtype")
#: Statuses `resume` runs again: a crash or a timeout may say more about the machine than the export.
RERUN_ON_RESUME = ("crash", "timeout")
SUMMARY = "summary.json"
PAGE = "summary.md"
#: The key that marks `summary.json` as an hfexport batch's, and its layout's version (one written
#: before the mark is read the same way: its runs and results say what it is).
BATCH_MARK, BATCH_VERSION = "hfexport_batch", 1


#: What a folder name of the batch may hold: letters (`\w` takes Unicode's), digits, `.`, `_`, `-`.
_NAME_CHARACTERS = re.compile(r"[\w.-]+")


def name_problem(name: Any) -> str | None:
    """Why `name` cannot be the folder of a model's exports inside the output folder, or None.

    The folder is `<output>/<name>`: a name must stay one plain folder there, so that a list cannot
    have exports written outside the output folder, nor into a hidden folder."""
    if not isinstance(name, str) or not name:
        return "is not a non-empty string"
    if name.startswith(("/", "\\")):
        return "is an absolute path"
    if re.match(r"[A-Za-z]:", name):
        return "starts with a drive (C:)"
    if "/" in name or "\\" in name:
        return "holds a path separator (/ or \\)"
    if ".." in name:
        return "holds '..'"
    if name.startswith("."):
        return "starts with a dot (a hidden folder)"
    if not _NAME_CHARACTERS.fullmatch(name):
        return "holds characters other than letters, digits, '.', '_' and '-'"
    return None


def _plain_name(text: str) -> str:
    """`text` made a name `name_problem` accepts (what the error suggests, and a model's slug)."""
    text = re.sub(r"[^\w.-]+", "_", text)
    text = re.sub(r"\.{2,}", ".", text).lstrip(".")
    return text or "model"


@dataclasses.dataclass(frozen=True)
class BatchItem:
    """One model of the list: its spec, the options of its export and the folder name it gets.

    A `name` that is not one plain folder name (`name_problem`), or options the export job refuses
    (`JobOptions.from_dict`), are refused with a `ValueError` when the list is read, before any export."""

    model: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    name: str | None = None

    def __post_init__(self) -> None:
        problem = None if self.name is None else name_problem(self.name)
        if problem:
            raise ValueError(f"the name {self.name!r} of {self.model} {problem}: it is the folder of this model's "
                             "exports inside the output folder; give one plain folder name (letters, digits, "
                             f"'.', '_', '-'), e.g. {_plain_name(str(self.name))!r}")
        self.job_options()

    def job_options(self) -> JobOptions:
        """The export job's options this item's export runs with (`dynamic` is the config's)."""
        try:
            return JobOptions.from_dict({k: v for k, v in self.options.items() if k != "dynamic"})
        except ValueError as error:
            raise ValueError(f"the options of {self.model}: {error}") from None

    @property
    def slug(self) -> str:
        """The folder of this model's exports: `name`, or the model with `/` as `--` (`tiny-llama`,
        `org--model`; a model such as `..` gets no dot-led folder)."""
        if self.name is not None:
            return self.name
        text = re.sub(r"^(\.{0,2}/)+", "", self.model.strip().rstrip("/")).replace("/", "--").replace(":", "-")
        return _plain_name(re.sub(r"[^A-Za-z0-9._-]+", "_", text))

    def spec(self) -> dict[str, Any]:
        """What the subprocess is told: the model and its options."""
        return {"model": self.model, **self.options}


def _item(entry: Any, where: str) -> BatchItem:
    if isinstance(entry, str):
        return BatchItem(entry)
    if not isinstance(entry, dict) or not isinstance(entry.get("model"), str):
        raise ValueError(f"{where}: an entry is a model string or an object with a \"model\" string; got {entry!r}")
    unknown = sorted(set(entry) - {"model", "name", "dynamic", *OPTIONS})
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown} for {entry['model']}; use model, name, dynamic, "
                         + ", ".join(OPTIONS))
    options = {k: v for k, v in entry.items() if k not in ("model", "name")}
    try:
        return BatchItem(entry["model"], options, entry.get("name"))
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def read_model_list(path: str | Path) -> list[BatchItem]:
    """The models of a list file: a `.txt` (one model a line, `#` comments) or a `.json` (a list of
    model strings or objects `{"model": ..., "generate": true, ...}`).

    Args:
        path: the list file.

    Returns:
        The models in list order; two of them that would share a folder are an error.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"model list {path} does not exist; give the path of a .txt or .json list")
    if path.suffix == ".json":
        entries = json.loads(path.read_text())
        if not isinstance(entries, list):
            raise ValueError(f"{path}: a .json model list is a JSON list; got {type(entries).__name__}")
        items = [_item(entry, f"{path} entry {i}") for i, entry in enumerate(entries)]
    elif path.suffix == ".txt":
        lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
        items = [BatchItem(line) for line in lines if line]
    else:
        raise ValueError(f"{path}: a model list is a .txt (one model a line) or a .json file; rename it")
    slugs = [item.slug for item in items]
    twice = sorted({slug for slug in slugs if slugs.count(slug) > 1})
    if twice:
        raise ValueError(f"{path}: more than one entry would be written to {twice}; give each a distinct "
                         "\"name\" in a .json list")
    if not items:
        raise ValueError(f"{path} lists no model; add one a line (tiny:llama, a folder, a hub id)")
    return items


@dataclasses.dataclass
class BatchResult:
    """One export of the batch: a model to a format, its status and the first line of its error."""

    model: str
    format: str
    output: str
    status: str
    detail: str | None = None
    seconds: float | None = None
    artifact_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The export as `summary.json` stores it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchResult:
        """Back from `to_dict` (or a cell's result dict)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


def export_cell(spec: dict[str, Any], fmt: str, directory: str, output: str, timeout: float,
                threads: int) -> dict[str, Any]:
    """One export as an executor's cell: `python -m hfexport.job.batch_item` writing `directory/output`,
    its result as a `BatchResult` dict, marked `LOST` when its process was killed before it gave one."""
    base = {"model": spec["model"], "format": fmt, "output": output}
    outcome = run_subprocess([sys.executable, "-m", "hfexport.job.batch_item", json.dumps(spec), fmt,
                              str(Path(directory) / output)], timeout=timeout, threads=threads)
    if outcome.timed_out:
        return {**base, "status": "timeout", "detail": f"no result after {timeout:.0f} s (in {outcome.stage})",
                "seconds": timeout}
    if outcome.result is not None:
        return {**base, **outcome.result}
    return {**base, "status": "crash", "detail": outcome.how(), LOST: outcome.is_lost}


def save_summary(directory: Path, results: Sequence[BatchResult], runs: Sequence[str],
                 page_sha256: str | None = None) -> None:
    """`directory/summary.json`: the commands it comes from, every export and the SHA-256 of the
    `summary.md` written with it (written atomically)."""
    files = {PAGE: {"sha256": page_sha256}} if page_sha256 else {}
    with atomic_file(directory / SUMMARY) as stream:
        json.dump({BATCH_MARK: BATCH_VERSION, "runs": list(runs), "results": [r.to_dict() for r in results],
                   "files": files}, stream, indent=1)


def load_summary(directory: Path) -> tuple[list[BatchResult], list[str]]:
    """The exports and the runs of `directory/summary.json` (`OutputFolderError` when it is not an
    hfexport batch's)."""
    earlier = _read_summary(directory)
    return earlier.results, earlier.runs


@dataclasses.dataclass
class EarlierBatch:
    """What `summary.json` says of the batch in `folder`: its exports, its runs, the SHA-256 of its `summary.md`."""

    folder: Path
    results: list[BatchResult]
    runs: list[str]
    page_sha256: str | None

    def wrote(self, name: str) -> bool:
        """Whether the entry `name` of the folder (a relative path) is one this batch wrote: its
        summaries (`summary.md` only while it has the recorded SHA-256), an export's folder and
        what is in it (its own manifest rules it), or what an export leaves beside its folder
        while it runs (staging folders, lock file: `.FORMAT.partial-PID-*`, `.FORMAT.hfexport-lock`)."""
        if name == SUMMARY:
            return True
        if name == PAGE:
            return self.page_sha256 is not None and self.page_sha256 == _sha256_or_none(self.folder / PAGE)
        slug, _, rest = name.partition("/")
        formats = {r.format for r in self.results if r.output.split("/")[0] == slug}
        entry = rest.split("/")[0]
        return bool(formats) and (not entry or entry in formats or any(
            re.match(rf"\.{re.escape(fmt)}\.((partial|old)-\d+-|hfexport-lock$)", entry) for fmt in formats))


def _sha256_or_none(path: Path) -> str | None:
    try:
        return sha256_of(path)
    except OSError:  # unreadable: nothing says hfexport wrote it
        return None


#: The type of each field of a `BatchResult` as `summary.json` holds it.
_RESULT_TYPES = {"model": str, "format": str, "output": str, "status": str, "detail": (str, type(None)),
                 "seconds": (int, float, type(None)), "artifact_bytes": (int, type(None))}


def _read_summary(directory: Path) -> EarlierBatch:
    """`directory/summary.json` as an `EarlierBatch`, or `OutputFolderError` saying why it is not an
    hfexport batch's: a file that says it is hfexport's is checked, not trusted."""
    path = directory / SUMMARY
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get(BATCH_MARK, BATCH_VERSION) != BATCH_VERSION:
            raise ValueError(f"not a version {BATCH_VERSION} hfexport batch summary")
        runs, results, files = data["runs"], data["results"], data.get("files", {})
        if not (isinstance(runs, list) and all(isinstance(r, str) for r in runs) and isinstance(results, list)
                and isinstance(files, dict)):
            raise ValueError("its runs, results or files are not what a batch writes")
        for result in results:
            if not isinstance(result, dict) or not all(isinstance(result.get(k), t) for k, t in _RESULT_TYPES.items()):
                raise ValueError(f"an export's entry is not what a batch writes: {str(result)[:80]}")
            slug, _, fmt = result["output"].partition("/")
            if name_problem(slug) or fmt != result["format"] or name_problem(fmt):
                raise ValueError(f"an export's folder {result['output']!r} is not <model>/<format>")
        page = files.get(PAGE, {})
        page_sha256 = page.get("sha256") if isinstance(page, dict) and isinstance(page.get("sha256"), str) else None
    except (OSError, UnicodeDecodeError, ValueError, KeyError) as error:
        raise OutputFolderError(f"{path} is not an hfexport batch's summary ({error})",
                                remedy="name a new folder for the batch (-o), or move that file away") from None
    return EarlierBatch(directory, [BatchResult.from_dict(r) for r in results], runs, page_sha256)


def check_batch_folder(directory: str | Path, *, resume: bool) -> EarlierBatch | None:
    """Refuse, with `OutputFolderError`, a folder a batch may not write (the module's rules); return
    the earlier batch `resume` continues there, or None for a new or empty folder."""
    directory = Path(os.path.abspath(directory))
    check_writable(directory, "the batch", writes="into folder", new_name="batch")
    if not directory.exists() or not any(directory.iterdir()):
        return None
    if not (directory / SUMMARY).is_file():
        raise OutputFolderError(f"{directory} holds files that are not an hfexport batch "
                                f"({listing(folder_entries(directory))}; no {SUMMARY}): a batch is written into a "
                                "folder of its own", remedy=f"name a new folder for the batch (e.g. -o "
                                f"{directory / 'batch'})")
    earlier = _read_summary(directory)
    # beside the earlier batch, not in it: a folder inside would be a file that batch did not write
    new_folder = f"name a new folder for the batch (e.g. -o {directory.with_name(directory.name + '-2')})"
    others = {name for name in folder_entries(directory) if not earlier.wrote(name)}
    if others:
        page = f"; {PAGE} is not the page that batch wrote" if PAGE in others else ""
        raise OutputFolderError(f"{directory} holds an earlier hfexport batch and files it did not write "
                                f"({listing(others)}{page}); hfexport never replaces files it did not write",
                                remedy=f"move those files out of {directory}, or {new_folder}")
    if not resume:
        raise OutputFolderError(f"{directory} holds an earlier hfexport batch ({SUMMARY})",
                                remedy=f"pass --resume (resume=True) to continue it, or {new_folder}")
    return earlier


def render_summary(results: Sequence[BatchResult]) -> str:
    """The exports as a Markdown table: model, format, status (with the error's first line), seconds, bytes."""
    lines = ["| model | format | status | seconds | artifact bytes |", "|---|---|---|---|---|"]
    for r in results:
        status = r.status if r.status == "ok" else f"{r.status}: {r.detail or ''}".replace("|", "\\|")
        seconds = f"{r.seconds:.1f}" if r.seconds is not None else ""
        size = f"{r.artifact_bytes:,}" if r.artifact_bytes is not None else ""
        lines.append(f"| {r.model} | {r.format} | {status} | {seconds} | {size} |")
    return "\n".join(lines) + "\n"


def _merged(previous: Iterable[BatchResult], new: Iterable[BatchResult]) -> list[BatchResult]:
    fresh = {r.output: r for r in new}
    merged = [fresh.pop(r.output, r) for r in previous]
    return merged + list(fresh.values())


def _done(previous: Iterable[BatchResult], directory: Path) -> dict[str, BatchResult]:
    """The exports a resumed batch keeps: final statuses, and for `ok` the folder still there."""
    return {r.output: r for r in previous
            if r.status not in RERUN_ON_RESUME and (r.status != "ok" or (directory / r.output).is_dir())}


def run_batch(items: Sequence[BatchItem], formats: Sequence[str], directory: str | Path, *,
              executor: Executor | None = None, jobs: int = 1, timeout: float = 1800, resume: bool = False,
              run: str = "hfexport export-many",
              on_result: Callable[[BatchResult], None] | None = None) -> list[BatchResult]:
    """Export each item to each format into `directory/<slug>/<format>`; write `summary.json` (after
    every export) and `summary.md`.

    Args:
        items: the models (`read_model_list`).
        formats: export formats (`dynamo`, `onnx`, `executorch`, `openvino`).
        directory: the output folder (created); on Ray, a folder every node can write.
        executor: where the exports run (default `LocalExecutor(jobs)`).
        jobs: exports run at once by the default executor.
        timeout: seconds one export may take before it counts as `timeout`.
        resume: keep the exports `summary.json` lists as done (any status but `RERUN_ON_RESUME`;
            an `ok` one whose folder is gone runs again) and run the others.
        run: the command recorded in `summary.json`.
        on_result: called as each export finishes (progress).

    Returns:
        Every export of `items` x `formats`, in that order.
    """
    from ..auto import AutoExportConfig

    for fmt in formats:
        AutoExportConfig.from_dict({"export_format": fmt})  # an unknown format fails before any export
    directory = Path(directory)
    earlier = check_batch_folder(directory, resume=resume)
    previous, runs = (earlier.results, earlier.runs + [run]) if earlier else ([], [run])
    page_sha256 = earlier.page_sha256 if earlier else None  # the page in the folder until this run writes its own
    directory.mkdir(parents=True, exist_ok=True)
    done = _done(previous, directory) if resume else {}
    executor = executor or LocalExecutor(jobs)
    wanted = [(item, fmt, f"{item.slug}/{fmt}") for item in items for fmt in formats]
    results = {output: done[output] for _, _, output in wanted if output in done}
    where = str(directory.resolve())
    cells = [Cell((item.slug, fmt), export_cell, (item.spec(), fmt, where, output, timeout, executor.threads),
                  {"model": item.model, "format": fmt, "output": output})
             for item, fmt, output in wanted if output not in done]
    finished: list[BatchResult] = []

    def record(cell: Cell, data: dict[str, Any]) -> None:
        result = BatchResult.from_dict(data)
        results[result.output] = result
        finished.append(result)
        save_summary(directory, _merged(previous, finished), runs, page_sha256)
        if on_result:
            on_result(result)

    executor.run(cells, record)
    ordered = [results[output] for _, _, output in wanted]
    merged = _merged(previous, ordered)
    save_summary(directory, merged, runs, page_sha256)
    text = "# Batch export\n\nFrom " + ", then ".join(f"`{r}`" for r in runs) + ".\n\n" + render_summary(merged)
    if (directory / PAGE).exists() and (page_sha256 is None or _sha256_or_none(directory / PAGE) != page_sha256):
        raise OutputFolderError(f"{directory / PAGE} appeared while the batch ran and is not the page hfexport wrote; "
                                "it was kept", remedy=f"every export's result is in {directory / SUMMARY}: move "
                                f"{PAGE} away and run again with --resume to write the page")
    with atomic_file(directory / PAGE) as page:
        page.write(text)
    save_summary(directory, merged, runs, sha256_of(directory / PAGE))
    return ordered
