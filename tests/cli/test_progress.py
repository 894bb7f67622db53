"""The CLI's step lines (`hfexport.cli.progress`): piped, two lines a step as before; on a terminal, one line
a step that shows its running time, redrawn in place, with other writes kept above it."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from hfexport.cli.progress import Progress

TICK = 0.05


class FakeTerminal(io.StringIO):
    """A stream that says it is a terminal (its width is the default 80 columns: it has no descriptor)."""

    def isatty(self) -> bool:
        return True


def _screen(raw: str) -> list[str]:
    """What a terminal shows after `raw`: `\\r` returns to the start of the row, `\\n` starts the next one."""
    rows, column = [[]], 0
    for char in raw:
        if char == "\r":
            column = 0
        elif char == "\n":
            rows.append([])
            column = 0
        else:
            row = rows[-1]
            row.extend(" " * (column + 1 - len(row)))
            row[column] = char
            column += 1
    lines = ["".join(row).rstrip() for row in rows]
    return lines[:-1] if lines and not lines[-1] else lines


def _progress_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "hfexport-progress"]


def test_piped_each_step_is_its_start_line_and_its_end_line():
    stream = io.StringIO()
    progress = Progress(2, stream=stream, interval=TICK)
    with progress.step("loading tiny:llama"):
        time.sleep(3 * TICK)
    assert re.fullmatch(r"\[1/2\] loading tiny:llama \.\.\.\n\[1/2\] loading tiny:llama: done in \d+\.\ds\n",
                        stream.getvalue())


def test_on_a_terminal_the_running_step_shows_its_time_on_one_line_that_ends_as_the_done_line():
    terminal = FakeTerminal()
    progress = Progress(2, stream=terminal, interval=TICK)
    with progress.step("loading tiny:llama"):
        time.sleep(4 * TICK)
    with progress.step("exporting"):
        pass
    raw = terminal.getvalue()
    assert "\r[1/2] loading tiny:llama ... 0s" in raw  # redrawn while it ran
    screen = _screen(raw)
    assert len(screen) == 2 and not _progress_threads()
    assert re.fullmatch(r"\[1/2\] loading tiny:llama: done in \d\.\ds", screen[0])
    assert re.fullmatch(r"\[2/2\] exporting: done in \d\.\ds", screen[1])


def test_what_else_is_written_to_stderr_during_a_step_goes_above_its_line(monkeypatch):
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with Progress(1, interval=TICK).step("exporting"):
        time.sleep(2 * TICK)
        print("hfexport: WARNING: something to know", file=sys.stderr)  # print writes the text, then "\n"
        time.sleep(2 * TICK)
        sys.stderr.write("half a line")
        time.sleep(2 * TICK)  # not drawn over while the line is unfinished
        assert _screen(terminal.getvalue())[-1] == "half a line"
    assert sys.stderr is terminal
    screen = _screen(terminal.getvalue())
    assert screen[:2] == ["hfexport: WARNING: something to know", "half a line"]
    assert re.fullmatch(r"\[1/1\] exporting: done in \d\.\ds", screen[2]) and len(screen) == 3


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_a_failed_or_interrupted_step_stops_its_redraws_and_ends_with_the_failed_line(monkeypatch, error):
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with pytest.raises(error):
        with Progress(3, interval=TICK).step("validating"):
            time.sleep(2 * TICK)
            raise error()
    assert sys.stderr is terminal and not _progress_threads()
    written = terminal.getvalue()
    time.sleep(3 * TICK)
    assert terminal.getvalue() == written  # nothing after the last line
    assert written.endswith("\n")
    assert re.fullmatch(r"\[1/3\] validating: failed after \d\.\ds", _screen(written)[-1])


def test_a_long_label_is_cut_to_the_terminal_while_it_runs_and_written_whole_at_the_end():
    terminal = FakeTerminal()
    label = "writing /" + "x" * 120
    with Progress(1, stream=terminal, interval=TICK).step(label):
        time.sleep(2 * TICK)
    live = [piece for piece in terminal.getvalue().split("\r") if piece.strip() and "done" not in piece]
    assert live and all(len(piece.rstrip()) <= 77 for piece in live)
    assert _screen(terminal.getvalue())[0].startswith(f"[1/1] {label}: done in ")


def test_a_count_shows_on_the_live_line_at_once_and_nowhere_when_piped_or_quiet():
    terminal = FakeTerminal()
    progress = Progress(1, stream=terminal, interval=60)  # no redraw by the clock: each draw is the count's
    with progress.step("validating"):
        for done in (1, 2, 3):
            progress.count(done, 3, "model: shape")
            assert terminal.getvalue().endswith(f"\r[1/1] validating (model: shape {done}/3) ... 0s")
    assert _screen(terminal.getvalue()) == [_screen(terminal.getvalue())[0]]  # one line, ending as done
    assert re.fullmatch(r"\[1/1\] validating: done in \d\.\ds", _screen(terminal.getvalue())[0])
    progress.count(1, 2, "outside a step")  # between steps there is no line to show it on
    for stream, options in ((io.StringIO(), {}), (FakeTerminal(), {"enabled": False}),
                            (FakeTerminal(), {"heartbeat": False})):
        quiet = Progress(1, stream=stream, **options)
        with quiet.step("validating"):
            quiet.count(1, 3, "model: shape")
        assert "shape" not in stream.getvalue()


def test_the_job_passes_counts_to_a_reporter_that_takes_them_and_not_to_one_that_does_not():
    from hfexport.job.export import _Silent, _Timed

    class StepsOnly:
        total = None

        @contextlib.contextmanager
        def step(self, label):
            yield

    class Counting(StepsOnly):
        def __init__(self):
            self.counts = []

        def count(self, done, total, what):
            self.counts.append((done, total, what))

    counting = Counting()
    _Timed(counting).count(2, 3, "model: shape")
    _Timed(_Silent()).count(2, 3, "model: shape")
    _Timed(StepsOnly()).count(1, 1, "ignored")  # a reporter without `count` is told only steps
    assert counting.counts == [(2, 3, "model: shape")]


def test_validation_counts_each_shape_it_checks(dynamic_llama):
    from hfexport.validation import validate

    model, inputs, artifact = dynamic_llama("dynamo")
    told = []
    report = validate(artifact, model, inputs, on_case=lambda done, total: told.append((done, total)))
    assert [case.label for case in report.cases] == ["sample", "resized", "smallest"]
    assert told == [(1, 3), (2, 3), (3, 3)]
    told.clear()
    validate(artifact, model, inputs, resized=False, on_case=lambda done, total: told.append((done, total)))
    assert told == [(1, 1)]


def test_quiet_prints_nothing_and_no_heartbeat_keeps_the_piped_lines_on_a_terminal():
    terminal = FakeTerminal()
    with Progress(1, stream=terminal, enabled=False).step("loading"):
        pass
    assert terminal.getvalue() == ""
    with Progress(1, stream=terminal, heartbeat=False).step("loading"):
        pass
    assert "\r" not in terminal.getvalue() and terminal.getvalue().startswith("[1/1] loading ...\n")


def _on_a_terminal(*args: str) -> tuple[int, str, str]:
    """`hfexport ARGS` with stderr on a pseudo-terminal, as a user at a terminal runs it: (exit code, what the
    terminal received, stdout)."""
    primary, secondary = os.openpty()
    try:
        process = subprocess.Popen([sys.executable, "-m", "hfexport", *args], stdout=subprocess.PIPE,
                                   stderr=secondary, text=True)
    finally:
        os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # EIO: every holder of the secondary side closed it
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    stdout, _ = process.communicate(timeout=600)
    return process.returncode, b"".join(chunks).decode(errors="replace"), stdout


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_export_on_a_terminal_shows_one_line_a_step_and_the_same_report(tmp_path):
    code, raw, stdout = _on_a_terminal("export", "tiny:llama", "--task", "forward", "-o", str(tmp_path / "out"))
    assert code == 0, raw
    assert "\r[1/5] loading tiny:llama ..." in raw
    steps = [line for line in _screen(raw) if line.startswith("[")]
    assert len(steps) == 5 and all(re.search(r": done in \d+\.\ds$", line) for line in steps), steps
    assert "\r[4/5] validating in dynamo's runtime against eager (model: shape 3/3) ... " in raw  # drawn as counted
    assert stdout.splitlines()[-1] == "result: PASSED"


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_verbose_on_a_terminal_keeps_the_piped_lines(tmp_path):
    """--verbose lets native code write to the terminal, past the wrapper that keeps a live line whole."""
    code, raw, _ = _on_a_terminal("--verbose", "export", "tiny:llama", "--task", "forward", "-o", str(tmp_path / "out"))
    assert code == 0, raw
    assert "[1/5] loading tiny:llama ...\r\n" in raw and "\r[1/5]" not in raw


def _wait_for(stream: io.StringIO, text: str) -> None:
    """Until `stream` holds `text` (a condition waited on, not a time asserted: the test fails only if never)."""
    deadline = time.monotonic() + 60
    while text not in stream.getvalue():
        assert time.monotonic() < deadline, stream.getvalue()
        time.sleep(TICK)


def test_piped_a_long_step_says_it_is_still_running_with_what_it_counted():
    stream = io.StringIO()
    progress = Progress(3, stream=stream, interval=TICK, still_every=TICK)
    with progress.step("exporting decode (LlamaForCausalLM) to onnx"):
        progress.count(2, 3, "model: shape")
        _wait_for(stream, "still running")
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[1/3] exporting decode (LlamaForCausalLM) to onnx ..."
    assert re.fullmatch(r"\[1/3\] exporting decode \(LlamaForCausalLM\) to onnx: still running \(\d+s, model: shape 2/3\)",
                        lines[1])
    assert re.fullmatch(r"\[1/3\] exporting decode \(LlamaForCausalLM\) to onnx: done in \d+\.\ds", lines[-1])
    assert not _progress_threads()  # the still-running thread ended with its step
    after = stream.getvalue()
    time.sleep(3 * TICK)
    assert stream.getvalue() == after


def test_the_parts_of_a_step_share_its_number_and_each_ends_before_the_next_starts():
    stream = io.StringIO()
    progress = Progress(2, stream=stream)
    with progress.step("exporting prefill"):
        pass
    with progress.part("exporting decode"):
        pass
    with progress.step("writing"):
        pass
    with progress.part("running the folder in its LLM runner"):
        pass
    heads = [re.sub(r"( \.\.\.|: done in .*)$", "", line) for line in stream.getvalue().splitlines()]
    assert heads == ["[1/2] exporting prefill"] * 2 + ["[1/2] exporting decode"] * 2 + ["[2/2] writing"] * 2 + [
        "[2/2] running the folder in its LLM runner"] * 2
