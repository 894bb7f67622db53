"""ONNX weights outside the graph (issue 18): one `<name>.onnx.data` file beside it, listed in the
manifest with its fingerprint; loaded by ONNX Runtime and `hfexport generate`; a missing or
replaced weights file is a clear error at load. The export writes them once (`scratch.py`): the
fusions' load check, validation and the folder take the same file."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil

import pytest
import torch

from hfexport import AutoExportConfig, GenerationRunner
from hfexport.errors import SerializationError
from hfexport.job.export import GenerationOptions, export_to_folder
from hfexport.presets import build_preset
from tests.harness import genai_tokens_in_a_new_process, require_backend

MAX_CACHE_LEN = 32
PROMPT = [5, 17, 42, 9, 77]


@contextlib.contextmanager
def written_bytes():
    """Count the bytes onnx_ir writes to external-data files in the block (`written["bytes"]`): every
    writer of ONNX weights, hfexport's scratch and `onnx_ir.save`'s, goes through
    `convert_tensors_to_external` (onnx_ir 1.1.0)."""
    from onnx_ir import external_data

    written = {"bytes": 0}
    original = external_data.convert_tensors_to_external

    def convert(tensors, *args, **kwargs):
        placed = original(tensors, *args, **kwargs)
        written["bytes"] += sum(tensor.length for tensor in placed)
        return placed

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(external_data, "convert_tensors_to_external", convert)
        yield written


@pytest.fixture(scope="module")
def external(tmp_path_factory):
    """tiny:llama's static-cache generation export with external weights, its eager model, and the
    weights' bytes written while exporting."""
    require_backend("onnx")
    model, inputs = build_preset("llama")
    config = AutoExportConfig.from_dict({"export_format": "onnx", "dynamic": True, "external_data": True})
    folder = tmp_path_factory.mktemp("onnx-external") / "export"
    # validated and checked in onnxruntime-genai, as the CLI exports it
    with written_bytes() as written:
        generation = GenerationOptions(generate=True, multi_token_decode=True, static_cache=MAX_CACHE_LEN)
        export_to_folder((model, inputs), config, folder, generation=generation)
    return folder, model, written["bytes"]


def test_the_weights_are_one_file_beside_the_graph_and_the_manifest_names_it(external):
    folder, model, _ = external
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

    folder, model, _ = external
    session = ort.InferenceSession(str(folder / "decode.onnx"), providers=["CPUExecutionProvider"])
    assert {i.name for i in session.get_inputs()} >= {"input_ids", "attention_mask", "position_ids"}
    from transformers import GenerationConfig

    config = GenerationConfig(cache_implementation="static", max_cache_len=MAX_CACHE_LEN)
    with torch.no_grad():
        want = model.generate(torch.tensor([PROMPT]), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                              generation_config=config)[0, len(PROMPT):].tolist()
    assert GenerationRunner.load(folder).generate(PROMPT, max_new_tokens=8, min_new_tokens=8).tokens == want


def test_onnxruntime_genai_in_a_fresh_process_generates_what_generate_does(external):
    """The folder's `decode.onnx.data` is the export's scratch file, linked: onnxruntime-genai opens the
    folder in a new process, as its docs run a model folder, and gives eager's greedy tokens."""
    folder, model, _ = external
    with torch.no_grad():
        want = model.generate(torch.tensor([PROMPT]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert genai_tokens_in_a_new_process(folder, PROMPT, 8) == want[0, len(PROMPT):].tolist()


def test_a_missing_or_replaced_weights_file_is_refused_at_load(external, tmp_path):
    folder, _, _ = external
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


def test_the_export_writes_its_weights_once(external):
    """The fusions' load check writes the weights to a scratch file; validation's ONNX Runtime
    session maps that file and the folder's `decode.onnx.data` is it (linked), so a validated export
    checked in onnxruntime-genai wrote its weights once (three times before: 16 of the 1.25 GB Llama's
    40 s export, `bench/RESULTS.md`)."""
    folder, _, written = external
    report = json.loads((folder / "report.json").read_text())
    assert report["components"]["decode"]["validation"]["cases"] and report["runner"]["passed"]
    assert written == (folder / "decode.onnx.data").stat().st_size


@pytest.mark.parametrize("preset", ["bert", "qwen3"])
def test_a_program_validated_then_saved_writes_its_weights_once_and_saves_what_runs(preset, tmp_path):
    """Through the Python API, on other graphs (an encoder; GQA with other head counts): `export` with
    validation, then `save`, wrote the weights once; the saved model gives eager's outputs in ONNX
    Runtime."""
    import onnxruntime as ort

    from hfexport import OnnxConfig, OnnxExporter
    from hfexport.backends.onnx.scratch import scratch_files

    require_backend("onnx")
    model, inputs = build_preset(preset)
    with written_bytes() as written:
        program = OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True, external_data=True))
        files = program.save(tmp_path / "model.onnx")
    data = tmp_path / "model.onnx.data"
    assert files == [tmp_path / "model.onnx", data] and written["bytes"] == data.stat().st_size > 0
    scratch = scratch_files(program.model)
    assert len(scratch) == 1 and os.path.samefile(scratch[0], data)  # the folder's file is the scratch's, linked
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    feed = {i.name: inputs[i.name].numpy() for i in session.get_inputs()}
    with torch.no_grad():
        want = model(**{k: v for k, v in inputs.items() if k in feed})
    got = session.run(None, feed)[0]
    key = "logits" if "logits" in want else "last_hidden_state"
    torch.testing.assert_close(torch.from_numpy(got), want[key], atol=1e-4, rtol=1e-4)


def test_a_scratch_file_goes_with_the_last_tensor_written_to_it(tmp_path):
    """The scratch file is removed once no tensor written to it lives; a model saved from it keeps
    its own name of the file. (An export's own program is not used here: onnxscript 0.7.2's rewrite
    rules keep the last graph they matched, and so its tensors, until the next rewrite.)"""
    import numpy as np
    import onnx_ir as ir
    import onnxruntime as ort

    from hfexport.backends.onnx.scratch import save_linked, scratch_files, scratch_model

    require_backend("onnx")
    weight = ir.Value(name="w", const_value=ir.tensor(np.arange(1024, dtype=np.float32).reshape(32, 32)))
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, 32]))
    node = ir.node("MatMul", [x, weight])
    node.outputs[0].name = "y"
    model = ir.Model(ir.Graph([x], node.outputs, nodes=[node], initializers=[weight], opset_imports={"": 17}),
                     ir_version=10)
    with scratch_model(model) as path:
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = np.ones((2, 32), np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": feed})[0], feed @ weight.const_value.numpy())
    scratch = scratch_files(model)
    assert len(scratch) == 1 and os.path.getsize(scratch[0]) == 4096
    saved = save_linked(model, tmp_path / "model.onnx")
    assert saved == [tmp_path / "model.onnx", tmp_path / "model.onnx.data"] and os.path.samefile(scratch[0], saved[1])
    # a file already at the weights' name is never replaced, linked or copied over
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "model.onnx.data").write_bytes(b"the user's")
    with pytest.raises(FileExistsError):
        save_linked(model, taken / "model.onnx")
    assert (taken / "model.onnx.data").read_bytes() == b"the user's" and not (taken / "model.onnx").exists()
    # another file system (no hard link across it): a copy of the scratch file, the same bytes
    def cross_device(*_):
        raise OSError(18, "Invalid cross-device link")

    (tmp_path / "copied").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "link", cross_device)
        copied = save_linked(model, tmp_path / "copied" / "model.onnx")
    assert not os.path.samefile(scratch[0], copied[1]) and copied[1].read_bytes() == saved[1].read_bytes()
    del model, weight, x, node, session
    gc.collect()
    assert not os.path.exists(scratch[0])
    session = ort.InferenceSession(str(saved[0]), providers=["CPUExecutionProvider"])
    kept = np.arange(1024, dtype=np.float32).reshape(32, 32)
    np.testing.assert_array_equal(session.run(None, {"x": feed})[0], feed @ kept)


def test_strided_weights_are_written_as_onnx_ir_writes_them(monkeypatch):
    """A folded `Transpose` leaves a weight as a strided numpy view, which the scratch writer lays out
    with torch's copy, a block of rows at a time (numpy's `tofile` of a view is ~6x slower; a transposed
    matrix's block as the matrix's column slab, transposed whole): each dtype's
    bytes are what `onnx_ir` writes, a packed 4-bit view's included (it goes through `onnx_ir`'s own
    `tofile`), a read-only view's without a warning, with blocks of one row, of a few and of the whole
    matrix."""
    import warnings
    from pathlib import Path

    import ml_dtypes
    import numpy as np
    import onnx_ir as ir

    from hfexport.backends.onnx import scratch
    from hfexport.backends.onnx.scratch import _Contiguous, _write_missing, _written

    base = np.arange(-60, 60).reshape(10, 12)
    frozen = base.astype(np.float32)
    frozen.flags.writeable = False  # a view of it is read-only: torch warns of such arrays, the write must not
    views = {
        "float32 transposed": ir.tensor(base.astype(np.float32).T),
        "float16 transposed": ir.tensor(base.astype(np.float16).T),
        "float64 every other row": ir.tensor(base.astype(np.float64)[::2]),
        "float32 every other column transposed": ir.tensor(base.astype(np.float32)[:, ::2].T),
        "float32 3-d transposed": ir.tensor(base.astype(np.float32).reshape(2, 6, 10).T),
        "int64 transposed": ir.tensor(base.T),
        "int8 transposed": ir.tensor(base.astype(np.int8).T),
        "uint16 transposed": ir.tensor(base.astype(np.uint16).T),
        "bool transposed": ir.tensor((base % 3 == 0).T),
        "contiguous float32": ir.tensor(base.astype(np.float32)),
        "int4 transposed": ir.tensor((base % 8).astype(ml_dtypes.int4).T, dtype=ir.DataType.INT4),
        "read-only float32 transposed": ir.tensor(frozen.T),
    }
    wrapped = {name for name, tensor in views.items() if isinstance(_Contiguous.of(tensor), _Contiguous)}
    assert wrapped == {name for name in views if "transposed" in name or "every other" in name} - {"int4 transposed"}
    for block in (1, 3 * 10 * 4, 7 * 12 * 8):
        monkeypatch.setattr(scratch, "_BLOCK", block)
        copies = {name: ir.Tensor(tensor.raw, dtype=tensor.dtype) for name, tensor in views.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _write_missing(list(copies.values()))
        for name, tensor in copies.items():
            written = _written[id(tensor)][0]
            assert Path(written.path).read_bytes()[written.offset:written.offset + written.length] == tensor.tobytes(), name


def test_a_transposed_weights_blocks_reach_torch_laid_out_as_rows(monkeypatch):
    """A transposed weight split into blocks reaches torch only as C-ordered column slabs (then
    transposed whole), never as a strided block of the view, which torch copies element by element
    (1.3-1.5 ms a MB against 0.44-0.57); one that fits a block goes whole, torch's blocked transpose."""
    from pathlib import Path

    import numpy as np
    import onnx_ir as ir

    from hfexport.backends.onnx import scratch

    given = []
    from_numpy = torch.from_numpy
    monkeypatch.setattr(torch, "from_numpy", lambda array: given.append(array.flags) or from_numpy(array))
    weight = np.arange(96 * 40, dtype=np.float32).reshape(96, 40)
    for block, slabs in ((96 * 4 * 7, True), (weight.nbytes, False)):
        monkeypatch.setattr(scratch, "_BLOCK", block)
        given.clear()
        tensor = ir.Tensor(weight.T)
        scratch._write_missing([tensor])
        written = scratch._written[id(tensor)][0]
        assert Path(written.path).read_bytes()[written.offset:written.offset + written.length] == tensor.tobytes()
        if slabs:  # 40 rows of 96 in blocks of 7: six slabs of the matrix's columns, each C-ordered
            assert len(given) == 6 and all(flags.c_contiguous for flags in given)
        else:  # the whole transposed view at once
            assert len(given) == 1 and given[0].f_contiguous and not given[0].c_contiguous


def test_a_program_changed_after_its_scratch_was_written_is_saved_as_it_is_now(tmp_path):
    """The scratch file is taken only while it holds the program's weights as they are. torch.onnx's
    program holds the model's own parameters: one changed in place after the export (under `no_grad`)
    is saved with its new values, as torch.onnx's own `save` writes it. A weight added after the
    scratch was written (as a quantizer's would be) makes `save` write them all as before. (Eager is
    no reference after the change: the graph's folded weights, a transposed copy, keep the old ones.)"""
    import numpy as np
    import onnx_ir as ir
    import onnxruntime as ort

    from hfexport import OnnxConfig, OnnxExporter
    from hfexport.backends.onnx.scratch import save_linked

    require_backend("onnx")
    model, inputs = build_preset("bert")
    program = OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True, external_data=True))

    def run(path):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return session.run(None, {i.name: inputs[i.name].numpy() for i in session.get_inputs()})[0]

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.5)
    for name in ("ours", "theirs", "added"):
        (tmp_path / name).mkdir()
    ours = program.save(tmp_path / "ours" / "model.onnx")
    theirs = tmp_path / "theirs" / "model.onnx"
    torch.onnx.ONNXProgram.save(program, theirs, external_data=True)
    assert ours[1].read_bytes() == theirs.with_name("model.onnx.data").read_bytes()
    torch.testing.assert_close(torch.from_numpy(run(ours[0])), torch.from_numpy(run(theirs)), atol=0, rtol=0)

    program.model.graph.register_initializer(ir.Value(name="extra", const_value=ir.tensor(np.ones(1024, np.float32))))
    assert save_linked(program.model, tmp_path / "probe.onnx") is None
    with written_bytes() as written:
        added = program.save(tmp_path / "added" / "model.onnx")
    assert written["bytes"] == added[1].stat().st_size > 0
    # the same program (the extra weight is unused): what torch.onnx's save gave
    torch.testing.assert_close(torch.from_numpy(run(added[0])), torch.from_numpy(run(theirs)), atol=0, rtol=0)


def test_the_cli_export_with_external_weights_writes_them_once(tmp_path, capsys):
    """`hfexport export tiny:llama -f onnx --external-weights` (the LLM package, validation and
    onnxruntime-genai's runner check on, as a user runs it) writes the weights once: the folder's
    `decode.onnx.data` is the load check's scratch file."""
    from hfexport.cli.main import main

    require_backend("onnx")
    out = tmp_path / "out"
    with written_bytes() as written:
        assert main(["export", "tiny:llama", "-f", "onnx", "--external-weights", "-o", str(out), "--quiet"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["components"]["decode"]["validation"]["cases"] and report["runner"]["passed"]
    assert written["bytes"] == (out / "decode.onnx.data").stat().st_size > 0
