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
def readme_job(cli_run, tmp_path_factory):
    """The README's main job, dynamo being the fastest format: (quiet run, --verbose run). The quiet
    run is the one tests/cli/test_cli.py reads (`cli_run`)."""
    job = ("tiny:llama", "--format", "dynamo", "--task", "forward", "--overwrite")
    _, quiet = cli_run(*job)
    out = tmp_path_factory.mktemp("quiet") / "tiny-llama"
    return quiet, _hfexport("--verbose", "export", *job, "-o", str(out))


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


# Every test below logs from its own thread, synchronously, inside the block, on loggers it sets up
# itself (not propagating to the root logger, where pytest's own handlers sit): the counts cannot
# depend on thread scheduling, on native stderr or on what importing a library happened to log.


@contextlib.contextmanager
def _logger(name: str, *handlers: logging.Handler) -> Iterator[logging.Logger]:
    """`name`'s logger with only `handlers`, not propagating, at WARNING, put back as it was after."""
    logger = logging.getLogger(name)
    before = logger.handlers[:], logger.propagate, logger.level, logger.disabled, logging.root.manager.disable
    logger.handlers[:] = handlers
    logger.propagate, logger.disabled = False, False
    logger.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)
    try:
        yield logger
    finally:
        logger.handlers[:] = before[0]
        logger.propagate, logger.disabled = before[1], before[3]
        logger.setLevel(before[2])
        logging.disable(before[4])


def test_a_record_of_a_logger_without_handlers_is_counted_under_its_package(capfd):
    last_resort = logging.lastResort
    with _logger("rootpkg.sub") as logger, command_output() as hidden:
        logger.warning("one")
        logger.warning("two")
        logger.info("below the level: never made, never counted")
    assert hidden.counts == {"rootpkg": 2}
    assert logging.lastResort is last_resort
    err = capfd.readouterr().err
    assert "one" not in err and err.splitlines() == [
        "hfexport: 2 messages from other packages hidden (rootpkg); --verbose shows them"]


def test_a_record_reaching_two_console_handlers_is_counted_once_and_their_filters_are_removed(capfd):
    own, parent = logging.StreamHandler(sys.stderr), logging.StreamHandler(sys.stderr)
    with _logger("twopkg", parent), _logger("twopkg.sub", own) as logger:
        logger.propagate = True
        with command_output() as hidden:
            logger.warning("shown by neither")
        assert hidden.counts == {"twopkg": 1}
        assert not own.filters and not parent.filters
        logger.warning("after the command")  # printed again, by both
    err = capfd.readouterr().err
    assert "shown by neither" not in err and err.count("after the command") == 2


def test_transformers_is_quieted_by_its_own_verbosity_and_a_users_setting_is_put_back():
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_info()
    try:
        with command_output():
            assert hf_logging.get_verbosity() == logging.ERROR
        assert hf_logging.get_verbosity() == logging.INFO
    finally:
        hf_logging.set_verbosity(before)


def test_torch_is_quieted_by_set_logs_and_its_earlier_settings_are_put_back():
    import torch._logging

    torch._logging.set_logs(export=logging.INFO)
    try:
        with command_output():
            assert logging.getLogger("torch").level == logging.ERROR
            assert logging.getLogger("torch.export").getEffectiveLevel() == logging.ERROR
        assert logging.getLogger("torch.export").level == logging.INFO
        assert logging.getLogger("torch").level == logging.WARNING
    finally:
        torch._logging.set_logs()


def test_onnxruntime_and_nncf_are_quieted_by_their_controls_and_put_back(monkeypatch):
    import nncf
    import onnxruntime

    severities = []
    monkeypatch.setattr(onnxruntime, "set_default_logger_severity", severities.append)
    nncf_logger = logging.getLogger("nncf")
    before = nncf_logger.level
    with command_output():
        assert nncf_logger.level == logging.ERROR and severities == [3]
    assert nncf_logger.level == before and severities == [3, 2]


def test_verbose_leaves_every_library_as_it_was(monkeypatch):
    import onnxruntime
    from transformers.utils import logging as hf_logging

    severities = []
    monkeypatch.setattr(onnxruntime, "set_default_logger_severity", severities.append)
    before = hf_logging.get_verbosity()
    with command_output(verbose=True):
        assert hf_logging.get_verbosity() == before and not severities


def test_a_library_imported_during_the_command_is_quieted_as_its_import_ends(tmp_path, monkeypatch):
    from hfexport.cli.quiet import Control, _libraries_quiet

    (tmp_path / "latepkg").mkdir()
    (tmp_path / "latepkg" / "__init__.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "latepkg", raising=False)
    seen = []

    def quiet():
        seen.append(("quiet", sys.modules["latepkg"].LOADED))
        return lambda: seen.append(("restore", None))

    finders = list(sys.meta_path)
    with _libraries_quiet((Control("latepkg", quiet),)):
        assert seen == []
        import latepkg
        assert seen == [("quiet", True)]
        assert type(latepkg.__loader__).__name__ != "_ThenLoader" and latepkg.__spec__.loader is latepkg.__loader__
    assert seen == [("quiet", True), ("restore", None)] and sys.meta_path == finders
    with _libraries_quiet((Control("latepkg", quiet),)):  # imported already: quieted at the start
        assert seen[-1] == ("quiet", True)
    monkeypatch.delitem(sys.modules, "latepkg")
