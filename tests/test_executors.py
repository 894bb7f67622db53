"""The executors (`hfexport.job.executors`) as the coverage matrix uses them: local and Ray give the
same cells, a lost worker is retried once, a resumed matrix runs only the cases not done."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid

import pytest

from hfexport import _versions
from hfexport.coverage import CaseResult, run_matrix
from hfexport.coverage.matrix import done_results
from hfexport.job.executors import LOST, Cell, LocalExecutor, RayExecutor
from tests.processes import KillOnce, local_ray  # noqa: F401 - local_ray is a fixture

CHEAP = (["bert", "llama"], ["dynamo"], ["export"])


def _run(executor, cells):
    got = {}
    executor.run(cells, lambda cell, result: got.__setitem__(cell.key, result))
    return got


def _counting(monkeypatch) -> list[list[str]]:
    """The commands of every subprocess the executors launch from this process."""
    launched, real = [], subprocess.run

    def run(command, *args, **kwargs):
        launched.append(list(command))
        return real(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
    return launched


def _cell(name, function):
    return Cell((name,), function, (), {"arch": name})


def test_a_lost_cell_runs_once_more_and_a_failed_one_does_not():
    calls = {"lost": 0, "failed": 0, "raises": 0}

    def lost():
        calls["lost"] += 1
        return {"status": "crash", "detail": "signal 9 in startup: ", LOST: True}

    def failed():
        calls["failed"] += 1
        return {"status": "export failure", "detail": "CaptureError: no", LOST: False}

    def raises():
        calls["raises"] += 1
        raise RuntimeError("a bug")

    got = _run(LocalExecutor(2), [_cell("lost", lost), _cell("failed", failed), _cell("raises", raises)])
    assert calls == {"lost": 2, "failed": 1, "raises": 1}
    assert got[("lost",)] == {"status": "crash",
                              "detail": "signal 9 in startup:  (retried once: the first attempt was lost too)"}
    assert got[("failed",)] == {"status": "export failure", "detail": "CaptureError: no"}
    assert got[("raises",)] == {"arch": "raises", "status": "crash",
                                "detail": "the cell's function raised: RuntimeError: a bug"}


def test_ray_missing_names_the_extra(monkeypatch):
    monkeypatch.setattr(_versions, "is_importable", lambda name: name != "ray")
    with pytest.raises(ImportError, match=r'pip install "hfexport\[ray\]"'):
        RayExecutor()


def test_an_address_nothing_answers_at_is_refused_at_once():
    """`ray.init` retries an unreachable address for minutes; the executor says so in seconds."""
    pytest.importorskip("ray")
    import socket

    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(ValueError, match=f"nothing answers at 127.0.0.1:{port}.*ray start --head"):
        RayExecutor(address=f"127.0.0.1:{port}").run([], lambda cell, result: None)


def test_an_interrupted_matrix_keeps_its_finished_cases_and_resume_runs_the_others(tmp_path, monkeypatch):
    """Saved after every case: Ctrl-C during the second case, then `--resume` runs only that one."""
    from hfexport.cli.main import main
    from hfexport.coverage import matrix

    ran = []

    def fake_case(arch, backend, mode, timeout, threads):
        ran.append(arch)
        if arch == "llama" and ran.count("llama") == 1:
            raise KeyboardInterrupt
        return {"arch": arch, "kind": "k", "backend": backend, "mode": mode, "status": "ok", "seconds": 1.0}

    monkeypatch.setattr(matrix, "case_cell", fake_case)
    output = tmp_path / "coverage.md"
    argv = ["coverage", "--only", "bert,llama", "--backends", "dynamo", "--modes", "export", "-o", str(output)]
    assert main(argv) == 130
    saved = json.loads(output.with_suffix(".json").read_text())
    assert [r["arch"] for r in saved["results"]] == ["bert"] and not output.exists()
    assert main([*argv, "--resume"]) == 0
    assert ran == ["bert", "llama", "llama"]
    saved = json.loads(output.with_suffix(".json").read_text())
    assert [(r["arch"], r["status"]) for r in saved["results"]] == [("bert", "ok"), ("llama", "ok")]
    assert saved["runs"][1].endswith(" --resume")


def test_resume_runs_crashes_and_timeouts_again():
    results = [CaseResult("a", "k", "dynamo", "export", status) for status in
               ("ok", "mismatch", "export failure", "crash", "timeout", "runtime failure")]
    assert [r.status for r in done_results(results)] == ["ok", "mismatch", "export failure", "runtime failure"]


@pytest.mark.slow
def test_a_case_whose_process_is_killed_mid_case_runs_again_and_passes(monkeypatch):
    token = uuid.uuid4().hex
    monkeypatch.setenv("HFEXPORT_TEST_TOKEN", token)  # marks this test's case processes for the killer
    launched = _counting(monkeypatch)
    with KillOnce("hfexport.coverage.case", token) as killer:
        [result] = run_matrix(["bert"], ["dynamo"], ["export"], executor=LocalExecutor(1))
    assert len(killer.killed) == 1 and len(launched) == 2
    assert result.status == "ok", result.detail


@pytest.mark.slow
def test_ray_and_local_executors_give_the_same_cells(local_ray):
    def cells(executor):
        return [(r.arch, r.backend, r.mode, r.status, r.detail, r.extra) for r in run_matrix(*CHEAP, executor=executor)]

    local = cells(LocalExecutor(2))  # one thread a case, as a Ray task of one CPU
    assert [c[3] for c in local] == ["ok", "ok"], local
    assert cells(RayExecutor()) == local


@pytest.mark.slow
def test_a_lost_ray_worker_is_retried_once(local_ray, tmp_path):
    """The worker process itself dies (`WorkerCrashedError`): once is retried, twice is a crash."""
    marker = str(tmp_path / "died")

    def die_once():
        if not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return {"status": "ok", "detail": None}

    def die_always():
        os.kill(os.getpid(), signal.SIGKILL)

    got = _run(RayExecutor(), [_cell("once", die_once), _cell("always", die_always)])
    assert got[("once",)] == {"status": "ok", "detail": None}
    assert got[("always",)]["status"] == "crash"
    assert got[("always",)]["detail"].startswith("worker lost: WorkerCrashedError")
    assert got[("always",)]["detail"].endswith("(retried once: the first attempt was lost too)")
