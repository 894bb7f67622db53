"""Batch exports (`hfexport export-many`): the list formats, the summary, resume, and Ray with a retry."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from hfexport.job.batch import BatchItem, name_problem, read_model_list, run_batch
from hfexport.errors import OutputFolderError
from hfexport.job.executors import LocalExecutor, RayExecutor
from tests.processes import KillOnce, local_ray  # noqa: F401 - local_ray is a fixture
from tests.harness import files_kept, output_refusal

TWO = "# two presets, one a line\ntiny:bert\n\ntiny:llama  # a decoder\n"


def test_a_txt_list_is_one_model_a_line_with_comments(tmp_path):
    listing = tmp_path / "models.txt"
    listing.write_text(TWO)
    assert [(item.model, item.slug) for item in read_model_list(listing)] == [
        ("tiny:bert", "tiny-bert"), ("tiny:llama", "tiny-llama")]


def test_a_json_list_holds_models_or_objects_with_options(tmp_path):
    listing = tmp_path / "models.json"
    listing.write_text(json.dumps(["org/model", {"model": "tiny:llama", "task": "auto", "static_cache": 64,
                                                 "name": "llama-gen"}]))
    items = read_model_list(listing)
    options = {"task": "auto", "static_cache": 64}  # the export job's `JobOptions.task`
    assert items == [BatchItem("org/model"), BatchItem("tiny:llama", options, "llama-gen")]
    assert [item.slug for item in items] == ["org--model", "llama-gen"]
    assert items[1].spec() == {"model": "tiny:llama", **options}


@pytest.mark.parametrize(("text", "message"), [
    ('[{"model": "tiny:llama", "generat": true}]', r"unknown keys \['generat'\]"),
    ('["tiny:llama", {"model": "tiny:llama", "generate": true}]', r"more than one entry would be written to"),
    ('{"model": "tiny:llama"}', "a .json model list is a JSON list"),
])
def test_a_bad_json_list_is_refused_with_what_to_change(tmp_path, text, message):
    listing = tmp_path / "models.json"
    listing.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_model_list(listing)


@pytest.mark.parametrize(("name", "rule"), [
    ("../x", "path separator"), ("..", "holds '..'"), ("a..b", "holds '..'"), ("/tmp/x", "absolute path"),
    ("C:x", "starts with a drive"), ("sub/dir", "path separator"), ("sub\\dir", "path separator"),
    (".hidden", "starts with a dot"), ("", "not a non-empty string"), (3, "not a non-empty string"),
    ("a*b", "characters other than"), ("tab\there", "characters other than"), ("new\nline", "characters other than"),
])
def test_a_name_that_is_not_one_plain_folder_is_refused_with_the_rule(tmp_path, name, rule):
    with pytest.raises(ValueError, match=f"the name .* of tiny:llama .*{re.escape(rule)}.*give one plain folder name"):
        BatchItem("tiny:llama", name=name)
    listing = tmp_path / "models.json"
    listing.write_text(json.dumps(["tiny:bert", {"model": "tiny:llama", "name": name}]))
    with pytest.raises(ValueError, match=f"models.json entry 1: the name .* {re.escape(rule)}"):
        read_model_list(listing)


@pytest.mark.parametrize("name", ["llama-gen", "llama_gen.v2", "Llama3", "modèle"])
def test_a_plain_folder_name_is_kept(name):
    assert BatchItem("tiny:llama", name=name).slug == name


@pytest.mark.parametrize(("model", "slug"), [("..", "model"), ("../models/x/", "models--x"), ("./.hidden", "hidden")])
def test_a_models_own_slug_is_a_plain_folder_name(model, slug):
    assert BatchItem(model).slug == slug and name_problem(slug) is None


def test_export_many_refuses_a_name_outside_the_output_folder_and_writes_nothing(tmp_path, capsys):
    from hfexport.cli.main import main

    listing = tmp_path / "models.json"
    listing.write_text(json.dumps([{"model": "tiny:llama", "name": "../escaped"}]))
    assert main(["export-many", str(listing), "-o", str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert "entry 0: the name '../escaped' of tiny:llama holds a path separator" in error
    assert "e.g. '_escaped'" in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models.json"]


def test_an_earlier_batch_is_continued_only_with_resume(tmp_path):
    (tmp_path / "summary.json").write_text('{"runs": [], "results": []}')  # as written before its mark
    with pytest.raises(OutputFolderError, match="pass --resume"):
        run_batch([BatchItem("tiny:bert")], ["dynamo"], tmp_path)
    with pytest.raises(ValueError, match="tensorrt"):
        run_batch([BatchItem("tiny:bert")], ["tensorrt"], tmp_path / "new")


@pytest.fixture(scope="module")
def local_batch(tmp_path_factory):
    """Two presets on dynamo here, the second added by a resumed run: `(folder, results, commands of
    the resumed run's subprocesses)`."""
    directory = tmp_path_factory.mktemp("batch") / "out"
    listing = directory.parent / "models.txt"
    listing.write_text(TWO)
    items = read_model_list(listing)
    run_batch(items[:1], ["dynamo"], directory, executor=LocalExecutor(1))
    launched, real = [], subprocess.run
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess, "run", lambda command, *a, **k: launched.append(command) or real(command, *a, **k))
        results = run_batch(items, ["dynamo"], directory, executor=LocalExecutor(1), resume=True)
    return directory, results, launched


@pytest.mark.slow
def test_a_batch_writes_each_export_and_a_summary_and_resume_runs_only_the_missing(local_batch):
    directory, results, launched = local_batch
    assert [(r.model, r.format, r.status, r.output) for r in results] == [
        ("tiny:bert", "dynamo", "ok", "tiny-bert/dynamo"), ("tiny:llama", "dynamo", "ok", "tiny-llama/dynamo")]
    assert len(launched) == 1 and "tiny:llama" in launched[0][3]  # bert was done: not run again
    for r in results:
        report = json.loads((directory / r.output / "report.json").read_text())
        assert report["artifact_bytes"] == r.artifact_bytes > 0 and r.seconds > 0
        assert report["components"]["model"]["validation"]["passed"]
    summary = json.loads((directory / "summary.json").read_text())
    assert len(summary["runs"]) == 2 and [r["status"] for r in summary["results"]] == ["ok", "ok"]
    assert "| tiny:llama | dynamo | ok |" in (directory / "summary.md").read_text()


@pytest.mark.slow
def test_a_batch_on_ray_gives_the_same_summary_and_retries_a_killed_export(local_batch, local_ray, tmp_path):
    directory, local, _ = local_batch
    items = [BatchItem("tiny:bert"), BatchItem("tiny:llama")]
    with KillOnce("hfexport.job.batch_item", str(tmp_path)) as killer:  # the first export's process, mid-export
        results = run_batch(items, ["dynamo"], tmp_path / "out", executor=RayExecutor())
    assert len(killer.killed) == 1
    assert [(r.model, r.format, r.output, r.status, r.detail) for r in results] == [
        (r.model, r.format, r.output, r.status, r.detail) for r in local]
    assert all((tmp_path / "out" / r.output / "report.json").is_file() for r in results)


@pytest.fixture
def exports_run(monkeypatch):
    """Each export of a batch as an instant `ok` (no subprocess) that writes its folder: the exports
    run, in order."""
    import hfexport.job.batch

    run = []

    def export(spec, fmt, directory, output, timeout, threads):
        run.append(output)
        (Path(directory) / output).mkdir(parents=True)
        (Path(directory) / output / "model.pt2").write_bytes(b"a program")
        return {"model": spec["model"], "format": fmt, "output": output, "status": "ok", "seconds": 0.1,
                "artifact_bytes": 1}

    monkeypatch.setattr(hfexport.job.batch, "export_cell", export)
    return run


def _export_many(listing, out, *more: str) -> int:
    from hfexport.cli.main import main

    return main(["export-many", str(listing), "--format", "dynamo", "-o", str(out), *more])


def test_the_summaries_get_the_users_umask_not_a_private_mode(tmp_path, exports_run):
    (tmp_path / "models.txt").write_text("tiny:llama\n")
    previous = os.umask(0o022)
    try:
        assert _export_many(tmp_path / "models.txt", tmp_path / "out") == 0
    finally:
        os.umask(previous)
    assert exports_run == ["tiny-llama/dynamo"]
    for name in ("summary.json", "summary.md"):
        assert (tmp_path / "out" / name).stat().st_mode & 0o777 == 0o644, name  # others may read them


def test_a_batch_into_a_folder_of_the_users_files_is_refused_before_any_work(tmp_path, monkeypatch, capsys,
                                                                            exports_run):
    (tmp_path / "models.txt").write_text("tiny:llama\n")
    (tmp_path / "summary.md").write_text("# my summary of the week\n")
    (tmp_path / "summary.md").chmod(0o640)
    monkeypatch.chdir(tmp_path)
    before = files_kept(tmp_path)
    assert _export_many("models.txt", ".") == 2
    err = output_refusal(capsys)
    assert (f"{tmp_path} holds files that are not an hfexport batch (models.txt, summary.md; no summary.json): a "
            f"batch is written into a folder of its own What to do: name a new folder for the batch (e.g. -o "
            f"{tmp_path / 'batch'})") in err
    assert files_kept(tmp_path) == before and exports_run == []


def test_a_resumed_batch_replaces_its_own_summary_page_and_refuses_one_it_did_not_write(tmp_path, capsys,
                                                                                       exports_run):
    (tmp_path / "models.txt").write_text("tiny:llama\n")
    out = tmp_path / "out"
    assert _export_many(tmp_path / "models.txt", out) == 0
    (out / "summary.md").chmod(0o640)  # the user's choice of who reads it, which a replacement keeps
    assert _export_many(tmp_path / "models.txt", out, "--resume") == 0
    assert "--format dynamo`, then `hfexport export-many" in (out / "summary.md").read_text()
    assert (out / "summary.md").stat().st_mode & 0o777 == 0o640
    capsys.readouterr()
    (out / "summary.md").write_text("# my notes on these exports\n")
    before = files_kept(tmp_path)
    assert _export_many(tmp_path / "models.txt", out, "--resume") == 2
    assert (f"{out} holds an earlier hfexport batch and files it did not write (summary.md; summary.md is not the "
            f"page that batch wrote); hfexport never replaces files it did not write What to do: move those files "
            f"out of {out}, or name a new folder for the batch (e.g. -o {tmp_path / 'out-2'})") in output_refusal(capsys)
    assert files_kept(tmp_path) == before and exports_run == ["tiny-llama/dynamo"]  # the first run's only


@pytest.mark.parametrize(("content", "why"), [
    ("my own summary", "Expecting value"),
    ('{"runs": [], "results": [{"model": "x", "format": "dynamo", "output": "../../x/dynamo", "status": "ok"}]}',
     "an export's folder '../../x/dynamo' is not <model>/<format>"),
    ('{"hfexport_batch": 9, "runs": [], "results": []}', "not a version 1 hfexport batch summary"),
])
def test_a_summary_json_that_is_not_a_batchs_is_refused(tmp_path, capsys, exports_run, content, why):
    (tmp_path / "models.txt").write_text("tiny:llama\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "summary.json").write_text(content)
    before = files_kept(tmp_path)
    assert _export_many(tmp_path / "models.txt", tmp_path / "out", "--resume") == 2
    err = output_refusal(capsys)
    assert f"{tmp_path / 'out' / 'summary.json'} is not an hfexport batch's summary (" in err and why in err
    assert files_kept(tmp_path) == before and exports_run == []


def test_an_earlier_batch_holding_a_users_file_is_refused(tmp_path, capsys, exports_run):
    (tmp_path / "models.txt").write_text("tiny:llama\n")
    assert _export_many(tmp_path / "models.txt", tmp_path / "out") == 0
    (tmp_path / "out" / "tiny-llama" / "notes.md").write_text("mine")
    capsys.readouterr()
    before = files_kept(tmp_path)
    assert _export_many(tmp_path / "models.txt", tmp_path / "out", "--resume") == 2
    assert "files it did not write (tiny-llama/notes.md)" in output_refusal(capsys)
    assert files_kept(tmp_path) == before
