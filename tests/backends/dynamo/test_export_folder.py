"""The user's path: a dynamo generation export folder whose `.pt2` an attacker rewrote, and whose
manifest they rewrote to match (every file's size and SHA-256 "check"), is refused by
`GenerationRunner.load(DIR)` and `hfexport generate DIR` before anything the file names runs."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from hfexport import GenerationRunner
from hfexport.cli.main import main
from hfexport.errors import RuntimeLoadError
from tests.backends.dynamo.archives import (Touches, added, cache_context_edited, file_closer, first_expression, pickled,
                                            program_edited, refresh_manifest, renamed, rewrite, state,
                                            touch_expression)


@pytest.fixture(scope="module")
def export_folder(tmp_path_factory):
    """`hfexport export tiny:llama -f dynamo -o DIR`: the LLM package, a static-cache `decode.pt2`."""
    folder = tmp_path_factory.mktemp("export") / "llama"
    assert main(["export", "tiny:llama", "-f", "dynamo", "-o", str(folder), "--quiet", "--no-validate"]) == 0
    assert (folder / "decode.pt2").is_file()
    return folder


def _program_json(folder) -> dict:
    with zipfile.ZipFile(folder / "decode.pt2") as archive:
        return json.loads(archive.read("decode/models/model.json"))


def _upper_case_program(marker):
    """`models/model.JSON` instead of `models/model.json`, with an expression that touches `marker`."""
    def change(members):
        tree = json.loads(dict(members)["models/model.json"])
        first_expression(tree)["expr_str"] = touch_expression(marker)
        return renamed("models/model.json", "models/model.JSON", json.dumps(tree).encode())(members)
    return change


def _guard(marker):
    return program_edited(lambda tree: tree["guards_code"].append(f"{touch_expression(marker)} or True"))


#: attack -> (the change to decode.pt2, given the marker or victim path; what the one line says)
ATTACKS = {
    "upper-case-program": (_upper_case_program, "its member 'models/model.JSON' is not one"),
    "upper-case-example-inputs": (lambda marker: renamed("data/sample_inputs/model.pt", "DATA/sample_inputs/model.pt",
                                                         pickled(Touches(marker))),
                                  "its member 'DATA/sample_inputs/model.pt' is not one"),
    "example-inputs-pickle": (lambda marker: renamed("data/sample_inputs/model.pt", "data/sample_inputs/model.pt",
                                                     pickled(Touches(marker))),
                              "data/sample_inputs/model.pt is a pickle that needs more"),
    "extra-member": (lambda marker: added("extra/run.py", b"print('hello')"), "its member 'extra/run.py' is not one"),
    "sympy-class-outside-the-table": (
        lambda marker: program_edited(lambda tree: first_expression(tree).update(
            expr_str="Lambda(Symbol('s0', positive=True, integer=True), Integer(1))")),
        "is not a size expression of hfexport's grammar"),
    "guard": (_guard, "is not a test on input sizes"),
    "file-closer": (lambda victim: cache_context_edited(file_closer(victim)),
                    "'transformers.utils.hub:tempfile._TemporaryFileCloser', which is not a cache class registered"),
    "class-outside-the-table": (lambda marker: cache_context_edited(
        lambda t: t[2]["t"][0]["t"].__setitem__(0, {"class": "builtins:object"})), "'builtins:object', which is not"),
    "dunder-attribute": (lambda marker: cache_context_edited(
        lambda t: t[2]["t"][0]["t"].__setitem__(2, state([("__dict__", 1)]))), "sets the attribute '__dict__'"),
    "dtype-load": (lambda marker: cache_context_edited(
        lambda t: t[2]["t"][0]["t"].__setitem__(2, state([("dtype", {"dtype": "load"})]))),
        "names the dtype 'load', which is not a torch.dtype"),
}


def _tampered(export_folder, tmp_path, attack):
    """A copy of the export whose decode.pt2 carries `attack`, its manifest rewritten to match, and
    the marker (or the victim file) the attack would touch (delete)."""
    folder = tmp_path / "llama"
    shutil.copytree(export_folder, folder)
    marker = tmp_path / "victim.txt" if attack == "file-closer" else tmp_path / "ran"
    if attack == "file-closer":
        marker.write_text("keep me")
    pt2 = folder / "decode.pt2"
    rewrite(pt2, tmp_path / "decode.pt2", ATTACKS[attack][0](marker))
    os.replace(tmp_path / "decode.pt2", pt2)
    refresh_manifest(folder)
    return folder, marker


def _untouched(attack, marker) -> bool:
    gc.collect()
    return marker.read_text() == "keep me" if attack == "file-closer" else not marker.exists()


def test_the_folder_with_a_rewritten_manifest_still_generates(export_folder, tmp_path, capsys):
    """The baseline: rewriting the manifest alone keeps a folder that opens and generates."""
    folder = tmp_path / "llama"
    shutil.copytree(export_folder, folder)
    refresh_manifest(folder)
    assert main(["generate", str(folder), "--prompt-ids", "1,2,3", "--max-new-tokens", "2"]) == 0
    assert "tokens/s" in capsys.readouterr().out


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_tampered_program_is_refused_by_generation_runner_load(export_folder, tmp_path, attack):
    folder, marker = _tampered(export_folder, tmp_path, attack)
    with pytest.raises(RuntimeLoadError, match=f"refused to load decode.pt2: .*{ATTACKS[attack][1]}"):
        GenerationRunner.load(folder)
    assert _untouched(attack, marker)


@pytest.mark.parametrize("attack", ["upper-case-program", "upper-case-example-inputs", "guard", "file-closer"])
def test_a_tampered_program_is_refused_by_hfexport_generate(export_folder, tmp_path, capsys, attack):
    folder, marker = _tampered(export_folder, tmp_path, attack)
    capsys.readouterr()
    assert main(["generate", str(folder), "--prompt-ids", "1,2,3"]) == 2  # a refused folder, as a damaged one
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[-1].startswith("hfexport: error: [open] refused to load decode.pt2: ")
    assert ATTACKS[attack][1].split(".*")[0] in lines[-1] and "What to do: " in lines[-1]
    assert _untouched(attack, marker)


def test_a_fresh_process_refuses_the_upper_case_program(export_folder, tmp_path):
    """`hfexport generate` as a user runs it: a new process, nothing imported or registered first."""
    folder, marker = _tampered(export_folder, tmp_path, "upper-case-program")
    done = subprocess.run([sys.executable, "-m", "hfexport", "generate", str(folder), "--prompt-ids", "1,2,3"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("hfexport: error: [open] refused to load decode.pt2: its member 'models/model.JSON'")
    assert not marker.exists()
