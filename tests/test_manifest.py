"""Opening an export folder from elsewhere (`hfexport.folder.manifest`, `GenerationExport.load`): only what
its manifest lists, inside the folder, each file's bytes as written, on the user's path (`hfexport
generate` and `GenerationRunner.load`).

One ONNX generation export with its weights in a multi-MB `.onnx.data` is made for the module; each
test damages a copy of it the way a copy between machines or a folder from someone else might.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from hfexport.cli.main import main
from hfexport.errors import ExportFolderError
from hfexport.folder.manifest import MANIFEST_VERSION, owned_files, read_manifest
from tests.harness import require_backend

pytestmark = pytest.mark.slow

PROMPT = [[5, 17, 42, 9, 3]]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """`(folder, model)`: a Llama with an 8192-token vocabulary (its weights ~9 MB, in
    `decode.onnx.data`), exported with `--generate` through the export job."""
    require_backend("onnx")
    from transformers import LlamaConfig, LlamaForCausalLM

    from hfexport import OnnxConfig
    from hfexport.job.export import GenerationOptions, export_to_folder

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8192, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(config).eval()
    inputs = {"input_ids": torch.tensor(PROMPT), "attention_mask": torch.ones(1, 5, dtype=torch.long)}
    folder = tmp_path_factory.mktemp("saved") / "export"
    export_to_folder((model, inputs), OnnxConfig(dynamic=True, external_data=True), folder,
                     generation=GenerationOptions(generate=True))
    return folder, model


def _eager_tokens(model, n: int = 6) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor(PROMPT), max_new_tokens=n, do_sample=False)
    return out[0, len(PROMPT[0]):].tolist()


def _copy(saved, tmp_path: Path) -> Path:
    return Path(shutil.copytree(saved[0], tmp_path / "copy"))


def _edit_manifest(folder: Path, edit) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _one_line_error(capsys, folder: Path) -> str:
    assert main(["generate", str(folder), "--prompt-ids", "5,17,42"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hfexport: error: [open] ") and "Traceback" not in err[0], err
    return err[0]


def test_the_manifest_lists_every_file_with_its_hash_and_the_folder_generates_eagers_tokens(saved):
    from hfexport import GenerationRunner

    folder, model = saved
    manifest = read_manifest(folder)
    assert manifest["hfexport_manifest"] == MANIFEST_VERSION
    on_disk = sorted(p.name for p in folder.iterdir() if p.name != "manifest.json")
    assert sorted(manifest["files"]) == on_disk
    assert manifest["files"]["decode.onnx.data"]["bytes"] > 8_000_000
    from hfexport.folder.manifest import file_table

    assert manifest["files"] == file_table(folder)  # every entry what the file holds now, report.json too
    result = GenerationRunner.load(folder).generate(PROMPT[0], max_new_tokens=6)
    assert result.tokens == _eager_tokens(model)


def test_one_byte_flipped_in_the_middle_of_the_weights_is_refused_naming_the_file(saved, tmp_path, capsys):
    from hfexport import GenerationRunner

    folder = _copy(saved, tmp_path)
    weights = folder / "decode.onnx.data"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(data)
    line = _one_line_error(capsys, folder)
    assert "decode.onnx.data is not the file this export wrote" in line and "SHA-256" in line
    with pytest.raises(ExportFolderError, match="decode.onnx.data"):
        GenerationRunner.load(folder)
    GenerationRunner.load(folder, verify=False)  # the documented opt-out for a trusted folder still opens it


@pytest.mark.parametrize("path", ["../outside.onnx", "/etc/hosts", "C:\\\\Windows\\\\x.onnx", "a/../../x"])
def test_a_path_outside_the_folder_is_refused(saved, tmp_path, capsys, path):
    folder = _copy(saved, tmp_path)
    shutil.copy(folder / "decode.onnx", tmp_path / "outside.onnx")
    _edit_manifest(folder, lambda m: m["components"]["decode"]["files"].__setitem__(0, path))
    line = _one_line_error(capsys, folder)
    assert "manifest.json lists" in line
    assert ("not a relative path" in line) or ("a path outside the folder" in line)


def test_a_listed_file_that_links_out_of_the_folder_is_refused(saved, tmp_path, capsys):
    folder = _copy(saved, tmp_path)
    shutil.move(folder / "config.json", tmp_path / "config.json")
    (folder / "config.json").symlink_to(tmp_path / "config.json")
    assert "a link leading out of the folder" in _one_line_error(capsys, folder)


def test_a_truncated_or_incomplete_manifest_is_one_line(saved, tmp_path, capsys):
    folder = _copy(saved, tmp_path)
    text = (folder / "manifest.json").read_text()
    (folder / "manifest.json").write_text(text[: len(text) // 2])
    line = _one_line_error(capsys, folder)
    assert "manifest.json is not valid JSON" in line and "truncated" in line
    (folder / "manifest.json").write_text(text)
    _edit_manifest(folder, lambda m: m.pop("components"))
    assert "manifest.json lacks 'components'" in _one_line_error(capsys, folder)
    _edit_manifest(folder, lambda m: m.update(components={"decode": {"files": ["decode.onnx"]}}))
    assert "no 'inputs' list" in _one_line_error(capsys, folder)


def test_a_newer_manifest_is_refused_and_an_older_one_is_refused_until_upgraded(saved, tmp_path, capsys):
    """A manifest from hfexport 0.3 or older records no hash: refused with the remedy (nothing in
    it can be checked); `hfexport verify --upgrade` on a copy the user trusts records the hashes,
    after which it opens with every check of a new one."""
    from hfexport import GenerationRunner

    folder = _copy(saved, tmp_path)
    text = (folder / "manifest.json").read_text()
    _edit_manifest(folder, lambda m: m.update(hfexport_manifest=MANIFEST_VERSION + 1))
    line = _one_line_error(capsys, folder)
    assert f"newer hfexport (manifest version {MANIFEST_VERSION + 1}" in line and "upgrade hfexport" in line
    (folder / "manifest.json").write_text(text)
    _edit_manifest(folder, lambda m: (m.update(hfexport_manifest=2), m.pop("files")))  # as 0.3 wrote it
    line = _one_line_error(capsys, folder)
    assert "manifest version 2" in line and "nothing in it can be checked" in line
    assert "hfexport verify --upgrade" in line
    with pytest.raises(ExportFolderError, match="recorded no hash"):
        GenerationRunner.load(folder, verify=False)  # no opt-out opens it with fewer checks
    assert owned_files(folder)[0] >= {"decode.onnx", "decode.onnx.data", "config.json", "manifest.json"}
    (folder / "notes.txt").write_text("the user's")  # not the export's: not listed by the upgrade
    assert main(["verify", str(folder), "--upgrade"]) == 0
    assert f"upgraded from version 2 to {MANIFEST_VERSION}" in capsys.readouterr().out
    manifest = read_manifest(folder)
    assert manifest["hfexport_manifest"] == MANIFEST_VERSION and "notes.txt" not in manifest["files"]
    assert GenerationRunner.load(folder).generate(PROMPT[0], max_new_tokens=6).tokens == _eager_tokens(saved[1])


def test_files_the_manifest_does_not_list_are_not_read(saved, tmp_path):
    from hfexport.folder.generation_export import GenerationExport

    folder = _copy(saved, tmp_path)
    assert GenerationExport.load(folder).tokenizer is None  # the export was given no tokenizer
    # a tokenizer dropped into the folder by someone else is not the export's: it is not opened
    (folder / "tokenizer_config.json").write_text("{this is not json")
    (folder / "tokenizer.json").write_text("{nor this")
    assert GenerationExport.load(folder).tokenizer is None


def test_a_listed_file_missing_is_named(saved, tmp_path, capsys):
    folder = _copy(saved, tmp_path)
    (folder / "generation_config.json").unlink()
    assert "generation_config.json is missing from the export" in _one_line_error(capsys, folder)
