"""What an export may write and replace (`hfexport.folder.output_folder`), on the user's path: the CLI as a
user types it (`main`, and a subprocess where signals and a second process matter) and the Python API.

Every refusal is checked to leave the folder exactly as it was (same names, same bytes) and to exit 2.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hfexport.cli.main import main
from hfexport.errors import OutputFolderError
from hfexport.folder.output_folder import check_output_folder, claimed_folder


def _snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every entry under `folder` (hidden ones too) with a hash of its bytes (or what it is) and its
    mode: what a refusal must keep."""
    return {p.relative_to(folder).as_posix(): (
        f"link to {os.readlink(p)}" if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
        if p.is_file() else "dir", p.lstat().st_mode) for p in sorted(folder.rglob("*"))}


def _refusal(capsys) -> str:
    """The one line a refusal prints (nothing else, no traceback)."""
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("hfexport: error: [output] "), err
    return err


def _user_files(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "precious.txt").write_text("a week of notes")
    (folder / "mymodel").mkdir()
    (folder / "mymodel" / "weights.bin").write_bytes(os.urandom(1024))
    return folder


def _hfexport(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hfexport", *args], capture_output=True, text=True, timeout=600,
                          **kwargs)


def test_the_working_folder_is_refused_with_its_files_kept(tmp_path, monkeypatch, capsys):
    work = _user_files(tmp_path / "work")
    monkeypatch.chdir(work)
    before = _snapshot(tmp_path)
    assert main(["export", "tiny:llama", "--format", "dynamo", "-o", ".", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "is the working folder" in err and "name a new folder" in err and "Traceback" not in err
    assert _snapshot(tmp_path) == before  # not even a lock file


def test_the_models_own_folder_is_refused(tmp_path, capsys):
    from hfexport.presets import build_preset

    model, _ = build_preset("gpt2")
    model.save_pretrained(tmp_path / "ckpt")
    before = _snapshot(tmp_path)
    assert main(["export", str(tmp_path / "ckpt"), "-o", str(tmp_path / "ckpt"), "--overwrite"]) == 2
    assert "is the model's own folder" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before
    assert main(["export", str(tmp_path / "ckpt"), "-o", str(tmp_path), "--overwrite"]) == 2  # its parent
    assert "an ancestor of the model's own folder" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("overwrite", [True, False])
def test_a_folder_of_someone_elses_files_is_refused(tmp_path, capsys, overwrite):
    notes = _user_files(tmp_path / "notes")
    before = _snapshot(tmp_path)
    assert main(["export", "tiny:llama", "-o", str(notes), *(["--overwrite"] if overwrite else [])]) == 2
    err = capsys.readouterr().err
    assert "not an hfexport export" in err and "precious.txt" in err and "never deletes" in err
    assert _snapshot(tmp_path) == before


#: Paths nothing can be written at, as a user gives them in a folder holding `notes.txt` (a file),
#: `dangling` (a link to nothing) and `folder`: `(path, what the refusal says is wrong)`.
BAD_PATHS = [
    ("notes.txt/sub", "{here}/notes.txt is a file, not a folder"),
    ("notes.txt/a/b", "{here}/notes.txt is a file, not a folder"),
    ("dangling", "{here}/dangling is a link to {here}/nowhere, which does not exist"),
    ("dangling/sub", "{here}/dangling is a link to {here}/nowhere, which does not exist"),
]
#: Every option naming a path hfexport writes: `(command line before the path, what it writes there,
#: whether that is a folder)`.
OUTPUT_OPTIONS = {
    "export -o": (["export", "tiny:llama", "-o"], "the export", True),
    "export-many -o": (["export-many", "models.txt", "-o"], "the batch", True),
    "coverage -o": (["coverage", "--only", "bert", "--backends", "dynamo", "--modes", "export", "-o"],
                    "the coverage page", False),
    "fuzz --report": (["fuzz", "--examples", "1", "--report"], "the fuzz report", False),
    "fuzz --database": (["fuzz", "--examples", "1", "--database"], "the example database", True),
}
CASES = [(option, given, problem) for option in OUTPUT_OPTIONS for given, problem in BAD_PATHS] + [
    (option, "notes.txt" if is_folder else "folder", "it is a file, not a folder" if is_folder else "it is a folder")
    for option, (_, _, is_folder) in OUTPUT_OPTIONS.items()]


def _bad_paths_folder(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "notes.txt").write_text("a week of notes")
    (folder / "notes.txt").chmod(0o640)
    (folder / "dangling").symlink_to(folder / "nowhere")
    (folder / "folder").mkdir()
    (folder / "models.txt").write_text("tiny:llama\n")
    return folder


@pytest.fixture
def no_work(monkeypatch):
    """Any export, coverage case or fuzz example started fails the test: refusals come first."""
    import hfexport.job.batch
    import hfexport.coverage.matrix
    import hfexport.fuzz.driver

    def started(*args, **kwargs):
        raise AssertionError("work started before the output path was checked")

    for module, name in ((hfexport.job.batch, "export_cell"), (hfexport.coverage.matrix, "case_cell"),
                         (hfexport.fuzz.driver, "_round")):
        monkeypatch.setattr(module, name, started)


@pytest.mark.parametrize(("option", "given", "problem"), CASES, ids=[f"{o} {g}" for o, g, _ in CASES])
def test_an_output_path_nothing_can_be_written_at_is_one_line_before_any_work(tmp_path, monkeypatch, capsys, no_work,
                                                                             option, given, problem):
    command, what, _ = OUTPUT_OPTIONS[option]
    monkeypatch.chdir(_bad_paths_folder(tmp_path))
    before = _snapshot(tmp_path)
    assert main([*command, given]) == 2
    err = _refusal(capsys)
    assert f"cannot write {what} at {tmp_path / given}: {problem.format(here=tmp_path)} What to do: " in err
    assert _snapshot(tmp_path) == before


def test_the_remedy_for_a_file_in_place_of_the_folder_names_a_folder_beside_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(_bad_paths_folder(tmp_path))
    assert main(["export", "tiny:llama", "-o", "notes.txt/sub"]) == 2
    assert f"What to do: name a path outside that file (-o {tmp_path / 'sub'})" in _refusal(capsys)
    assert main(["export", "tiny:llama", "-f", "onnx", "-o", "notes.txt"]) == 2
    assert f"What to do: name a new folder (-o {tmp_path / 'llama-onnx'})" in _refusal(capsys)


def _as_a_user_who_cannot_write_everywhere() -> dict:
    """`subprocess` arguments that run the command without root's power to write in any folder: as
    root (a container, CI), its capability bounding set emptied (`setpriv --bounding-set=-all`), so
    that the child has no `CAP_DAC_OVERRIDE`; as anyone else, as is."""
    if getattr(os, "geteuid", lambda: None)() != 0:  # not root, or not POSIX
        return {}

    def drop_capabilities() -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        for capability in range(64):  # PR_CAPBSET_DROP: the ones past the kernel's last fail, harmlessly
            libc.prctl(24, capability, 0, 0, 0)

    return {"preexec_fn": drop_capabilities}


@pytest.mark.parametrize("option", OUTPUT_OPTIONS)
def test_a_folder_you_cannot_write_in_is_refused_before_any_work(tmp_path, option):
    command, what, _ = OUTPUT_OPTIONS[option]
    locked = _bad_paths_folder(tmp_path) / "locked"
    locked.mkdir(mode=0o555)
    before = _snapshot(tmp_path)
    run = _hfexport(*command, str(locked / "out"), cwd=tmp_path, **_as_a_user_who_cannot_write_everywhere())
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [
        f"hfexport: error: [output] cannot write {what} at {locked / 'out'}: you cannot write in {locked} "
        f"What to do: name another path ({command[-1]}) where you can write, or get write access to {locked}"]
    assert _snapshot(tmp_path) == before


def test_home_roots_and_ancestors_are_refused_whatever_they_hold(tmp_path, monkeypatch):
    home = tmp_path / "home" / "me"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(home)
    for folder, why in ((home, "your home folder"), (tmp_path / "home", "an ancestor of your home folder"),
                        (Path("/"), "a filesystem root")):
        with pytest.raises(OutputFolderError, match=why):
            check_output_folder(folder, overwrite=True)
    check_output_folder(home / "new-export", overwrite=True)  # a new folder inside them is fine


@pytest.fixture(scope="module")
def earlier_export(exported_by_cli):
    """A generation export (prefill and decode) to replace, as a user wrote it (`hfexport export
    tiny:llama --generate`, shared with tests/cli/test_generate_output.py; each test works on a copy)."""
    return exported_by_cli("tiny:llama", "--generate")


def _copy(folder: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(folder, to)
    return to


@pytest.mark.slow
def test_overwrite_replaces_an_earlier_export_and_only_its_files(earlier_export, tmp_path, capsys):
    out = _copy(earlier_export, tmp_path / "out")
    out.chmod(0o750)  # the user's choice of who reads the folder, which a replacement keeps
    assert {"prefill.pt2", "decode.pt2"} <= {p.name for p in out.iterdir()}
    assert main(["export", "tiny:llama", "-o", str(out), "--quiet"]) == 2  # without --overwrite
    assert "already holds an earlier hfexport export" in capsys.readouterr().err
    assert main(["export", "tiny:llama", "--task", "forward", "-o", str(out), "--overwrite", "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [  # tiny:llama's tokenizer and chat template beside the graph
        "chat_template.jinja", "config.json", "export_config.json", "manifest.json", "model.pt2", "report.json",
        "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging, no old copy, no lock file
    assert out.stat().st_mode & 0o777 == 0o750


@pytest.mark.slow
def test_an_earlier_export_holding_a_users_file_is_refused(earlier_export, tmp_path, capsys):
    out = _copy(earlier_export, tmp_path / "out")
    (out / "notes.md").write_text("mine")
    before = _snapshot(tmp_path)
    assert main(["export", "tiny:llama", "-o", str(out), "--overwrite", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "files it did not write (notes.md)" in err and "move those files out" in err
    assert _snapshot(tmp_path) == before


def test_the_python_api_keeps_the_same_rules(tmp_path):
    from hfexport import DynamoConfig
    from hfexport.folder.bundle import FolderContents, save_folder
    from hfexport.exporter_dynamo import DynamoExporter
    from hfexport.job.export import export_to_folder
    from hfexport.presets import build_preset

    notes = _user_files(tmp_path / "notes")
    before = _snapshot(tmp_path)
    with pytest.raises(OutputFolderError, match="not an hfexport export"):
        export_to_folder("tiny:llama", DynamoConfig(), notes, overwrite=True)
    model, inputs = build_preset("llama")
    program = DynamoExporter().export(model, inputs, config=DynamoConfig())
    with pytest.raises(OutputFolderError, match="not an hfexport export"):
        save_folder(DynamoExporter(), {"model": program}, notes, FolderContents(model=model), overwrite=True)
    assert _snapshot(tmp_path) == before


def test_a_failed_export_removes_the_parent_folders_it_made(tmp_path):
    from hfexport import DynamoConfig
    from hfexport.job.export import export_to_folder

    with pytest.raises(TypeError):  # fails after the folder is claimed (its parents made) and before writing
        export_to_folder(42, DynamoConfig(), tmp_path / "a" / "b" / "out")
    assert list(tmp_path.iterdir()) == []


def test_a_second_writer_is_refused_at_once(tmp_path, capsys):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from hfexport.folder.output_folder import claimed_folder\n"
         f"with claimed_folder({str(out)!r}, overwrite=False):\n    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        assert main(["export", "tiny:llama", "-o", str(out)]) == 2
        assert time.monotonic() - started < 10  # before loading or exporting anything
        err = capsys.readouterr().err
        assert "another hfexport export is writing" in err and "wait for it to finish" in err
    finally:
        holder.kill()
        holder.wait()
    assert not out.exists()


@pytest.mark.slow
def test_two_exports_started_together_into_one_folder(tmp_path):
    out = tmp_path / "out"
    runs = [subprocess.Popen([sys.executable, "-m", "hfexport", "export", "tiny:llama", "--task", "forward", "-o",
                              str(out), "--quiet"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(run.wait(timeout=600), run.stderr.read()) for run in runs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert "another hfexport export is writing" in refused or "already holds an earlier hfexport export" in refused
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (out / "model.pt2").is_file()


def test_a_dead_writers_staging_folder_is_removed_and_a_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".out.partial-{dead.pid}-abcd"
    stale.mkdir()
    (stale / "model.pt2").write_bytes(b"half")
    live = tmp_path / f".out.partial-{os.getppid()}-efgh"  # a process that is running
    live.mkdir()
    (tmp_path / ".out.hfexport-lock").touch()  # a killed writer's lock file: its lock died with it
    with claimed_folder(tmp_path / "out", overwrite=False):
        assert (tmp_path / ".out.hfexport-lock").is_file()
    assert not stale.exists() and live.is_dir()
    assert not (tmp_path / ".out.hfexport-lock").exists()  # the lock file goes with the lock


def test_a_new_export_folder_gets_the_users_umask_not_a_private_mode(tmp_path):
    from hfexport import DynamoConfig
    from hfexport.job.export import JudgingOptions, export_to_folder
    from hfexport.presets import build_preset

    previous = os.umask(0o022)
    try:
        export_to_folder(build_preset("llama"), DynamoConfig(), tmp_path / "out",
                         judging=JudgingOptions(validate=False))
    finally:
        os.umask(previous)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755  # shared folders: others may read it


@pytest.mark.slow
def test_sigterm_mid_export_keeps_the_earlier_export_and_leaves_nothing(earlier_export, tmp_path):
    out = _copy(earlier_export, tmp_path / "out")
    before = _snapshot(tmp_path)
    run = subprocess.Popen([sys.executable, "-m", "hfexport", "export", "tiny:llama", "--format", "onnx",
                            "--generate", "-o", str(out), "--overwrite"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in run.stderr:  # the progress display: SIGTERM once the export itself has started
        seen.append(line)
        if "exporting" in line:
            break
    run.send_signal(signal.SIGTERM)
    code = run.wait(timeout=300)
    err = "".join(seen) + run.stderr.read()
    assert code == 128 + signal.SIGTERM, err
    assert "interrupted; nothing was written" in err and "Traceback" not in err
    assert _snapshot(tmp_path) == before


def test_another_thread_of_the_process_is_refused_and_the_holding_thread_passes_through(tmp_path):
    import threading

    out, seen = tmp_path / "out", []

    def other_thread():
        try:
            with claimed_folder(out, overwrite=False):
                seen.append("claimed")
        except OutputFolderError as error:
            seen.append(str(error))

    with claimed_folder(out, overwrite=False):
        with claimed_folder(out, overwrite=False):  # save inside the export job
            seen.append("again")
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert seen[0] == "again" and "another hfexport export is writing" in seen[1], seen
    assert list(tmp_path.iterdir()) == []
