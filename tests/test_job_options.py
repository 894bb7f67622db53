"""The export job's options (`hfexport.job.options`): each group refuses a bad value with what to
pass, the flat keywords of the release before build the same options with a `DeprecationWarning`
naming the group, and an `export-many` list's options reach each export as the list says, a
resumed batch's included."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest
from transformers import GenerationConfig

from hfexport.errors import TaskError
from hfexport.job import GenerationOptions, JobOptions, JudgingOptions, LoadingOptions
from hfexport.job.batch import OPTIONS, BatchItem, read_model_list, run_batch
from hfexport.job.options import FLAT_NAMES, GROUPS

STATIC = GenerationConfig(cache_implementation="static", max_cache_len=32)


@pytest.mark.parametrize(("group", "values", "error", "says"), [
    (LoadingOptions, {"dtype": "float64"}, ValueError, "dtype must be one of auto, float32, float16, bfloat16"),
    (LoadingOptions, {"trust_remote_code": "false"}, ValueError, "trust_remote_code is True or False: pass a bool"),
    (LoadingOptions, {"prompt": ""}, ValueError, "prompt is the sample text .*: pass a non-empty str"),
    (LoadingOptions, {"revision": 3}, ValueError, "revision is a hub branch, tag or commit: pass a non-empty str"),
    (JudgingOptions, {"atol": -1e-3}, ValueError, r"atol is the absolute tolerance: pass a number >= 0"),
    (JudgingOptions, {"rtol": "1e-3"}, ValueError, r"rtol is the relative tolerance: pass a number >= 0"),
    (JudgingOptions, {"min_cosine": 1.5}, ValueError, r"min_cosine is a floor .*: pass a number in \[-1, 1\]"),
    (JudgingOptions, {"min_agreement": 70}, ValueError, r"\(0\.7: 70%\): pass a number in \[0, 1\]"),
    (JudgingOptions, {"accuracy_tokens": 0}, ValueError, "accuracy_tokens is .*: pass an int >= 1"),
    (JudgingOptions, {"validate": "no"}, ValueError, "validate is True or False: pass a bool"),
    (GenerationOptions, {"task": "chat"}, TaskError, "(?s)unknown task 'chat'.*What to do: pass one of auto, "),
    (GenerationOptions, {"task": "forward", "generate": True}, TaskError, "What to do: drop them"),
    (GenerationOptions, {"static_cache": 1}, ValueError, "static_cache is the cache length in tokens, an int >= 2"),
    (GenerationOptions, {"static_cache": 64, "generation_config": STATIC}, ValueError,
     "pass static_cache or generation_config, not both"),
    (GenerationOptions, {"multi_token_decode": 1}, ValueError, "multi_token_decode is True or False: pass a bool"),
])
def test_each_group_refuses_a_bad_value_saying_what_to_pass(group, values, error, says):
    """`says` holds the remedy: what to pass (the checks moved here keep their words: a dtype of the
    list, an int >= 2)."""
    with pytest.raises(error, match=says):
        group(**values)
    with warnings.catch_warnings(), pytest.raises(error, match=says):  # by the flat names, the same
        warnings.simplefilter("ignore", DeprecationWarning)
        JobOptions(**values)


def test_a_bad_value_on_the_command_line_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    from hfexport.cli.main import main

    def export_to_folder(*args, **kwargs):
        raise AssertionError("the export started")

    monkeypatch.setattr("hfexport.job.export.export_to_folder", export_to_folder)
    assert main(["export", "tiny:llama", "-o", str(tmp_path / "out"), "--min-agreement", "70"]) == 2  # refused before any work, as every option is
    assert "min_agreement is the share of greedy tokens" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


#: A valid value of every option, by its flat name.
VALUES = {"prompt": "hi", "gguf_file": "model.gguf", "revision": "main", "trust_remote_code": True, "dtype": "auto",
          "validate": False, "atol": 1e-3, "rtol": 1e-2, "min_cosine": 0.9, "min_cache_cosine": 0.8,
          "min_agreement": 0.5, "accuracy_tokens": 8, "task": "auto", "generate": True, "generation_config": STATIC,
          "multi_token_decode": True, "static_cache": None}


def test_every_option_has_one_group_and_a_value_here():
    assert set(VALUES) == set(FLAT_NAMES)
    assert {name for cls in GROUPS.values() for name in (f.name for f in dataclasses.fields(cls))} == set(FLAT_NAMES)


@pytest.mark.parametrize("name", sorted(FLAT_NAMES))
def test_a_flat_keyword_builds_the_same_options_with_a_warning_naming_its_group(name):
    group = FLAT_NAMES[name]
    grouped = JobOptions(**{group: GROUPS[group](**{name: VALUES[name]})})
    with pytest.warns(DeprecationWarning, match=rf"JobOptions\({name}=\.\.\.\) is deprecated and will be removed in "
                      rf"the next release: pass {group}={GROUPS[group].__name__}\({name}=\.\.\.\)") as caught:
        flat = JobOptions(**{name: VALUES[name]})
    assert flat == grouped
    assert caught[0].filename == __file__  # the warning points at the caller's line
    with pytest.warns(DeprecationWarning, match=rf"read options\.{group}\.{name}"):
        assert getattr(flat, name) is VALUES[name]


def test_flat_keywords_go_into_the_groups_given_with_them():
    with pytest.warns(DeprecationWarning, match=r"pass judging=JudgingOptions\(rtol=\.\.\.\), "
                      r"loading=LoadingOptions\(gguf_file=\.\.\.\)"):
        options = JobOptions(judging=JudgingOptions(atol=1.0), rtol=2.0, gguf_file="m.gguf", overwrite=True)
    assert options == JobOptions(judging=JudgingOptions(atol=1.0, rtol=2.0),
                                 loading=LoadingOptions(gguf_file="m.gguf"), overwrite=True)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['tolerance'\]"):
        JobOptions(tolerance=1.0)
    with pytest.raises(TypeError, match="judging is a JudgingOptions; got dict"):
        JobOptions(judging={"atol": 1.0})
    with pytest.raises(AttributeError, match="no attribute 'tolerance'"):
        options.tolerance  # noqa: B018


def test_the_groups_warn_of_nothing_and_are_frozen():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        options = JobOptions(loading=LoadingOptions(dtype="auto"), judging=JudgingOptions(atol=1e-3),
                             generation=GenerationOptions(task="auto", static_cache=64), quantize="int8-dynamic")
        changed = dataclasses.replace(options, overwrite=True)
    assert changed.overwrite and changed.judging is options.judging
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.overwrite = True
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.judging.atol = 1.0


def _job_options(monkeypatch):
    """`export_to_folder`'s options, caught where its steps would start (nothing is loaded)."""
    import hfexport.job.export

    monkeypatch.setattr(hfexport.job.export, "_export", lambda model, config, target, options: options)
    return hfexport.job.export.export_to_folder


def test_export_to_folder_takes_the_groups_and_still_the_flat_keywords_with_a_warning(tmp_path, monkeypatch):
    from hfexport import DynamoConfig

    export_to_folder = _job_options(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grouped = export_to_folder("tiny:llama", DynamoConfig(), tmp_path / "a", generation=GenerationOptions(
            static_cache=64), judging=JudgingOptions(validate=False))
    with pytest.warns(DeprecationWarning, match=r"export_to_folder\(static_cache=\.\.\., validate=\.\.\.\) is "
                      r"deprecated .*: pass generation=GenerationOptions\(static_cache=\.\.\.\), "
                      r"judging=JudgingOptions\(validate=\.\.\.\)") as caught:
        flat = export_to_folder("tiny:llama", DynamoConfig(), tmp_path / "b", static_cache=64, validate=False)
    assert flat == grouped == JobOptions(generation=GenerationOptions(static_cache=64),
                                         judging=JudgingOptions(validate=False))
    assert caught[0].filename == __file__
    with pytest.warns(DeprecationWarning):  # over the options given, and over a group given beside them
        mixed = export_to_folder("tiny:llama", DynamoConfig(), tmp_path / "c", JobOptions(overwrite=True),
                                 judging=JudgingOptions(atol=1.0), rtol=2.0)
    assert mixed == JobOptions(judging=JudgingOptions(atol=1.0, rtol=2.0), overwrite=True)


#: An `export-many` list entry with every option the list takes (`batch.OPTIONS`), by its flat name.
ENTRY = {"model": "tiny:llama", "task": "auto", "generate": False, "multi_token_decode": False, "static_cache": 64,
         "quantize": "int8-dynamic", "validate": True, "atol": 1e-3, "rtol": 1e-2, "min_cosine": 0.9,
         "min_cache_cosine": 0.8, "prompt": "hi", "dtype": "float32"}
WANT = JobOptions(loading=LoadingOptions(prompt="hi", dtype="float32"),
                  judging=JudgingOptions(validate=True, atol=1e-3, rtol=1e-2, min_cosine=0.9, min_cache_cosine=0.8),
                  generation=GenerationOptions(task="auto", static_cache=64), quantize="int8-dynamic")


def test_every_key_of_a_list_is_an_option_of_the_job():
    assert set(ENTRY) - {"model"} == set(OPTIONS) and set(OPTIONS) <= {*FLAT_NAMES, "quantize"}


def test_a_list_entrys_options_reach_its_export_grouped_as_the_list_says(tmp_path, monkeypatch):
    """The list's flat keys -> `BatchItem` -> the subprocess's JSON spec -> `batch_item` -> the job's groups."""
    from hfexport.job import batch_item

    (tmp_path / "models.json").write_text(json.dumps([{**ENTRY, "dynamic": False}]))
    (item,) = read_model_list(tmp_path / "models.json")
    assert item.job_options() == WANT
    seen = {}

    def export_to_folder(model, config, out, options, **changes):
        seen.update(model=model, dynamic=config.dynamic, options=options, changes=changes)
        raise RuntimeError("stop here")

    monkeypatch.setattr("hfexport.job.export.export_to_folder", export_to_folder)
    with warnings.catch_warnings(), pytest.raises(RuntimeError, match="stop here"):
        warnings.simplefilter("error")  # the list's names are its format, not a deprecated call
        batch_item.export(json.loads(json.dumps(item.spec())), "dynamo", str(tmp_path / "out"))
    assert seen["model"] == "tiny:llama" and seen["dynamic"] is False and seen["options"] == WANT
    assert list(seen["changes"]) == ["progress"]


@pytest.mark.parametrize(("entry", "says"), [
    ({"static_cache": 1}, "static_cache is the cache length in tokens, an int >= 2"),
    ({"task": "forward", "generate": True}, "--task forward exports one graph"),
    ({"atol": -1}, "atol is the absolute tolerance: pass a number >= 0"),
])
def test_a_list_entry_with_a_bad_option_is_refused_when_the_list_is_read(tmp_path, entry, says):
    (tmp_path / "models.json").write_text(json.dumps(["tiny:bert", {"model": "tiny:llama", **entry}]))
    with pytest.raises(ValueError, match=f"models.json entry 1: the options of tiny:llama: .*{says}"):
        read_model_list(tmp_path / "models.json")


def test_a_batch_written_before_the_groups_resumes_with_its_list_as_it_was(tmp_path, monkeypatch):
    """A `summary.json` and a list of this release's predecessor: the done export is kept, the
    other runs with the list's options, grouped."""
    import hfexport.job.batch

    out = tmp_path / "out"
    (out / "tiny-bert" / "dynamo").mkdir(parents=True)
    (out / "tiny-bert" / "dynamo" / "model.pt2").write_bytes(b"a program")
    (out / "summary.json").write_text(json.dumps({  # as the batch of the release before wrote it
        "hfexport_batch": 1, "runs": ["hfexport export-many models.json --format dynamo"],
        "results": [{"model": "tiny:bert", "format": "dynamo", "output": "tiny-bert/dynamo", "status": "ok",
                     "detail": None, "seconds": 1.5, "artifact_bytes": 9}], "files": {}}))
    (tmp_path / "models.json").write_text(json.dumps([{"model": "tiny:bert", "validate": False}, ENTRY]))
    specs = []

    def export(spec, fmt, directory, output, timeout, threads):
        specs.append(json.loads(json.dumps(spec)))
        (Path(directory) / output).mkdir(parents=True)
        return {"model": spec["model"], "format": fmt, "output": output, "status": "ok", "seconds": 0.1,
                "artifact_bytes": 1}

    monkeypatch.setattr(hfexport.job.batch, "export_cell", export)
    results = run_batch(read_model_list(tmp_path / "models.json"), ["dynamo"], out, resume=True)
    assert [(r.model, r.seconds) for r in results] == [("tiny:bert", 1.5), ("tiny:llama", 0.1)]
    (spec,) = specs
    assert spec == ENTRY
    assert BatchItem(spec.pop("model"), spec).job_options() == WANT
