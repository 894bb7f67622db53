"""`ExecutorchConfig(external_weights=...)`: the weights in `<name>.ptd` beside `<name>.pte`, loaded by
the runner and by ExecuTorch's own Python entry point, and refused when missing or from another export.

The exports are module fixtures (an ExecuTorch lowering takes ~10-20 s per tiny model); the config,
the CLI flag, the fingerprint and the upstream names are checked without exporting.
"""

from __future__ import annotations

import inspect
import json
import shutil

import pytest
import torch

pytest.importorskip("executorch")

from hfexport import ExecutorchConfig, ExecutorchExporter, GenerationExport, GenerationRunner, record_of  # noqa: E402
from hfexport import validate  # noqa: E402
from hfexport.backends.executorch import external  # noqa: E402
from hfexport.folder.bundle import FolderContents, save_folder  # noqa: E402
from hfexport.folder.storage import fingerprint  # noqa: E402
from hfexport.errors import RuntimeLoadError, SerializationError  # noqa: E402
from hfexport.presets import build_preset  # noqa: E402
from hfexport.runner import runner_for  # noqa: E402

ATOL = 1e-4  # as tests/backends/executorch/test_exporter.py


def _weight_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def _eager_logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


# -- without exporting -------------------------------------------------------------------------------


def test_config_takes_a_bool_or_none_and_xnnpack_only():
    assert ExecutorchConfig().external_weights is None
    assert ExecutorchConfig.from_dict(ExecutorchConfig(external_weights=True).to_dict()).external_weights is True
    with pytest.raises(ValueError, match="external_weights must be a bool"):
        ExecutorchConfig(external_weights="yes")
    with pytest.raises(ValueError, match="the mlx delegate keeps its own"):
        ExecutorchConfig(delegate="mlx", external_weights=True)


def test_cli_flag_sets_the_config_and_is_refused_outside_executorch(tmp_path, capsys):
    from hfexport.cli.export import _config_from_args
    from hfexport.cli.main import _parser, main

    def config(*flags):
        return _config_from_args(_parser().parse_args(["export", "tiny:llama", "--format", "executorch", "-o", "d",
                                                       *flags]))

    assert config("--external-weights").external_weights is True
    assert config("--no-external-weights").external_weights is False
    assert config().external_weights is None
    onnx = _config_from_args(_parser().parse_args(["export", "tiny:llama", "--format", "onnx", "-o", "d",
                                                   "--external-weights"]))
    assert onnx.external_data is True  # ONNX's name for it
    assert main(["export", "tiny:llama", "--format", "openvino", "--external-weights", "-o", str(tmp_path / "x")]) == 1
    assert "it does not apply to --format openvino (OpenVINO's are always in their .bin)" in capsys.readouterr().err


def test_automatic_mode_keeps_them_in_the_program_unless_writing_a_folder():
    """`None` is "in the `.pte`" for `export` (its program loads with `executorch.runtime`, which
    takes no data file) and "by size" for an export folder (`ExecutorchRuntimePackage.folder_config`
    sets `external_weights_over` to 64 MiB where it is unset)."""
    from hfexport.config import EXTERNAL_WEIGHTS_BYTES

    program = torch.export.export(torch.nn.Linear(64, 32), (torch.ones(2, 64),))
    size = (64 * 32 + 32) * 4
    assert external.weight_bytes(program) == size
    for over in (None, EXTERNAL_WEIGHTS_BYTES, size):
        assert external.external_reason(ExecutorchConfig(external_weights_over=over), program) is None
        assert external.external_reason(ExecutorchConfig(external_weights=True, external_weights_over=over),
                                        program).endswith("=True)")
        assert external.external_reason(ExecutorchConfig(external_weights=False, external_weights_over=over),
                                        program) is None
    assert "of weights, over the" in external.external_reason(ExecutorchConfig(external_weights_over=size - 1), program)
    package = ExecutorchExporter().runtime_package()
    assert package.folder_config(ExecutorchConfig()).external_weights_over == EXTERNAL_WEIGHTS_BYTES
    assert package.folder_config(ExecutorchConfig(external_weights_over=7)).external_weights_over == 7
    assert package.folder_config(ExecutorchConfig(external_weights=False)).external_weights_over is None
    with pytest.raises(ValueError, match="external_weights_over must be >= 0"):
        ExecutorchConfig(external_weights_over=-1)


def test_the_fingerprint_covers_size_and_both_ends(tmp_path):
    path = tmp_path / "w.ptd"
    data = bytearray(torch.randint(0, 256, (3 * 2**20,), dtype=torch.uint8).numpy().tobytes())
    path.write_bytes(data)
    recorded = fingerprint(path)
    assert recorded["bytes"] == len(data)
    for where in (0, len(data) - 1):  # a change in the first or last MiB
        changed = bytearray(data)
        changed[where] ^= 1
        path.write_bytes(changed)
        assert fingerprint(path) != recorded
    path.write_bytes(data + b"\0")
    assert fingerprint(path) != recorded
    path.write_bytes(data)
    assert fingerprint(path) == recorded


def test_the_executorch_names_outside_its_public_api_still_exist():
    """`compat.py`'s upstream names (read from executorch 1.4.1); the last assert fails the day
    `Runtime.load_program` takes a data file, when the runner should move to it."""
    from executorch.exir import ExecutorchProgramManager
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime

    assert "data_path" in portable_lib._load_for_executorch.__doc__  # pybind11: the signature is in the doc
    assert "data_map_buffer" in (portable_lib._load_for_executorch_from_buffer.__doc__ or "")
    assert "self._tensor_data" in inspect.getsource(ExecutorchProgramManager.__init__)
    assert callable(ExecutorchProgramManager.write_tensor_data_to_file)
    assert "data_path" not in inspect.signature(Runtime.load_program).parameters


# -- one graph ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_exports(tmp_path_factory, executorch_lowering):
    """Tiny Llama exported with its weights outside (saved as an export folder) and inside (the
    default, which `export` keeps in the program, as the automatic-mode test above checks), each
    lowering shared with the other tests that make it (`executorch_lowering`: the panel's, the
    re-save test's)."""
    model, inputs, outside = executorch_lowering("llama", external_weights=True)
    _, _, inside = executorch_lowering("llama")
    exporter = ExecutorchExporter()
    folder = tmp_path_factory.mktemp("external") / "llama"
    save_folder(exporter, {"model": outside}, folder, FolderContents(model=model))
    plain = exporter.save(inside, tmp_path_factory.mktemp("inside"))
    return model, inputs, outside, folder, plain[0]


@pytest.mark.slow
def test_the_manifest_lists_both_files_with_the_fingerprint(llama_exports):
    _, _, _, folder, _ = llama_exports
    entry = json.loads((folder / "manifest.json").read_text())["components"]["model"]
    assert entry["files"] == ["model.pte", "model.ptd"]
    assert entry["bytes"] == (folder / "model.pte").stat().st_size + (folder / "model.ptd").stat().st_size
    recorded = entry["external_weights"]
    assert recorded["file"] == "model.ptd" and recorded["reason"] == "ExecutorchConfig(external_weights=True)"
    assert {k: recorded[k] for k in ("bytes", "sha256_ends")} == fingerprint(folder / "model.ptd")
    assert sorted(p.name for p in folder.iterdir() if not p.name.endswith(".json")) == ["model.ptd", "model.pte"]


@pytest.mark.slow
def test_the_pte_holds_no_weights(llama_exports):
    model, _, _, folder, plain = llama_exports
    weights = _weight_bytes(model)
    outside, inside = (folder / "model.pte").stat().st_size, plain.stat().st_size
    assert outside < inside - 0.9 * weights, (outside, inside, weights)
    assert (folder / "model.ptd").stat().st_size >= 0.9 * weights


@pytest.mark.slow
def test_the_runner_loads_program_and_data_and_matches_eager(llama_exports):
    model, inputs, outside, folder, _ = llama_exports
    expected = _eager_logits(model, inputs)
    component = GenerationExport.load(folder).components["model"]
    # the runtime maps a private copy of the checked .ptd, not the folder's file
    assert component.artifact.data_path.name == "model.ptd" and component.artifact.data_path.parent != folder
    assert component.artifact.data_path.read_bytes() == (folder / "model.ptd").read_bytes()
    assert (component.runner().run(inputs)[0] - expected).abs().max() < ATOL
    # in memory, before saving (what the export job validates)
    report = validate(outside, model, inputs)
    assert report.passed, report.to_table()


@pytest.mark.slow
def test_executorch_loads_them_without_hfexport(llama_exports):
    """ExecuTorch's own Python entry point for a program with a data file (executorch 1.4.1's
    `executorch.runtime.Runtime.load_program` takes none; see `compat.load_module`)."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    model, inputs, _, folder, _ = llama_exports
    module = _load_for_executorch(str(folder / "model.pte"), data_path=str(folder / "model.ptd"))
    outputs = module.run_method("forward", [inputs["input_ids"], inputs["attention_mask"]])
    assert (outputs[0] - _eager_logits(model, inputs)).abs().max() < ATOL
    for batch, length in [(3, 5), (1, 17)]:  # the dynamic program, other sizes
        ids = torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(length))
        mask = torch.ones_like(ids)
        got = module.run_method("forward", [ids, mask])[0]
        assert (got - _eager_logits(model, {"input_ids": ids, "attention_mask": mask})).abs().max() < ATOL


@pytest.mark.slow
def test_a_missing_ptd_is_refused_at_load(llama_exports, tmp_path):
    _, _, outside, folder, _ = llama_exports
    copy = shutil.copytree(folder, tmp_path / "copy")
    (copy / "model.ptd").unlink()
    with pytest.raises(SerializationError, match=r"model\.ptd is missing from the export") as error:
        GenerationExport.load(copy)
    assert "copy the export folder again, whole" in error.value.remedy
    # the program alone, as a caller may load it: the runner names the file it needs
    program = ExecutorchExporter().load([copy / "model.pte"])
    with pytest.raises(RuntimeLoadError, match="keeps its weights in model.ptd") as error:
        runner_for(program, record_of(outside))
    assert error.value.remedy and "model.ptd" in error.value.remedy


@pytest.mark.slow
def test_a_ptd_from_another_export_is_refused_at_load(llama_exports, tmp_path):
    """The same architecture with other weights: same keys and shapes, other bytes."""
    _, _, outside, folder, _ = llama_exports
    other, inputs = build_preset("llama", seed=1)
    exporter = ExecutorchExporter()
    other_program = exporter.export(other, inputs, config=ExecutorchConfig(dynamic=True, external_weights=True))
    other_files = exporter.save(other_program, tmp_path)
    copy = shutil.copytree(folder, tmp_path / "copy")
    shutil.copyfile(other_files[1], copy / "model.ptd")
    with pytest.raises(SerializationError, match="model.ptd is not the file this export wrote"):
        GenerationExport.load(copy)  # the manifest's fingerprint of every file
    # the program and data file alone, as a caller may load them: the runner checks the record's
    program = ExecutorchExporter().load([copy / "model.pte", copy / "model.ptd"])
    with pytest.raises(RuntimeLoadError, match="is not the weights file model.pte was exported with") as error:
        runner_for(program, record_of(outside))
    assert "same export" in error.value.remedy


@pytest.mark.slow
def test_its_own_save_writes_the_ptd_beside_the_pte(llama_exports, tmp_path, monkeypatch):
    """`ExecutorchProgramManager.save("m.pte")` of a program whose weights are outside writes
    `m.ptd` too, which ExecuTorch's own loader opens with it; a failed save leaves no file."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    from hfexport.backends.executorch import artifact

    model, inputs, outside, folder, _ = llama_exports
    files = outside.save(tmp_path / "m.pte")
    assert files == [tmp_path / "m.pte", tmp_path / "m.ptd"]
    assert (tmp_path / "m.ptd").read_bytes() == (folder / "model.ptd").read_bytes()
    module = _load_for_executorch(str(files[0]), data_path=str(files[1]))
    got = module.run_method("forward", [inputs["input_ids"], inputs["attention_mask"]])[0]
    assert (got - _eager_logits(model, inputs)).abs().max() < ATOL
    (tmp_path / "m.pte").unlink()
    with pytest.raises(SerializationError, match="m.ptd already exists"):  # both files checked before either moves
        outside.save(tmp_path / "m.pte", overwrite=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ptd"]

    def fail(program, path):
        raise OSError("disk full")

    monkeypatch.setattr(artifact, "write_ptd", fail)  # the .pte is written first, then this fails
    with pytest.raises(OSError, match="disk full"):
        outside.save(tmp_path / "n.pte")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ptd"]


@pytest.mark.slow
def test_a_folder_moves_large_weights_out_and_export_keeps_them_in(tmp_path, monkeypatch):
    """Over the threshold (lowered here), `export` keeps `ExecutorchConfig()`'s weights in the
    program while `export_to_folder` writes them to the `.ptd`, the reason recorded."""
    from hfexport.job.export import export_to_folder

    from hfexport.backends.executorch import package

    monkeypatch.setattr(package, "EXTERNAL_WEIGHTS_BYTES", 1024)  # the folder's default threshold
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
    sample = {"input": torch.randn(2, 32, generator=torch.Generator().manual_seed(0))}
    program = ExecutorchExporter().export(model, sample, config=ExecutorchConfig())
    assert program.save(tmp_path / "alone.pte") == [tmp_path / "alone.pte"]
    assert "external_weights" not in record_of(program).details
    result = export_to_folder((model, sample), ExecutorchConfig(), tmp_path / "folder")
    assert result.manifest["components"]["model"]["files"] == ["model.pte", "model.ptd"]
    reason = result.manifest["components"]["model"]["external_weights"]["reason"]
    assert "of weights, over the 1,024 bytes of ExecutorchConfig(external_weights_over=...)" in reason, reason
    assert json.loads((tmp_path / "folder" / "export_config.json").read_text())["external_weights_over"] == 1024


# -- generation --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_static_cache_generation_export_from_the_cli_generates_like_eager(tmp_path, capsys):
    """`hfexport export tiny:llama --format executorch --external-weights --generate --static-cache 32`
    (validated in memory by the job): by default the LLM-runner program, its cache inside it (issue 30's
    command, no --multi-token-decode); then `GenerationRunner` on the saved folder."""
    from hfexport.cli.main import main

    out = tmp_path / "llama"
    code = main(["export", "tiny:llama", "--format", "executorch", "--external-weights", "--generate",
                 "--static-cache", "32", "-o", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["components"]["decode"]["files"] == ["decode.pte", "decode.ptd"]
    assert manifest["cache"] == "program" and [i["name"] for i in manifest["components"]["decode"]["inputs"]] == [
        "input_ids", "input_pos"]
    model, _ = build_preset("llama")
    prompt = torch.tensor([[5, 17, 42, 9]])
    result = GenerationRunner.load(out).generate(prompt, max_new_tokens=8, min_new_tokens=8)
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert result.tokens == expected[0, 4:].tolist()
