"""`tests/schedule.py`: the test groups run longest first by their recorded seconds, under
pytest-xdist's `loadgroup` as without it, each group's tests in their order; a group the record
does not name comes after; `--record-group-seconds` writes a run's groups into the record."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import schedule

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ("-p", "tests.schedule", "-p", "no:cacheprovider")

#: many short tests, one long group of two modules, and a module the record lacks; collected in
#: another order than the one expected (pytest collects the files by name)
MODULES = {
    "test_many": "\n".join(f"def test_{i}():\n    pass\n" for i in range(4)),
    "test_new": "def test_new():\n    pass\n",
    "test_x_long_a": "def test_a1():\n    pass\n\ndef test_a2():\n    pass\n",
    "test_x_long_b": "def test_b():\n    pass\n",
}
#: the groups as `tests/conftest.py` marks them: the two long modules share one
GROUPING = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        path = item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group("long" if path.startswith("test_x_long") else path))
"""
RECORD = {"long": 300.0, "test_many.py": 20.0}
ORDER = ["test_x_long_a.py::test_a1", "test_x_long_a.py::test_a2", "test_x_long_b.py::test_b",
         *(f"test_many.py::test_{i}" for i in range(4)), "test_new.py::test_new"]


@pytest.fixture
def suite(pytester, monkeypatch) -> Path:
    """The four modules, their grouping and the record: the record's path."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(**MODULES)
    pytester.makeconftest(GROUPING)
    record = pytester.path / "seconds.json"
    record.write_text(json.dumps(RECORD))
    return record


def _ran(result) -> list[str]:
    """The node ids in the order the report printed them as passed (`-v`; xdist's `[gw0]` prefix and
    `@group` suffix dropped)."""
    return [next(word for word in line.split() if "::" in word).split("@")[0]
            for line in result.outlines if "PASSED" in line and "::" in line]


def test_the_longest_recorded_group_runs_first_and_an_unrecorded_one_last(pytester, suite, monkeypatch):
    monkeypatch.setattr(schedule, "UNRECORDED_NOTICE_S", -1.0)  # any group the record lacks is named
    result = pytester.runpytest(*PLUGIN, "-v", "--group-seconds", str(suite), "-p", "no:xdist")
    result.assert_outcomes(passed=8)
    assert _ran(result) == ORDER
    result.stdout.fnmatch_lines(["tests/schedule.py: not in seconds.json, so started after every group it names: "
                                 "test_new.py (0 s); record a full run's groups with --record-group-seconds"])
    assert json.loads(suite.read_text()) == RECORD  # read, not written


@pytest.mark.slow  # a worker process: ~5 s on two shared cores
def test_xdist_keeps_the_order_and_the_run_records_its_groups(pytester, suite):
    """xdist would start the group of most tests first (`--loadscope-reorder`, its default); one
    worker runs the groups in the order the scheduler hands them out."""
    pytest.importorskip("xdist")
    result = pytester.runpytest_subprocess(*PLUGIN, "-v", "-n", "1", "--dist", "loadgroup",
                                           "--group-seconds", str(suite), "--record-group-seconds")
    result.assert_outcomes(passed=8)
    assert _ran(result) == ORDER
    recorded = json.loads(suite.read_text())
    assert set(recorded) == {"long", "test_many.py", "test_new.py"}
    assert all(0 <= seconds < 60 for seconds in recorded.values())  # replaced by this run's own


def test_recording_a_part_of_the_suite_is_refused(pytester, suite):
    result = pytester.runpytest(*PLUGIN, "--group-seconds", str(suite), "--record-group-seconds", "-m", "slow")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--record-group-seconds records a whole run's groups: drop -m and -k*"])
    assert json.loads(suite.read_text()) == RECORD
