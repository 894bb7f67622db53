"""ONNX weights outside the graph (issue 18): one `<name>.onnx.data` file beside it, listed in the
manifest with its fingerprint; loaded by ONNX Runtime and `hfexport generate`; a missing or
replaced weights file is a clear error at load."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from hfexport import AutoExportConfig, GenerationRunner
from hfexport.errors import SerializationError
from hfexport.job.export import GenerationOptions, export_to_folder
from hfexport.presets import build_preset
from tests.harness import require_backend

MAX_CACHE_LEN = 32
PROMPT = [5, 17, 42, 9, 77]


@pytest.fixture(scope="module")
def external(tmp_path_factory):
    """tiny:llama's static-cache generation export with external weights, and its eager model."""
    require_backend("onnx")
    model, inputs = build_preset("llama")
    config = AutoExportConfig.from_dict({"export_format": "onnx", "dynamic": True, "external_data": True})
    folder = tmp_path_factory.mktemp("onnx-external") / "export"
    # validated, as the CLI exports it
    export_to_folder((model, inputs), config, folder,
                     generation=GenerationOptions(generate=True, multi_token_decode=True, static_cache=MAX_CACHE_LEN))
    return folder, model


def test_the_weights_are_one_file_beside_the_graph_and_the_manifest_names_it(external):
    folder, model = external
    entry = json.loads((folder / "manifest.json").read_text())["components"]["decode"]
    assert entry["files"] == ["decode.onnx", "decode.onnx.data"]
    import onnx

    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    graph = onnx.load(str(folder / "decode.onnx"), load_external_data=False).graph
    inline = sum(len(t.raw_data) for t in graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL)
    assert inline < 0.05 * weights and (folder / "decode.onnx.data").stat().st_size >= 0.9 * weights
    listed = json.loads((folder / "manifest.json").read_text())["files"]  # each file's size and SHA-256
    assert all(listed[f]["bytes"] == (folder / f).stat().st_size for f in entry["files"])


def test_onnx_runtime_and_the_runner_generate_what_generate_does(external):
    import onnxruntime as ort

    folder, model = external
    session = ort.InferenceSession(str(folder / "decode.onnx"), providers=["CPUExecutionProvider"])
    assert {i.name for i in session.get_inputs()} >= {"input_ids", "attention_mask", "position_ids"}
    from transformers import GenerationConfig

    config = GenerationConfig(cache_implementation="static", max_cache_len=MAX_CACHE_LEN)
    with torch.no_grad():
        want = model.generate(torch.tensor([PROMPT]), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                              generation_config=config)[0, len(PROMPT):].tolist()
    assert GenerationRunner.load(folder).generate(PROMPT, max_new_tokens=8, min_new_tokens=8).tokens == want


def test_a_missing_or_replaced_weights_file_is_refused_at_load(external, tmp_path):
    folder, _ = external
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    data = copy / "decode.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF  # same size, other contents: another export's weights
    data.write_bytes(bytes(raw))
    with pytest.raises(SerializationError, match="decode.onnx.data is not the file this export wrote: its SHA-256") \
            as replaced:
        GenerationRunner.load(copy)
    assert "copy the export folder again, whole" in replaced.value.remedy
    data.unlink()
    with pytest.raises(SerializationError, match="decode.onnx.data is missing from the export"):
        GenerationRunner.load(copy)


def test_weights_over_the_threshold_go_outside_by_default(monkeypatch, tmp_path):
    from hfexport.backends.onnx import artifact

    require_backend("onnx")
    model, inputs = build_preset("bert")
    config = AutoExportConfig.from_dict({"export_format": "onnx", "dynamic": True})
    monkeypatch.setattr(artifact, "EXTERNAL_WEIGHTS_BYTES", 1000)  # the tiny BERT is over it
    outside = export_to_folder((model, inputs), config, tmp_path / "outside").manifest["components"]["model"]["files"]
    monkeypatch.setattr(artifact, "EXTERNAL_WEIGHTS_BYTES", 10**12)
    inside = export_to_folder((model, inputs), config, tmp_path / "inside").manifest["components"]["model"]["files"]
    assert outside == ["model.onnx", "model.onnx.data"] and inside == ["model.onnx"]


def test_an_export_not_yet_written_runs_from_a_scratch_file_its_weights_mapped():
    """Validation opens an in-memory program with external weights from a scratch file, prepacking
    off, so ONNX Runtime maps the weights (serialized in memory it held 3.2x them,
    `bench/export_cost.py`), and still matches eager."""
    from hfexport import OnnxConfig, OnnxExporter, validate
    from hfexport.capture.record import record_of
    from hfexport.runner import runner_for

    require_backend("onnx")
    model, inputs = build_preset("llama")
    program = OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True, external_data=True, validate=False))
    runner = runner_for(program, record_of(program))
    assert runner.session.get_session_options().get_session_config_entry("session.disable_prepacking") == "1"
    report = validate(program, model, inputs)
    assert report.passed and len(report.cases) >= 2, report.to_table()
