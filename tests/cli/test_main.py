"""The command line (`hfexport.cli.main`): every enumerated option lists its choices in `--help`,
read from the registries, and a value outside them is refused before any work; the process's entry
(`entry`) freezes the heap for the exit."""

from __future__ import annotations

import pytest

from hfexport.backends.executorch.config import DELEGATES
from hfexport.cli.main import main
from hfexport.extensions import format_names
from hfexport.presets import PRESETS
from hfexport.quantization import CLI_SCHEMES


def _help(capsys, *command: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # unwrapped


def test_export_help_lists_the_formats_schemes_and_delegates_the_registries_hold(capsys):
    text = _help(capsys, "export")
    assert f"--format FORMAT, -f FORMAT {', '.join(format_names())} (default: dynamo)" in text
    assert "with --format executorch: the delegate, " + ", ".join(DELEGATES) in text
    for fmt in format_names():  # the epilog: which schemes each format takes
        assert f"{fmt}: {', '.join(CLI_SCHEMES[fmt])}" in text
    for scheme in {scheme for schemes in CLI_SCHEMES.values() for scheme in schemes}:
        assert scheme in text.split("--quantize SCHEME ", 1)[1].split("--min-cosine", 1)[0]


def test_the_model_help_says_where_the_presets_are_instead_of_listing_them(capsys):
    text = _help(capsys, "export")
    assert "tiny:NAME (`hfexport presets` lists them)" in text
    assert "tiny:qwen3" not in text


@pytest.mark.parametrize("args, option", [
    (["--format", "tflite"], "--format/-f: invalid choice: 'tflite'"),
    (["--quantize", "nope"], "--quantize: invalid choice: 'nope'"),
    (["--format", "executorch", "--delegate", "foo"], "--delegate: invalid choice: 'foo'"),
    (["--format", "executorch", "--backend", "foo"], "--backend: invalid choice: 'foo'"),  # the old name
])
def test_a_value_outside_the_choices_is_refused_before_any_work(tmp_path, capsys, monkeypatch, args, option):
    def export_to_folder(*args, **kwargs):
        raise AssertionError("the export started")

    monkeypatch.setattr("hfexport.job.export.export_to_folder", export_to_folder)
    with pytest.raises(SystemExit) as refused:
        main(["export", "tiny:llama", *args, "-o", str(tmp_path / "out")])
    assert refused.value.code == 2  # argparse's usage error
    err = capsys.readouterr().err
    assert option in err and "(choose from " in err
    assert not (tmp_path / "out").exists()


def test_patches_takes_only_a_registered_format(capsys):
    assert "only those of this export format: " + ", ".join(format_names()) in _help(capsys, "patches")
    with pytest.raises(SystemExit) as refused:
        main(["patches", "--format", "tflite"])
    assert refused.value.code == 2 and "invalid choice: 'tflite'" in capsys.readouterr().err


def test_presets_lists_every_tiny_model_with_its_kind_and_class(capsys):
    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(PRESETS)
    for line, (name, preset) in zip(lines, PRESETS.items()):
        fields = line.split()
        assert fields[:3] == [f"tiny:{name}", preset.kind, preset.model_class]
        assert (fields[3:] == ["--generate"]) == preset.generative


def test_version_names_the_package_and_the_torch_and_transformers_it_was_tested_with(capsys):
    from hfexport import __version__
    from hfexport._versions import TESTED_VERSIONS

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == (
        f"hfexport {__version__} (tested with torch {TESTED_VERSIONS['torch']}, transformers "
        f"{TESTED_VERSIONS['transformers']}; `hfexport env` compares what is installed)\n")


def test_help_says_what_the_command_does_for_a_user_and_how_to_start(capsys):
    text = _help(capsys)
    assert text.split(" positional arguments:")[0].endswith(
        "Export a Hugging Face transformers model to torch.export (dynamo), ONNX, ExecuTorch or OpenVINO, check the "
        "export against eager PyTorch, and run it.")
    assert "entry point" not in text and "parses arguments" not in text
    assert "hfexport export tiny:llama -f onnx -o out/llama" in text


def test_env_prints_aligned_columns(capsys):
    assert main(["env"]) == 0
    tables = capsys.readouterr().out.split("\n\n")
    for table in tables:
        rows = table.strip("\n").splitlines()[1 if table is tables[0] else 0:]
        header = rows[0].split()
        starts = [rows[0].index(cell) for cell in header[1:]] if table is tables[0] else None
        for row in rows:
            cells = row.split()
            if starts:  # each column starts where its header does, after two spaces at least
                assert [row.index(cell, start) for cell, start in zip(cells[1:4], starts)] == starts, row
                assert all(row[start - 2:start] == "  " for start in starts), row
        if not starts:  # the extras: the verdict column starts at one place
            assert len({row.index(row.split()[2]) for row in rows}) == 1, rows


def test_the_process_entry_returns_mains_code_and_freezes_the_heap_for_the_exit(monkeypatch):
    """`entry` (the console script, `python -m hfexport`) returns `main`'s exit code, and collects the
    garbage and then freezes the heap, so that the interpreter's exit does not walk it again (1.1-1.4 s
    after a 1.25 GB export), also when `main` raises; the console script is `entry`, not `main`,
    which tests and scripts call in a process that goes on (a frozen heap there would keep its garbage)."""
    import gc
    from importlib.metadata import entry_points

    from hfexport.cli import main as cli_main

    calls = []
    monkeypatch.setattr(gc, "collect", lambda *args: calls.append("collect") or 0)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(cli_main, "main", lambda argv=None: calls.append("main") or 7)
    assert cli_main.entry() == 7 and calls == ["main", "collect", "freeze"]

    def fails(argv=None):
        raise RuntimeError("a command's own failure")

    calls.clear()
    monkeypatch.setattr(cli_main, "main", fails)
    with pytest.raises(RuntimeError, match="own failure"):
        cli_main.entry()
    assert calls == ["collect", "freeze"]
    (script,) = entry_points(group="console_scripts", name="hfexport")
    assert script.value == "hfexport.cli.main:entry"


def test_python_m_hfexport_exits_with_the_heap_frozen():
    """`python -m hfexport` runs `entry`: after the command, the interpreter's exit finds the heap
    frozen (read by an exit handler registered before the module runs), and the command's output and
    exit code are its own."""
    import subprocess
    import sys

    probe = ("import atexit, gc, runpy, sys; "
             "atexit.register(lambda: print('frozen objects:', gc.get_freeze_count(), file=sys.stderr)); "
             "sys.argv = ['hfexport', 'presets']; runpy.run_module('hfexport', run_name='__main__')")
    process = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr
    assert "llama" in process.stdout
    frozen = int(process.stderr.rsplit("frozen objects:", 1)[1].split()[0])
    assert frozen > 10_000, process.stderr
