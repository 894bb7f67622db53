"""`hfexport.timing`: the phases an export's time goes to, and the report's `timing` of one tiny
Llama export per format."""

from __future__ import annotations

import threading
import time

import pytest

from hfexport.timing import PHASES, Phases, phase, recording, summary_line
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


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["dynamo", "onnx", "executorch", "openvino"])
def test_the_report_times_each_phase_of_an_export(fmt, tmp_path):
    """A tiny Llama exported through the job: each phase of the export is in the report, none
    negative, and together they take no more than the job's wall time."""
    require_backend(fmt)
    import json

    from hfexport import AutoExportConfig
    from hfexport.job.export import export_to_folder

    start = time.perf_counter()
    result = export_to_folder("tiny:llama", AutoExportConfig.from_dict({"export_format": fmt}), tmp_path / "out")
    wall = time.perf_counter() - start
    timing = result.report["timing"]
    assert json.loads((tmp_path / "out" / "report.json").read_text())["timing"] == timing
    assert {"trace", "convert", "optimise", "serialise", "validate"} <= set(timing["model"])
    assert set(timing["folder"]) <= set(PHASES)
    seconds = [s for own in timing.values() for s in own.values()]
    assert all(s >= 0 for s in seconds) and sum(seconds) <= wall
