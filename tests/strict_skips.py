"""A pytest plugin (registered by `tests/conftest.py`): with every backend installed, a skip whose
reason is not in `DECLARED_SKIPS` is a failure, so a backend that stops importing on CI fails the
run instead of shrinking it.

On when every distribution of hfexport's `all` extra is installed, or `HFEXPORT_STRICT_SKIPS=1`;
`HFEXPORT_STRICT_SKIPS=0` turns it off. It covers a skip in a test (`pytest.skip`, a `skipif`
mark, `pytest.importorskip` in a test or fixture) and a skip of a whole module while collecting it
(a module-level `pytest.importorskip`). Expected failures (`xfail`) are not skips.

# NOTE: why the reports are changed where they are made (`pytest_runtest_makereport`,
# `pytest_make_collect_report`) rather than counted at the end of the session: under pytest-xdist
# (`-n 2 --dist loadgroup`, CI's command) the controller's session sees only what the workers send,
# and a worker does not send a *skipped* collect report (xdist 3.8 `remote.py` forwards only those
# that did not pass; `dsession.py` ignores the skipped ones). A module skipped while collecting
# becomes one collected item that fails, so the rest of the suite still runs and the failure is
# counted where every test is, under `-n 2` as without it.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re

import pytest

STRICT_ENV = "HFEXPORT_STRICT_SKIPS"


@dataclasses.dataclass(frozen=True)
class DeclaredSkip:
    """A skip expected on a run with every extra installed: the reason it gives (a regular expression,
    searched) and why it is not a failure."""

    reason: str
    why: str


#: The skips a full install may show, each with why. Everything else fails while strict.
DECLARED_SKIPS: tuple[DeclaredSkip, ...] = (
    DeclaredSkip(r"run with HFEXPORT_REAL_LLM=1",
                 why="tests/test_real_llm.py: opt-in, a 538 MB checkpoint and minutes per export; not in CI"),
    DeclaredSkip(r"run with HFEXPORT_LARGE=1",
                 why="tests/test_large_model.py: opt-in, minutes and 6 GB of disk; not in CI"),
    DeclaredSkip(r"needs root and a cgroup v1 memory controller",
                 why="tests/test_large_model.py: the memory cap is the assertion, and only root can set one"),
    DeclaredSkip(r"^checks the error raised where CUDA is absent$",
                 why="tests/backends/executorch/test_exporter.py: the error path exists only without CUDA"),
    DeclaredSkip(r"^this machine may run MLX; the error path is for other platforms$",
                 why="tests/backends/executorch/test_exporter.py: the error path exists only off macOS"),
    DeclaredSkip(r"^could not import '(ray|hypothesis|xdist)': No module named '(ray|hypothesis|xdist)'$",
                 why="the test extra's tools, not the all extra's: a run with [all] and not [test] lacks them; "
                 "CI installs [all,test], and one installed that fails to import gives another message"),
)


def strictness() -> tuple[bool, str]:
    """Whether undeclared skips fail, and why (for the report header and the failure message)."""
    setting = os.environ.get(STRICT_ENV, "")
    if setting in ("0", "1"):
        return setting == "1", f"{STRICT_ENV}={setting}"
    if setting:
        raise pytest.UsageError(f"{STRICT_ENV}={setting!r}: set it to 1 (undeclared skips fail) or 0 (they "
                                "skip), or unset it (they fail when every package of hfexport[all] is installed)")
    missing = _missing_from_all()
    if missing is None:
        return False, "hfexport is not installed, so its all extra cannot be read"
    if missing:
        return False, f"not every package of hfexport[all] is installed (missing: {', '.join(missing)})"
    return True, "every package of hfexport[all] is installed"


def _missing_from_all() -> list[str] | None:
    """The distributions of hfexport's `all` extra that are not installed; None without hfexport's metadata."""
    from packaging.requirements import Requirement

    try:
        requirements = [Requirement(line) for line in importlib.metadata.requires("hfexport") or ()]
    except importlib.metadata.PackageNotFoundError:
        return None
    wanted = [r.name for r in requirements if r.marker is not None and r.marker.evaluate({"extra": "all"})]
    missing = []
    for name in wanted:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def is_declared(reason: str) -> bool:
    """Whether `reason` (a skip's, without pytest's `Skipped: `) is one of `DECLARED_SKIPS`."""
    return any(re.search(declared.reason, reason) for declared in DECLARED_SKIPS)


def _reason(longrepr) -> str:
    """The reason of a skip report's `(path, line, "Skipped: reason")`."""
    message = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return message.removeprefix("Skipped: ")


def _failure(what: str, reason: str, why_strict: str) -> str:
    """What a skip becomes while strict: the skip's reason, why strict, and the two ways to fix it."""
    return (f"{what} was skipped for a reason not declared while strict skips are on ({why_strict}): "
            f"{reason!r}. Install or repair what it needs (pip install -e '.[all,test]', then import it to see "
            "the error), or, where the skip is expected with every extra installed, declare it in DECLARED_SKIPS "
            f"in tests/strict_skips.py with why ({STRICT_ENV}=0 turns the check off)")


class UndeclaredSkip(Exception):
    """A module was skipped while collecting it, for a reason `DECLARED_SKIPS` does not list."""


class SkippedWhileCollecting(pytest.Item):
    """The one item of a collector skipped for an undeclared reason: it fails with that reason."""

    def __init__(self, *, message: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.message = message

    def runtest(self) -> None:
        raise UndeclaredSkip(self.message)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, UndeclaredSkip):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.name} (skipped while collecting)"


_STRICT = pytest.StashKey[tuple[bool, str]]()


def pytest_configure(config) -> None:
    config.stash[_STRICT] = strictness()


def pytest_report_header(config) -> str:
    strict, why = config.stash[_STRICT]
    return f"strict skips: {'on' if strict else 'off'} ({why}; tests/strict_skips.py)"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """A test skipped for an undeclared reason fails (outermost, so an `xfail` is already marked)."""
    report = yield
    strict, why = item.config.stash[_STRICT]
    if strict and report.skipped and not hasattr(report, "wasxfail"):
        reason = _reason(report.longrepr)
        if not is_declared(reason):
            report.outcome = "failed"
            report.longrepr = _failure("this test", reason, why)
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_make_collect_report(collector):
    """A collector skipped for an undeclared reason collects one item that fails with that reason."""
    report = yield
    strict, why = collector.config.stash[_STRICT]
    if strict and report.outcome == "skipped":
        reason = _reason(report.longrepr)
        if not is_declared(reason):
            message = _failure(f"{collector.nodeid or '.'} (while collecting it)", reason, why)
            item = SkippedWhileCollecting.from_parent(collector, name="skipped_while_collecting", message=message)
            report.outcome, report.longrepr, report.result = "passed", None, [item]
    return report
