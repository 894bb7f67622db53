"""The CLI prints only its progress and report: other packages' log records, warnings and native output are
hidden behind one summary line (`hfexport.cli.quiet`), and `--verbose` shows them."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator

import pytest

from hfexport.cli.quiet import command_output

PROGRESS = re.compile(r"^\[\d+/\d+\] ")
SUMMARY = re.compile(r"^hfexport: (\d+) messages? from other packages hidden \((.+)\); --verbose shows them$")


def _hfexport(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hfexport", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def readme_job(tmp_path_factory):
    """The README's main job, dynamo being the fastest format: (quiet run, --verbose run)."""
    out = tmp_path_factory.mktemp("quiet") / "tiny-llama"
    job = ("export", "tiny:llama", "--format", "dynamo", "--task", "forward", "-o", str(out), "--overwrite")
    return _hfexport(*job), _hfexport("--verbose", *job)


def test_the_readme_job_prints_only_progress_report_and_one_summary(readme_job):
    quiet, _ = readme_job
    assert quiet.returncode == 0, quiet.stderr
    lines = quiet.stderr.splitlines()
    others = [line for line in lines if not PROGRESS.match(line) and not SUMMARY.match(line)]
    assert not others, "\n".join(others)
    assert sum(bool(SUMMARY.match(line)) for line in lines) <= 1
    assert PROGRESS.match(lines[0]) and "[5/5] writing" in quiet.stderr
    report = quiet.stdout.splitlines()
    assert report[0].startswith("exported LlamaForCausalLM (tiny:llama) to dynamo: ") and report[-1] == "result: PASSED"
    assert not [line for line in report if re.search(r"Warning|WARNING|^[WIE]\d{4} |^\[[\w.]+:\d+\]|^hfexport:", line)]


def test_verbose_shows_what_the_summary_counted(readme_job):
    quiet, verbose = readme_job
    assert verbose.returncode == 0, verbose.stderr
    summary = [m for line in quiet.stderr.splitlines() if (m := SUMMARY.match(line))]
    hidden = int(summary[0].group(1)) if summary else 0
    shown = [line for line in verbose.stderr.splitlines() if not PROGRESS.match(line)]
    assert not [line for line in shown if SUMMARY.match(line)]
    assert len(shown) >= hidden  # each hidden message is at least one line
    assert "hfexport: WARNING: " not in verbose.stderr  # other packages' records keep their own form
    assert verbose.stdout.splitlines()[-1] == "result: PASSED"


@contextlib.contextmanager
def _other_package() -> Iterator[logging.Logger]:
    """A logger set up the way torch sets up its own: a handler on `sys.stderr` as it is when made (inside the
    test, where capfd has replaced it), no propagation."""
    logger = logging.getLogger("otherpkg.sub")
    handler = logging.StreamHandler()
    logger.addHandler(handler)
    logger.propagate = False
    # its own level, as torch gives its loggers: in the whole suite an earlier test's package left the
    # root level or logging.disable() where a WARNING record of an unconfigured logger never got emitted
    disabled_before = logging.root.manager.disable
    logger.setLevel(logging.WARNING)
    logger.disabled = False
    logging.disable(logging.NOTSET)
    try:
        yield logger
    finally:
        logging.disable(disabled_before)
        logger.setLevel(logging.NOTSET)
        logger.removeHandler(handler)
        logger.propagate = True


def _speak(logger: logging.Logger) -> None:
    """One message of each kind another package emits, and one of hfexport's own."""
    logger.warning("a record from otherpkg")
    warnings.warn_explicit("a warning from warnpkg", UserWarning, "/x/site-packages/warnpkg/mod.py", 1)
    os.write(2, b"W1201 written by native code to fd 2\n")
    for piece in ("[", "method.cpp", ":", "12", "] ", "the runtime's log, in pieces", "\n"):
        sys.stderr.write(piece)
        sys.stderr.flush()
    print("[1/1] a progress line", file=sys.stderr, flush=True)
    logging.getLogger("hfexport").warning("hfexport's own")


def test_other_packages_are_counted_not_shown(capfd):
    logger_state = logging.Logger.callHandlers, warnings.showwarning, sys.stderr
    with _other_package() as logger, command_output() as hidden:
        _speak(logger)
    assert hidden.counts == {"otherpkg": 1, "warnpkg": 1, "native code": 2}
    assert (logging.Logger.callHandlers, warnings.showwarning, sys.stderr) == logger_state
    err = capfd.readouterr().err
    assert err.splitlines() == [
        "[1/1] a progress line",
        "hfexport: WARNING: hfexport's own",
        "hfexport: 4 messages from other packages hidden (native code, otherpkg, warnpkg); --verbose shows them"]


def test_verbose_lets_everything_through_once(capfd):
    with _other_package() as logger, pytest.warns(UserWarning, match="warnpkg"), command_output(verbose=True) as hidden:
        _speak(logger)
    assert not hidden.counts
    err = capfd.readouterr().err
    for text in ("a record from otherpkg", "W1201 written by native code", "[method.cpp:12] the runtime's log"):
        assert err.count(text) == 1, err
    assert "hfexport: WARNING: a record" not in err and "hidden" not in err  # hfexport's logger does not re-emit


def test_native_output_is_written_out_when_the_command_fails(capfd):
    with pytest.raises(RuntimeError, match="method failed"), command_output():
        os.write(2, b"[op_add.cpp:7] Check failed: the reason\n")
        raise RuntimeError("method failed")
    assert "[op_add.cpp:7] Check failed: the reason" in capfd.readouterr().err
