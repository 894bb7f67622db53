"""A second `save(path)` of what an exporter returns replaces the first, as the runtime's own
`save` does (`torch.onnx.ONNXProgram.save`, `ExecutorchProgramManager.save`), and touches nothing
but that model's own files: the seed's flows save one name again (a multimodal export saves each
component per test length to one name).

Program A (the tiny Llama preset) is saved with its weights in a side file (`model.onnx.data`,
`model.bin`, `model.ptd`), then program B (the same architecture, other random weights) to the same
path; the file is opened by the runtime's own loader in a fresh process and must give B's eager
logits. A file of the user's and another model's side file beside it are left as they were.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from hfexport.presets import build_preset
from tests.harness import require_backend

pytestmark = pytest.mark.slow

#: Max abs difference of the logits from eager (as in `test_native_save.py`: fp32 in every
#: runtime, OpenVINO told f32).
ATOL = 1e-4


@dataclass(frozen=True)
class Backend:
    """How one format is saved and opened: its file, its side file, the module whose writer a
    failed save replaces, and a loader defining `run(input_ids, attention_mask) -> logits` over
    `{path}` in a process without hfexport."""

    fmt: str
    file: str
    side: str
    writer: tuple[str, str]
    loader: str
    first_save: dict


BACKENDS = {
    "onnx": Backend("onnx", "model.onnx", "model.onnx.data", ("hfexport.backends.onnx.artifact", "write_onnx"),
                    """
        import onnxruntime

        session = onnxruntime.InferenceSession("{path}")

        def run(ids, mask):
            return session.run(["logits"], {{"input_ids": ids, "attention_mask": mask}})[0]
        """, {"external_data": True}),
    "openvino": Backend("openvino", "model.xml", "model.bin", ("hfexport.backends.openvino.artifact", "write_openvino"),
                        """
        import openvino

        core = openvino.Core()
        compiled = core.compile_model(core.read_model("{path}"), "CPU", {{"INFERENCE_PRECISION_HINT": "f32"}})

        def run(ids, mask):
            return compiled({{"input_ids": ids, "attention_mask": mask}})[compiled.output("logits")]
        """, {}),
    "executorch": Backend("executorch", "model.pte", "model.ptd",
                          ("hfexport.backends.executorch.artifact", "write_executorch"), """
        import os

        import torch
        from executorch.extension.pybindings.portable_lib import _load_for_executorch
        from executorch.runtime import Runtime

        if os.path.exists("{path}"[:-4] + ".ptd"):  # weights beside it: the loader that takes them
            module = _load_for_executorch("{path}", data_path="{path}"[:-4] + ".ptd")
            forward = module.forward
        else:  # the seed's loader
            forward = Runtime.get().load_program("{path}").load_method("forward").execute

        def run(ids, mask):
            return forward([torch.from_numpy(ids), torch.from_numpy(mask)])[0].numpy()
        """, {}),
}


def _export(fmt: str, seed: int):
    """The tiny Llama preset (weights from `seed`) exported to `fmt` with `dynamic=True`, its
    sample inputs and its eager logits there."""
    from hfexport import AutoExportConfig, AutoHfExporter

    model, inputs = build_preset("llama", seed=seed)
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True})
    artifact = AutoHfExporter.from_config(config).export(model, inputs, config=config)
    with torch.no_grad():
        logits = model(**inputs).logits.numpy()
    return artifact, inputs, logits


@pytest.fixture(scope="module", params=list(BACKENDS))
def programs(request, executorch_lowering):
    """`(backend, (A, eager logits), (B, eager logits), inputs)`: A keeps its weights in the side
    file (ExecuTorch's `.ptd` needs it asked at export: the lowering test_external_weights.py reads
    too, `executorch_lowering`), B is saved as the format's default."""
    backend = BACKENDS[request.param]
    require_backend(backend.fmt)
    if backend.fmt == "executorch":
        model, inputs, a = executorch_lowering("llama", external_weights=True)
        with torch.no_grad():
            a_logits = model(**inputs).logits.numpy()
    else:
        a, inputs, a_logits = _export(backend.fmt, seed=0)
    b, _, b_logits = _export(backend.fmt, seed=1)
    assert np.abs(a_logits - b_logits).max() > 100 * ATOL  # so loading A's file in B's place would fail
    return backend, (a, a_logits), (b, b_logits), inputs


def _run_fresh(path: Path, backend: Backend, inputs) -> np.ndarray:
    """The logits of the file at `path`, opened by `backend`'s runtime in a new Python process."""
    folder = path.parent.parent
    np.save(folder / "input_ids.npy", inputs["input_ids"].numpy())
    np.save(folder / "attention_mask.npy", inputs["attention_mask"].numpy())
    code = textwrap.dedent(backend.loader.format(path=path)) + textwrap.dedent(f"""
        import numpy as np
        out = run(np.load("{folder}/input_ids.npy"), np.load("{folder}/attention_mask.npy"))
        np.save("{folder}/logits.npy", np.asarray(out))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(folder / "logits.npy")


def _others(folder: Path, backend: Backend) -> dict[str, bytes]:
    """Write a file of the user's and another model's side file into `folder`; return their bytes."""
    other_side = "other" + backend.side.removeprefix("model")  # `other.onnx.data`: another model's
    others = {"notes.txt": b"the user's own file", other_side: b"another model's weights"}
    for name, data in others.items():
        (folder / name).write_bytes(data)
    return others


def test_a_second_save_to_one_path_replaces_the_first(programs, tmp_path):
    backend, (a, _), (b, b_logits), inputs = programs
    folder = tmp_path / "out"
    folder.mkdir()
    others = _others(folder, backend)
    path = folder / backend.file

    first = a.save(path, **backend.first_save)
    assert sorted(f.name for f in first) == sorted([backend.file, backend.side])
    second = b.save(str(path))

    assert [f.name for f in second] == [backend.file, *([backend.side] if backend.fmt == "openvino" else [])]
    # A's side file went with A (B keeps its weights inside), the rest stayed as it was
    assert sorted(p.name for p in folder.iterdir()) == sorted([*others, *(f.name for f in second)])
    assert {name: (folder / name).read_bytes() for name in others} == others
    got = _run_fresh(path, backend, inputs)
    assert got.shape == b_logits.shape
    assert np.abs(got - b_logits).max() < ATOL, np.abs(got - b_logits).max()


def test_a_failed_save_leaves_the_previous_file_and_no_temporary_one(programs, tmp_path, monkeypatch):
    backend, (a, a_logits), (b, _), inputs = programs
    folder = tmp_path / "out"
    folder.mkdir()
    path = folder / backend.file
    a.save(path, **backend.first_save)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def fail_halfway(artifact, target, *args, **kwargs):
        Path(target).with_name(backend.file).write_bytes(b"half a model")
        raise OSError("disk full")

    import importlib

    monkeypatch.setattr(importlib.import_module(backend.writer[0]), backend.writer[1], fail_halfway)
    with pytest.raises(OSError, match="disk full"):
        b.save(path)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # no `.model.*.partial-*` left
    monkeypatch.undo()
    got = _run_fresh(path, backend, inputs)
    assert np.abs(got - a_logits).max() < ATOL, np.abs(got - a_logits).max()


def test_overwrite_false_refuses_and_keeps_the_file(programs, tmp_path):
    from hfexport.errors import SerializationError

    backend, (a, _), (b, _), _ = programs
    path = tmp_path / backend.file
    a.save(path, **backend.first_save)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(SerializationError, match="(?s)already exists.*overwrite=True"):
        b.save(path, overwrite=False)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
