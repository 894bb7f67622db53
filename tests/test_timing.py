"""`hfexport.timing`: the phases an export's time goes to, and the report's `timing` of one tiny
Llama export per format."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from hfexport.timing import EXPORT_GC_YOUNG, PHASES, Phases, fewer_collections, phase, recording, summary_line
from tests.harness import require_backend


def test_a_nested_phase_pauses_the_outer_one():
    phases = Phases()
    with recording(phases, "decode"):
        with phase("convert"):
            with phase("optimise"):
                time.sleep(0.01)
            with phase("serialise", component="folder"):
                pass
    seconds = phases.to_dict()
    assert list(seconds) == ["decode", "folder"] and list(seconds["decode"]) == ["convert", "optimise"]
    assert seconds["decode"]["optimise"] >= 0.01
    # the sleep counts once: to the inner phase, not to the outer one as well
    assert seconds["decode"]["convert"] < seconds["decode"]["optimise"]


def test_nothing_is_timed_outside_a_recording_nor_after_it():
    phases = Phases()
    with phase("trace"):  # no recording: a no-op
        pass
    with recording(phases, "model"):
        pass
    with phase("trace"):
        pass
    assert phases.to_dict() == {}


def test_threads_keep_their_own_open_phases():
    """Two threads time into one accumulator: each one's nesting pauses only its own phases."""
    phases = Phases()
    entered = threading.Barrier(2)

    def work(component: str) -> None:
        with recording(phases, component), phase("convert"):
            entered.wait()  # both phases open at once
            with phase("validate"):
                pass

    threads = [threading.Thread(target=work, args=(name,)) for name in ("prefill", "decode")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = phases.to_dict()
    assert sorted(seconds) == ["decode", "prefill"]
    assert all(list(own) == ["convert", "validate"] for own in seconds.values())


def test_an_unknown_phase_is_refused_and_the_summary_sums_components():
    phases = Phases()
    with recording(phases, "model"), pytest.raises(ValueError, match="unknown phase 'tracing'"):
        with phase("tracing"):
            pass
    line = summary_line({"prefill": {"trace": 1.0, "validate": 0.25}, "decode": {"trace": 1.1, "convert": 2.0}})
    assert line == "time: trace 2.1s, convert 2.0s, validate 0.2s"


@pytest.fixture
def thresholds():
    """The collector's thresholds, put back after the test whatever it set."""
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def test_fewer_collections_raises_the_young_threshold_once_and_restores_it(thresholds):
    gc.set_threshold(700, 10, 10)
    with fewer_collections():
        assert gc.get_threshold() == (EXPORT_GC_YOUNG, 10, 10)
        with fewer_collections():  # nested (the job's export holds it, and the exporter inside it)
            assert gc.get_threshold() == (EXPORT_GC_YOUNG, 10, 10)
        assert gc.get_threshold() == (EXPORT_GC_YOUNG, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)
    gc.set_threshold(80_000, 20, 5)  # a higher threshold is never lowered
    with fewer_collections():
        assert gc.get_threshold() == (80_000, 20, 5)
    assert gc.get_threshold() == (80_000, 20, 5)


def test_fewer_collections_leaves_a_switched_off_or_changed_threshold(thresholds):
    gc.set_threshold(0, 10, 10)  # the collector switched off by its thresholds stays off
    with fewer_collections():
        assert gc.get_threshold() == (0, 10, 10)
    assert gc.get_threshold() == (0, 10, 10)
    gc.set_threshold(700, 10, 10)
    with fewer_collections():
        gc.set_threshold(2_000, 10, 10)  # its owner changed it meanwhile: theirs stays
    assert gc.get_threshold() == (2_000, 10, 10)
    with pytest.raises(RuntimeError), fewer_collections():  # restored when the block raises
        raise RuntimeError
    assert gc.get_threshold() == (2_000, 10, 10)


def test_concurrent_exports_share_one_raise(thresholds):
    """Two threads' blocks overlapping in either order: raised while any is open, restored after
    the last (a thread ending first must not restore under the other)."""
    gc.set_threshold(700, 10, 10)
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with fewer_collections():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second():
        first_in.wait(5)
        with fewer_collections():
            second_in.set()
            first_out.wait(5)
            seen["after the first ended"] = gc.get_threshold()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == {"after the first ended": (EXPORT_GC_YOUNG, 10, 10)}
    assert gc.get_threshold() == (700, 10, 10)


def test_the_cli_runs_its_command_with_fewer_collections(thresholds, monkeypatch, capsys):
    """`hfexport` raises the threshold for its whole run (its imports too), and puts it back."""
    from hfexport.cli import main as cli

    gc.set_threshold(700, 10, 10)
    during = []
    monkeypatch.setattr(cli, "_command", lambda args: during.append(gc.get_threshold()) or 0)
    assert cli.main(["presets"]) == 0
    assert during == [(EXPORT_GC_YOUNG, 10, 10)] and gc.get_threshold() == (700, 10, 10)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["dynamo", "onnx", "executorch", "openvino"])
def test_the_report_times_each_phase_of_an_export(fmt, tmp_path, thresholds):
    """A tiny Llama exported through the job: each phase of the export is in the report, none
    negative, and together they take no more than the job's wall time; the collector ran less
    often while it did (`fewer_collections`)."""
    require_backend(fmt)
    import json

    from hfexport import AutoExportConfig
    from hfexport.job.export import export_to_folder

    collected_at = []  # the young threshold at each collection during the export

    def watch(stage, info):
        if stage == "start":
            collected_at.append(gc.get_threshold()[0])

    gc.set_threshold(700, 10, 10)  # Python's own: a collection at the raised threshold is the job's doing
    before = gc.get_threshold()
    gc.callbacks.append(watch)
    try:
        start = time.perf_counter()
        result = export_to_folder("tiny:llama", AutoExportConfig.from_dict({"export_format": fmt}), tmp_path / "out")
        wall = time.perf_counter() - start
    finally:
        gc.callbacks.remove(watch)
    # the export ran with the collector's young threshold raised (`fewer_collections`), put back after it
    assert max(collected_at) >= EXPORT_GC_YOUNG and gc.get_threshold() == before
    timing = result.report["timing"]
    assert json.loads((tmp_path / "out" / "report.json").read_text())["timing"] == timing
    assert {"trace", "convert", "optimise", "serialise", "validate"} <= set(timing["model"])
    assert set(timing["folder"]) <= set(PHASES)
    seconds = [s for own in timing.values() for s in own.values()]
    assert all(s >= 0 for s in seconds) and sum(seconds) <= wall
