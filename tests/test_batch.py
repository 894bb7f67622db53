"""Batch exports (`hfexport export-many`): the list formats, the summary, resume, and Ray with a retry."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from hfexport.batch import BatchItem, name_problem, read_model_list, run_batch
from hfexport.executors import LocalExecutor, RayExecutor
from tests.processes import KillOnce, local_ray  # noqa: F401 - local_ray is a fixture

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
    (tmp_path / "summary.json").write_text('{"runs": [], "results": []}')
    with pytest.raises(ValueError, match="pass --resume"):
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
    with KillOnce("hfexport.batch_item", str(tmp_path)) as killer:  # the first export's process, mid-export
        results = run_batch(items, ["dynamo"], tmp_path / "out", executor=RayExecutor())
    assert len(killer.killed) == 1
    assert [(r.model, r.format, r.output, r.status, r.detail) for r in results] == [
        (r.model, r.format, r.output, r.status, r.detail) for r in local]
    assert all((tmp_path / "out" / r.output / "report.json").is_file() for r in results)


@pytest.fixture
def exports_run(monkeypatch):
    """Each export of a batch as an instant `ok` (no subprocess): the exports run, in order."""
    import hfexport.batch

    run = []

    def export(spec, fmt, directory, output, timeout, threads):
        run.append(output)
        return {"model": spec["model"], "format": fmt, "output": output, "status": "ok", "seconds": 0.1,
                "artifact_bytes": 1}

    monkeypatch.setattr(hfexport.batch, "export_cell", export)
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
