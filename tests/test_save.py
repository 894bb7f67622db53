"""`bundle.save_folder` with a `FolderContents`: one graph's folder and a generation folder, and the
deprecated `save_export` / `save_generation_export` that call it. The export job's folders (every
format) are saved by it too: tests/test_manifest.py, tests/test_runtime_package.py."""

from __future__ import annotations

import json

import pytest
from transformers import GenerationConfig

from hfexport import DynamoConfig, FolderContents, GenerationExport, save_folder
from hfexport.exporter_dynamo import DynamoExporter
from hfexport.folder.package import GenerationPlan
from hfexport.presets import build_preset

MAX_CACHE_LEN = 24


@pytest.fixture(scope="module")
def llama():
    """Tiny Llama with its one graph and its generation components (a static cache), by torch.export."""
    model, inputs = build_preset("llama")
    exporter = DynamoExporter()
    program = exporter.export(model, inputs, config=DynamoConfig())
    generation_config = GenerationConfig(cache_implementation="static", max_cache_len=MAX_CACHE_LEN)
    components = exporter.export_for_generation(model, {"input_ids": inputs["input_ids"][:1]}, config=DynamoConfig(),
                                                generation_config=generation_config)
    return model, exporter, program, components, generation_config


def _written(folder):
    manifest = json.loads((folder / "manifest.json").read_text())
    return manifest, sorted(p.name for p in folder.iterdir())


def test_contents_check_their_kind():
    with pytest.raises(ValueError, match="kind must be 'model' or 'generation'"):
        FolderContents("graph")
    with pytest.raises(ValueError, match="kind='generation'"):
        FolderContents(plan=GenerationPlan({}, None, False, False, None))


def test_one_graph(llama, tmp_path):
    model, exporter, program, _, _ = llama
    contents = FolderContents(model=model, export_config=DynamoConfig(), report={"note": 1},
                              extra={"weights_from": "x"})
    saved = save_folder(exporter, {"model": program}, tmp_path / "out", contents)
    manifest, files = _written(tmp_path / "out")
    assert files == ["config.json", "export_config.json", "manifest.json", "model.pt2", "report.json"]
    assert manifest == saved.manifest
    assert (manifest["kind"], manifest["format"], manifest["model_class"]) == ("model", "dynamo", type(model).__name__)
    assert manifest["weights_from"] == "x" and "cache" not in manifest and "runtime_package" not in manifest
    assert saved.report["note"] == 1 and saved.report["artifact_bytes"] == manifest["components"]["model"]["bytes"]


def test_a_generation_folder(llama, tmp_path):
    model, exporter, _, components, generation_config = llama
    saved = save_folder(exporter, components, tmp_path / "out",
                        FolderContents("generation", model=model, generation_config=generation_config, extra={"x": 1}))
    manifest, files = _written(tmp_path / "out")
    assert files == ["config.json", "decode.pt2", "generation_config.json", "manifest.json", "prefill.pt2"]
    assert saved.report is None
    assert (manifest["kind"], manifest["cache"], manifest["max_cache_len"], manifest["x"]) == (
        "generation", "static", MAX_CACHE_LEN, 1)
    loaded = GenerationExport.load(tmp_path / "out")
    # the model's own generation config with the export's settings over it
    assert loaded.generation_config.max_cache_len == MAX_CACHE_LEN
    assert loaded.generation_config.eos_token_id == model.generation_config.eos_token_id is not None


def test_the_deprecated_functions_write_what_save_writes(llama, tmp_path):
    import hfexport

    model, exporter, program, components, generation_config = llama
    save_folder(exporter, {"model": program}, tmp_path / "model", FolderContents(model=model, extra={"x": 1}))
    save_folder(exporter, components, tmp_path / "generation",
                FolderContents("generation", model=model, generation_config=generation_config))
    with pytest.deprecated_call(match="hfexport.save_folder"):
        saved = hfexport.save_export(exporter, {"model": program}, tmp_path / "old-model", model=model,
                                     manifest_extra={"x": 1})
    assert saved.directory == (tmp_path / "old-model").resolve()
    with pytest.deprecated_call(match="hfexport.save_folder"):
        directory = hfexport.save_generation_export(exporter, components, tmp_path / "old-generation", model=model,
                                                    generation_config=generation_config)
    assert directory == (tmp_path / "old-generation").resolve()
    assert _written(tmp_path / "old-model") == _written(tmp_path / "model")
    assert _written(tmp_path / "old-generation") == _written(tmp_path / "generation")
