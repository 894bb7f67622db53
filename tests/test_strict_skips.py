"""`tests/strict_skips.py`: while strict, a skip the suite does not declare fails, in a test and
while collecting a module, under pytest-xdist as without it; off, it skips as before."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import strict_skips

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ("-p", "tests.strict_skips", "-p", "no:cacheprovider")

SKIPS_IN_TESTS = """
import pytest

def test_skipped_by_a_call():
    pytest.skip("the backend is not there")

@pytest.mark.skipif(True, reason="an undeclared condition")
def test_skipped_by_a_mark():
    pass

def test_skipped_by_an_import():
    pytest.importorskip("no_such_backend_hfexport")

@pytest.mark.xfail(reason="a known failure", strict=True)
def test_a_known_failure():
    assert False

def test_passes():
    pass
"""

SKIPPED_MODULE = """
import pytest

pytest.importorskip("no_such_backend_hfexport")

def test_never_collected():
    pass
"""

DECLARED = """
import pytest

def test_opt_in():
    pytest.skip("a 538 MB model and minutes per export: run with HFEXPORT_REAL_LLM=1")
"""


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setenv(strict_skips.STRICT_ENV, "1")


def test_an_undeclared_skip_in_a_test_fails_when_strict(pytester, strict):
    pytester.makepyfile(SKIPS_IN_TESTS)
    result = pytester.runpytest(*PLUGIN)
    # the mark skips in setup: a failed setup is reported as an error
    result.assert_outcomes(passed=1, failed=2, errors=1, xfailed=1)
    result.stdout.fnmatch_lines(["*strict skips: on (HFEXPORT_STRICT_SKIPS=1*",
                                 "*'the backend is not there'*declare it in DECLARED_SKIPS*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_a_declared_skip_stays_a_skip_when_strict(pytester, strict):
    pytester.makepyfile(DECLARED)
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(skipped=1)
    assert result.ret == pytest.ExitCode.OK


def test_a_module_skipped_while_collecting_fails_when_strict(pytester, strict):
    pytester.makepyfile(test_backend=SKIPPED_MODULE, test_other="def test_runs():\n    pass\n")
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, failed=1)  # the rest of the suite still runs
    result.stdout.fnmatch_lines(["*test_backend.py (while collecting it) was skipped*"
                                 "could not import 'no_such_backend_hfexport'*"])


@pytest.mark.slow  # two worker processes: ~7 s on two shared cores
def test_a_module_skipped_while_collecting_fails_under_xdist(pytester, strict, monkeypatch):
    """xdist's workers do not send a skipped collect report to the controller: the failure must be
    made on the worker, and reach the controller's count."""
    pytest.importorskip("xdist")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_backend=SKIPPED_MODULE, test_other="def test_runs():\n    pass\n")
    result = pytester.runpytest_subprocess(*PLUGIN, "-n", "2")
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_skips_stay_skips_when_off(pytester, monkeypatch):
    monkeypatch.setenv(strict_skips.STRICT_ENV, "0")
    pytester.makepyfile(SKIPS_IN_TESTS, test_backend=SKIPPED_MODULE)
    result = pytester.runpytest(*PLUGIN, "-rs")
    result.assert_outcomes(passed=1, skipped=4, xfailed=1)
    result.stdout.fnmatch_lines(["*strict skips: off (HFEXPORT_STRICT_SKIPS=0*"])
    assert result.ret == pytest.ExitCode.OK


@pytest.mark.parametrize(("missing", "strict", "why"), [
    ([], True, "every package of hfexport[all] is installed"),
    (["executorch"], False, "missing: executorch"),
    (None, False, "hfexport is not installed"),
])
def test_without_the_variable_it_is_on_when_every_package_of_all_is_installed(monkeypatch, missing, strict, why):
    monkeypatch.delenv(strict_skips.STRICT_ENV, raising=False)
    monkeypatch.setattr(strict_skips, "_missing_from_all", lambda: missing)
    assert strict_skips.strictness()[0] is strict and why in strict_skips.strictness()[1]


def test_the_packages_it_looks_for_are_the_all_extras():
    import tomllib

    from packaging.requirements import Requirement

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["all"]
    missing = strict_skips._missing_from_all()  # None where hfexport is not installed (no metadata)
    assert missing is None or set(missing) <= {Requirement(line).name for line in extra}


def test_another_value_of_the_variable_is_refused(monkeypatch):
    monkeypatch.setenv(strict_skips.STRICT_ENV, "yes")
    with pytest.raises(pytest.UsageError, match="set it to 1"):
        strict_skips.strictness()
