"""A pytest plugin (registered by `tests/conftest.py`): the test groups start longest first.

Under `-n 2 --dist loadgroup` (CI's command) a worker is handed the next group when it has two tests
of its last left, in the order the groups reach the scheduler. pytest-xdist's own order is by number
of tests, largest first (`--loadscope-reorder`, its default), which put a group of three tests and
one ~350-590 s export (`tests/generation/test_speech_quantized_executorch.py`) near the end, where it
could run alone while the other worker had nothing left. Here the groups are ordered by the seconds
each took in a full run, longest first (the longest-processing-time rule: what is left at the end
is short), and xdist is told to keep that order.

The seconds are `tests/group_seconds.json` (`--group-seconds PATH` reads another file), written by a
full run with `--record-group-seconds` (`pytest -n 2 --dist loadgroup --record-group-seconds`): it
keeps the groups that run did not reach and replaces the others. A group the file does not name
starts after every named one, in collection order; the order only moves when tests run, never what
they check.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

GROUP_SECONDS = Path(__file__).with_name("group_seconds.json")

#: a group the record does not name that took longer than this is named at the end of the run
UNRECORDED_NOTICE_S = 60.0


def group_of(item: pytest.Item) -> str:
    """The item's `xdist_group` (`tests/conftest.py` marks each test with its module's or its shared
    group), or its module's path where it has none."""
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0]) if mark and mark.args else item.nodeid.split("::")[0]


def measured_seconds(path: Path) -> dict[str, float]:
    """The recorded seconds of each group (none if the file is absent)."""
    return json.loads(path.read_text()) if path.exists() else {}


def pytest_addoption(parser):
    parser.addoption("--group-seconds", type=Path, default=GROUP_SECONDS, metavar="PATH",
                     help="each test group's seconds in a full run, longest started first (tests/schedule.py)")
    parser.addoption("--record-group-seconds", action="store_true", default=False,
                     help="write each group's seconds in this run (setup, call and teardown of its tests) "
                          "into the --group-seconds file")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist is installed: keep the collection's order
        config.option.loadscopereorder = False
    if config.getoption("record_group_seconds") and (config.option.markexpr or config.option.keyword):
        raise pytest.UsageError("--record-group-seconds records a whole run's groups: drop -m and -k")
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        config.pluginmanager.register(_GroupTimer(config), "group-seconds-timer")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Longest group first; a group's tests stay in their order (trylast: after pytest's own
    reordering by fixture, and after `tests/conftest.py` marks the groups)."""
    seconds = measured_seconds(config.getoption("group_seconds"))
    first = {}
    for index, item in enumerate(items):
        first.setdefault(group_of(item), index)
    items.sort(key=lambda item: (-seconds.get(group_of(item), 0.0), first[group_of(item)]))


class _GroupTimer:
    """Sums each group's test phases as the controller receives them. At the end it writes them into
    the record (`--record-group-seconds`), or names the long groups the record lacks: they started
    after every group it names, where a long one leaves a worker running alone."""

    def __init__(self, config):
        self.path: Path = config.getoption("group_seconds")
        self.record: bool = config.getoption("record_group_seconds")
        self.seconds: dict[str, float] = defaultdict(float)
        self.groups: dict[str, str] = {}

    def pytest_collection_modifyitems(self, items):  # a run without xdist: the controller collects
        self.groups = {item.nodeid: group_of(item) for item in items}

    def pytest_runtest_logreport(self, report):
        # under `--dist loadgroup` the workers' node ids end in `@GROUP` (xdist 3.8 `remote.py`)
        nodeid = report.nodeid
        group = self.groups.get(nodeid) or (nodeid.rsplit("@", 1)[1] if "@" in nodeid else nodeid.split("::")[0])
        self.seconds[group] += report.duration

    def pytest_sessionfinish(self, session):
        if self.record:
            merged = {**measured_seconds(self.path), **{group: round(s, 1) for group, s in self.seconds.items()}}
            self.path.write_text(json.dumps(dict(sorted(merged.items(), key=lambda kv: -kv[1])), indent=1) + "\n")

    def pytest_terminal_summary(self, terminalreporter):
        if self.record:
            return
        known = measured_seconds(self.path)
        missing = [f"{group} ({seconds:.0f} s)" for group, seconds in self.seconds.items()
                   if group not in known and seconds > UNRECORDED_NOTICE_S]
        if missing:
            terminalreporter.write_line(
                f"tests/schedule.py: not in {self.path.name}, so started after every group it names: "
                f"{', '.join(missing)}; record a full run's groups with --record-group-seconds")
