"""A folder from elsewhere, crafted to harm (issue 49): each test makes a runtime's LLM package the
way an attacker would hand it over, the manifest's `files` table rewritten so that every file
"checks", and opens it on the user's path (`hfexport generate`, `GenerationRunner.load`).

What each one shows: no code a file names runs, the runtime is given only the bytes that were
checked (never a file it would open by a name the model holds), and every refusal is one line,
exit status 2. The `.pt2` attacks are `tests/backends/dynamo/`'s; the manifest's own damage is
`tests/test_manifest.py`'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hfexport.cli.main import main
from hfexport.errors import ExportFolderError

pytestmark = pytest.mark.slow

NEW_TOKENS = 6


def _copy(package, tmp_path: Path) -> Path:
    return Path(shutil.copytree(package.folder, tmp_path / "copy"))


def _rehash(folder: Path, *, add: tuple[str, ...] = (), drop: tuple[str, ...] = ()) -> None:
    """Rewrite `manifest.json`'s `files` to what the folder's listed files hold now (as anyone who
    can write the files can), listing `add` too and unlisting `drop` (from the components and the
    runtime package too)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    names = (set(manifest["files"]) | set(add)) - set(drop)
    manifest["files"] = {name: {"bytes": (folder / name).stat().st_size,
                                "sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest()}
                         for name in sorted(names)}
    for entry in [*manifest["components"].values(), *filter(None, [manifest.get("runtime_package")])]:
        entry["files"] = [f for f in entry["files"] if f not in drop]
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))


def _refused(capsys, folder: Path, *args: str) -> str:
    """The one line `hfexport generate` prints refusing `folder` (exit status 2)."""
    capsys.readouterr()  # what making the package printed
    code = main(["generate", str(folder), "--prompt-ids", "5,17,42", "--max-new-tokens", "2", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("hfexport: error: [open] ") and "Traceback" not in err[0], err
    return err[0]


def _generate(folder: Path, package) -> list[int]:
    from hfexport import GenerationRunner

    return GenerationRunner.load(folder).generate(package.ids, max_new_tokens=NEW_TOKENS, eos_token_id=None).tokens


_EVIL = "import pathlib\npathlib.Path({marker!r}).write_text('ran')\n"


@pytest.mark.parametrize("named_by", ["tokenizer_config.json", "config.json"])
def test_an_auto_map_naming_code_in_the_folder_runs_nothing_even_answered_yes(llm_package, tmp_path, named_by):
    """A `tokenizer_config.json` (or `config.json`) naming a class transformers does not have and an
    `auto_map` to a module shipped in the folder, listed and hashed: transformers asks on the
    terminal whether to run it, and ran it on "y". Opened with `trust_remote_code=False`, it is
    never imported and nobody is asked; the file is refused in one line, naming it."""
    package = llm_package("llama", "onnx")
    folder = _copy(package, tmp_path)
    marker = tmp_path / "ran"
    (folder / "evil.py").write_text(_EVIL.format(marker=str(marker)))
    settings = json.loads((folder / named_by).read_text())
    if named_by == "tokenizer_config.json":
        settings.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]})
        command = ["generate", str(folder), "--prompt", "hello", "--max-new-tokens", "2"]
    else:
        settings.update(model_type="evil", auto_map={"AutoConfig": "evil.EvilConfig"})
        command = ["verify", str(folder)]
        code = f"from hfexport.folder.generation_export import GenerationExport\nGenerationExport.load({str(folder)!r}).config"
    (folder / named_by).write_text(json.dumps(settings))
    _rehash(folder, add=("evil.py",))
    runs = [[sys.executable, "-m", "hfexport.cli.main", *command]]
    if named_by == "config.json":
        runs.append([sys.executable, "-c", code])
    for run in runs:
        done = subprocess.run(run, input="y\ny\n", capture_output=True, text=True, timeout=300,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert not marker.exists(), done.stderr[-2000:]
        assert "Do you wish to run the custom code" not in done.stdout + done.stderr  # nobody was asked
        if run[1] == "-m":
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
            assert f"transformers cannot read {folder / named_by}" in lines[0] and "auto_map" in lines[0]


def test_an_onnx_model_naming_an_unlisted_weights_file_is_refused_naming_it(llm_package, tmp_path, capsys):
    """`decode.onnx` rewritten to read one weight from `hidden.bin`, a file the manifest does not
    list: ONNX Runtime would open it by that name, whatever it holds (flipped bytes in it changed
    the tokens without a word)."""
    import onnx

    package = llm_package("llama", "onnx")
    folder = _copy(package, tmp_path)
    from onnx.external_data_helper import set_external_data

    model = onnx.load(folder / "decode.onnx")
    tensor = max(model.graph.initializer, key=lambda t: len(t.raw_data))  # its largest weight moved out
    (folder / "hidden.bin").write_bytes(tensor.raw_data)
    set_external_data(tensor, "hidden.bin", offset=0, length=len(tensor.raw_data))
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.ClearField("raw_data")
    (folder / "decode.onnx").write_bytes(model.SerializeToString())
    _rehash(folder)
    line = _refused(capsys, folder)
    assert "decode.onnx names 'hidden.bin' as the file of its weights, which is not one of its files" in line
    # listed for the component, hashed, it is the export's own file: it opens (and is checked)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["components"]["decode"]["files"].append("hidden.bin")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    _rehash(folder, add=("hidden.bin",))
    assert _generate(folder, package) == package.eager(NEW_TOKENS)


def test_an_openvino_model_whose_bin_is_not_listed_is_refused_naming_it(llm_package, tmp_path, capsys):
    """The `.bin` beside an OpenVINO `.xml`, left out of the manifest: `read_model(path)` would
    read it by name, unchecked."""
    package = llm_package("llama", "openvino")
    folder = _copy(package, tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    xml = next(f for f in manifest["components"]["decode"]["files"] if f.endswith(".xml"))
    weights = xml.removesuffix(".xml") + ".bin"
    _rehash(folder, drop=(weights,))
    line = _refused(capsys, folder)
    assert f"{xml} reads its weights from {weights}, which manifest.json does not list" in line


@pytest.mark.parametrize("runtime", ["onnx", "openvino", "executorch"])
def test_the_runtime_runs_the_bytes_that_were_checked_not_a_file_swapped_after(llm_package, tmp_path, monkeypatch,
                                                                                runtime):
    """The weights file overwritten in place (a folder someone else can still write) at the two
    moments a check-then-open-by-path loader is exposed: after the manifest was read and its
    files checked, and after the folder was opened, before the runtime builds its session. The
    runtime is given the bytes read and checked, never the path: the first swap is refused (the
    bytes read are not the ones recorded), the second never reaches it (eager's tokens)."""
    import hfexport.folder.generation_export as package_module
    from hfexport import GenerationRunner
    from hfexport.folder.generation_export import GenerationExport

    package = llm_package("llama", runtime)
    folder = _copy(package, tmp_path)
    weights = max((p for p in folder.iterdir() if p.name != "manifest.json"), key=lambda p: p.stat().st_size)
    original = weights.read_bytes()

    def swap() -> None:  # the same file, its bytes changed
        with open(weights, "r+b") as stream:
            stream.write(bytes(len(original)))

    read_manifest = package_module.read_manifest

    def read_then_swap(*args, **kwargs):
        manifest = read_manifest(*args, **kwargs)
        swap()
        return manifest

    monkeypatch.setattr(package_module, "read_manifest", read_then_swap)
    with pytest.raises(ExportFolderError, match=f"{weights.name} is not the file this export wrote"):
        GenerationExport.load(folder)
    monkeypatch.undo()
    weights.write_bytes(original)
    loaded = GenerationExport.load(folder)
    swap()
    tokens = GenerationRunner(loaded).generate(package.ids, max_new_tokens=NEW_TOKENS, eos_token_id=None).tokens
    assert tokens == package.eager(NEW_TOKENS)


@pytest.mark.parametrize("edit", ["unlisted decoder", "custom-op library", "execution provider"])
def test_a_genai_config_naming_what_hfexport_never_writes_is_refused(llm_package, tmp_path, capsys, edit):
    """onnxruntime-genai's `genai_config.json` can name other model files, a custom-op library it
    loads into the process, and execution providers; the folder's is refused unless it holds only
    what hfexport writes, naming only listed files."""
    package = llm_package("llama", "onnx")
    folder = _copy(package, tmp_path)
    config = json.loads((folder / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    if edit == "unlisted decoder":
        shutil.copyfile(folder / "decode.onnx", folder / "other.onnx")
        decoder["filename"] = "other.onnx"
    elif edit == "custom-op library":
        decoder["session_options"]["custom_ops_library"] = "libevil.so"
    else:
        decoder["session_options"]["provider_options"] = [{"cuda": {}}]
    (folder / "genai_config.json").write_text(json.dumps(config))
    _rehash(folder)
    line = _refused(capsys, folder)
    assert "genai_config.json" in line and "hfexport writes no such genai_config.json" in line


def test_a_link_inside_the_folder_is_named_a_link(llm_package, tmp_path, capsys):
    package = llm_package("llama", "onnx")
    folder = _copy(package, tmp_path)
    shutil.move(folder / "generation_config.json", folder / "elsewhere.json")
    (folder / "generation_config.json").symlink_to("elsewhere.json")
    line = _refused(capsys, folder)
    assert "generation_config.json is a link, not the file the export wrote" in line and "missing" not in line


def test_a_deep_or_oversized_manifest_and_a_file_for_a_folder_are_one_line(llm_package, tmp_path, capsys):
    from hfexport.folder.manifest import MAX_MANIFEST_BYTES

    package = llm_package("llama", "onnx")
    folder = _copy(package, tmp_path)
    (folder / "manifest.json").write_text("[" * 200_000 + "]" * 200_000)
    assert "nests its JSON deeper than Python's parser reads" in _refused(capsys, folder)
    with open(folder / "manifest.json", "w") as stream:  # refused by its size, before a byte is parsed
        stream.write('{"files": {' + '"x": 1, ' * (MAX_MANIFEST_BYTES // 8) + '"y": 1}}')
    assert f"hfexport reads at most {MAX_MANIFEST_BYTES:,}" in _refused(capsys, folder)
    (tmp_path / "notes.txt").write_text("the user's")
    assert "notes.txt is not a folder: it is not an hfexport export" in _refused(capsys, tmp_path / "notes.txt")
    assert "notes.txt/sub does not exist" in _refused(capsys, tmp_path / "notes.txt" / "sub")
