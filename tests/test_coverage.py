"""The coverage matrix: its machinery, and a fixed subset of its cases (the full matrix is a command).

Each case runs in its own subprocess, exactly as `hfexport coverage` runs it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hfexport.coverage import (KNOWN_FAILURES, CaseResult, KnownFailure, applicable, load_results, merge_results,
                               render_markdown, run_case, save_results)
from hfexport.presets import PRESETS, build_preset, tiny_processor
from tests.harness import files_kept, output_refusal

#: One case per kind the panel adds beyond the per-backend tests: a family each, a backend each.
SUBSET = [
    ("qwen2", "dynamo", "generate"),
    ("gemma2", "onnx", "export"),  # sliding window + logit softcapping
    ("falcon_mamba", "dynamo", "generate"),
    ("bart", "onnx", "generate"),
    ("hubert", "openvino", "export"),
    ("llava", "onnx", "export"),  # declared: the vision tower's batch (see KNOWN_FAILURES)
    ("mistral", "dynamo", "generate"),  # sliding window 4 < prompt 8: full-length caches
    ("speech_to_text", "dynamo", "generate-audio"),  # two clips through the saved Speech2Text processor
]


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "backend", "mode"), SUBSET, ids=["-".join(c) for c in SUBSET])
def test_subset_case_matches_eager(arch, backend, mode):
    result = run_case(arch, backend, mode, timeout=600)
    assert result.verdict in ("ok", "known failure"), f"{result.verdict}: {result.detail}"
    if result.verdict == "known failure":
        return  # declared, with its reason (an unexpected pass fails above)
    if mode != "export":
        assert result.extra["tokens"] == "match"
    else:
        assert result.extra["max_abs"] is not None and result.extra["dynamic_checked"]


def test_a_case_past_its_timeout_is_reported_not_raised():
    result = run_case("bert", "dynamo", "export", timeout=0.5)
    assert result.status == "timeout" and result.detail == "no result after 0 s (in startup)"


def test_the_page_shows_failures_known_failures_and_unexpected_passes(monkeypatch):
    known = KnownFailure("a declared reason", "owner/repo#1")
    monkeypatch.setitem(KNOWN_FAILURES, ("llama", "onnx", "export"), known)
    results = [
        CaseResult("llama", "decoder", "dynamo", "export", "ok", extra={"dynamic_checked": True}),
        CaseResult("llama", "decoder", "onnx", "export", "export failure", "RuntimeError: boom", known=known),
        CaseResult("bert", "encoder", "dynamo", "export", "mismatch", "sample last_hidden_state: max abs 0.1"),
        CaseResult("bert", "encoder", "onnx", "export", "ok", known=KnownFailure("was broken")),
    ]
    page = render_markdown(results)
    assert "| llama | decoder | ok | known |" in page
    assert "| bert | encoder | mismatch ✗ | XPASS |" in page
    assert "| bert dynamo export | mismatch | sample last_hidden_state: max abs 0.1 |" in page
    assert "a declared reason (owner/repo#1)" in page
    assert "torch " in page and "transformers " in page  # the versions it ran with


def test_generate_audio_cells_are_the_models_that_generate_from_audio():
    """A speech encoder-decoder or an audio-text LLM; an encoder of audio has no cell, as a text model
    has no generate-image cell, and an audio-text LLM no generate-image cell."""
    assert [a for a in PRESETS if applicable(a, "generate-audio")] == ["qwen2_audio", "whisper", "speech_to_text"]
    assert [a for a in PRESETS if applicable(a, "generate-image")] == ["llava", "qwen2_vl"]
    for encoder in ("wav2vec2", "hubert", "ast"):
        assert applicable(encoder, "export") and not applicable(encoder, "generate-audio")


def test_the_page_has_a_generate_audio_column_blank_for_audio_encoders():
    results = [
        CaseResult("whisper", "encoder-decoder", "onnx", "generate-audio", "ok", extra={"tokens": "match"}),
        CaseResult("qwen2_audio", "multimodal", "onnx", "generate-audio", "mismatch",
                   "the chirp: greedy tokens [5, 7] != generate() [5, 9]"),
        CaseResult("wav2vec2", "audio", "onnx", "export", "ok", extra={"dynamic_checked": True}),
    ]
    page = render_markdown(results)
    assert "| architecture | kind | onnx export | onnx generate-audio |" in page
    assert "| whisper | encoder-decoder |  | ok |" in page and "| wav2vec2 | audio | ok |  |" in page
    assert "| qwen2_audio | multimodal |  | mismatch ✗ |" in page
    assert "| qwen2_audio onnx generate-audio | mismatch | the chirp: greedy tokens [5, 7] != generate() [5, 9] |" in page
    assert "`generate-audio`: the same for a model that generates from audio, on two generated clips" in page


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["whisper", "qwen2_audio", "speech_to_text"])
def test_each_generate_audio_presets_tokens_differ_between_its_clips(arch):
    """So a runner that lost the audio could not match eager on both clips of the generate-audio cell."""
    from hfexport.coverage.case import audio_clips, eager_audio_tokens

    processor, audio_text = tiny_processor(arch), PRESETS[arch].kind == "multimodal"
    clips = audio_clips(processor.feature_extractor)
    model, _ = build_preset(arch)
    tone, chirp = (eager_audio_tokens(model, processor, clips[name], audio_text=audio_text) for name in ("tone", "chirp"))
    assert tone != chirp
    if arch == "speech_to_text":  # why the preset draws its weights at std 0.1: at the default 0.02 they do not
        narrow, _ = build_preset(arch, init_std=0.02)
        assert eager_audio_tokens(narrow, processor, clips["tone"]) == eager_audio_tokens(narrow, processor, clips["chirp"])


def test_merge_replaces_the_cases_run_again_and_keeps_the_others(tmp_path):
    old = [CaseResult("a", "k", "onnx", "export", "mismatch"), CaseResult("b", "k", "onnx", "export", "ok")]
    new = [CaseResult("a", "k", "onnx", "export", "ok"), CaseResult("c", "k", "onnx", "export", "ok")]
    merged = merge_results(old, new)
    assert [(r.arch, r.status) for r in merged] == [("a", "ok"), ("b", "ok"), ("c", "ok")]
    save_results(tmp_path / "m.json", merged, ["first run", "second run --merge"])
    loaded, runs = load_results(tmp_path / "m.json")
    assert [(r.arch, r.status) for r in loaded] == [("a", "ok"), ("b", "ok"), ("c", "ok")]
    assert runs == ["first run", "second run --merge"]


@pytest.mark.slow
def test_cli_writes_the_page_and_its_json(tmp_path):
    from hfexport.cli.main import main

    output = tmp_path / "coverage.md"
    assert main(["coverage", "--only", "bert", "--backends", "dynamo", "--modes", "export", "-o", str(output)]) == 0
    assert "| bert | encoder | ok |" in output.read_text()
    saved = json.loads(output.with_suffix(".json").read_text())
    assert [(r["arch"], r["backend"], r["mode"], r["verdict"]) for r in saved["results"]] == [
        ("bert", "dynamo", "export", "ok")]
    assert saved["runs"] == ["hfexport coverage --backends dynamo --modes export --only bert"]
    assert "Not run in these results: dynamo generate, dynamo generate-image, dynamo generate-audio, onnx export" \
        in output.read_text()


def test_cli_refuses_an_unknown_backend(tmp_path, capsys):
    from hfexport.cli.main import main

    assert main(["coverage", "--backends", "tensorrt", "-o", str(tmp_path / "c.md")]) == 1
    assert "unknown backend ['tensorrt']" in capsys.readouterr().err


def test_a_runtime_failure_carries_what_the_runtime_logged():
    """ExecuTorch's Python error is generic; the cell gets its log's reason (Phi-3's batch, seen)."""
    from hfexport.coverage.matrix import _runtime_log

    stderr = "\n".join([
        "W1129 19:06:33 torch/utils/_pytree.py:630] an unrelated warning",
        "[cpuinfo_utils.cpp:71] Reading file /sys/devices/soc0/image_version",
        "[tensor_impl.cpp:135] Attempted to resize a static tensor. Expected shape (2), but received (1).",
        "[op_arange.cpp:77] Check failed (resize_tensor(out, {&out_length, 1}) == Error::Ok): ",
        "[method.cpp:1480] KernelCall failed at instruction 0:10 in operator aten::arange.start_out: 0x12",
        "[method.cpp:1490] arg 0 with type id 4",
    ])
    assert _runtime_log(stderr) == (
        "Attempted to resize a static tensor. Expected shape (2), but received (1).; "
        "Check failed (resize_tensor(out, {&out_length, 1}) == Error::Ok):; "
        "KernelCall failed at instruction 0:10 in operator aten::arange.start_out: 0x12")
    assert _runtime_log("no native log here") == ""


DOCS = Path(__file__).parents[1] / "docs"


@pytest.fixture
def cases_run(monkeypatch):
    """Each case of the matrix as an instant `ok` (no subprocess): the cases run, in order."""
    import hfexport.coverage.matrix

    run = []

    def case(arch, backend, mode, timeout, threads):
        run.append((arch, backend, mode))
        return {"arch": arch, "kind": "encoder", "backend": backend, "mode": mode, "status": "ok", "seconds": 0.1,
                "extra": {"dynamic_checked": True}, "verdict": "ok"}

    monkeypatch.setattr(hfexport.coverage.matrix, "case_cell", case)
    return run


def _coverage(page, *more: str) -> int:
    from hfexport.cli.main import main

    return main(["coverage", "--only", "bert", "--backends", "dynamo", "--modes", "export", "-o", str(page), *more])


def test_the_repos_own_page_is_regenerated_in_place_keeping_its_mode(tmp_path, cases_run, capsys):
    for name in ("coverage.md", "coverage.json"):
        shutil.copy(DOCS / name, tmp_path / name)
    (tmp_path / "coverage.md").chmod(0o640)  # the user's choice of who reads it, which the new page keeps
    cases = len(load_results(tmp_path / "coverage.json")[0])
    assert _coverage(tmp_path / "coverage.md", "--merge") == 0
    page = (tmp_path / "coverage.md").read_text()
    assert "then `hfexport coverage --backends dynamo --modes export --only bert --merge`." in page
    assert (tmp_path / "coverage.md").stat().st_mode & 0o777 == 0o640
    assert len(load_results(tmp_path / "coverage.json")[0]) == cases and cases_run == [("bert", "dynamo", "export")]
    assert _coverage(tmp_path / "coverage.md") == 0  # its own page again, without --merge: one case now
    assert len(load_results(tmp_path / "coverage.json")[0]) == 1


def test_a_new_page_and_its_json_get_the_users_umask(tmp_path, cases_run):
    previous = os.umask(0o022)
    try:
        assert _coverage(tmp_path / "coverage.md") == 0
    finally:
        os.umask(previous)
    assert [(tmp_path / name).stat().st_mode & 0o777 for name in ("coverage.md", "coverage.json")] == [0o644] * 2


@pytest.mark.parametrize("content", ["# My notes\n\nA week of them.\n", "# Coverage matrix\n\nmy own table\n"])
def test_a_page_hfexport_did_not_write_is_refused_before_any_case(tmp_path, capsys, cases_run, content):
    page = tmp_path / "coverage.md"
    page.write_text(content)
    page.chmod(0o640)
    before = files_kept(tmp_path)
    assert _coverage(page) == 2
    err = output_refusal(capsys)
    assert f"{page} is not a coverage page hfexport wrote" in err and "never replaces a file it did not write" in err
    assert f"What to do: name another page (-o {tmp_path / 'coverage-coverage.md'}), or move {page} away" in err
    assert files_kept(tmp_path) == before and cases_run == []


@pytest.mark.parametrize("content", ["{}", "my notes", '{"runs": ["mine"], "results": [{"arch": "bert"}]}'])
def test_a_json_beside_the_page_that_hfexport_did_not_write_is_refused(tmp_path, capsys, cases_run, content):
    (tmp_path / "notes.json").write_text(content)
    (tmp_path / "notes.json").chmod(0o640)
    before = files_kept(tmp_path)
    assert _coverage(tmp_path / "notes.md", "--merge") == 2
    err = output_refusal(capsys)
    assert f"{tmp_path / 'notes.json'}, where the page's results go, is not the results JSON of hfexport coverage (" \
           in err and f"or move {tmp_path / 'notes.json'} away" in err
    assert files_kept(tmp_path) == before and cases_run == []


def test_a_page_named_as_its_own_json_is_refused(tmp_path, capsys, cases_run):
    assert _coverage(tmp_path / "coverage.json") == 2
    assert f"What to do: name the page's Markdown file (-o {tmp_path / 'coverage.md'})" in output_refusal(capsys)
    assert list(tmp_path.iterdir()) == [] and cases_run == []
