"""What each exporter returns, saved with its own save call and opened by its runtime's own loader in
a fresh process, at a size over every threshold hfexport has (`hfexport.config.EXTERNAL_WEIGHTS_BYTES`,
64 MiB: ONNX's `.onnx.data` and, in an export folder, ExecuTorch's `.ptd`).

The model is a one-layer Llama whose weights are almost all its untied 40000-token embedding and
head (83 MB), built once; each backend exports it with the seed API (`dynamic=True`), saves it,
and one subprocess per backend loads the files and runs the sample and another shape. ExecuTorch's
program saved itself without its weights before (a 40 KB `.pte`: "external_data_map is null",
error 0x2, issue 28).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from hfexport.config import EXTERNAL_WEIGHTS_BYTES
from hfexport.presets import build_preset
from tests.harness import require_backend

pytestmark = pytest.mark.slow

#: Max abs difference of the logits from eager, fp32 in every runtime (OpenVINO told f32, as the
#: README says a process without hfexport must: its CPU plugin computes in bf16 otherwise).
ATOL = 1e-4

#: The sample's shape and another one, (batch, tokens).
SHAPES = [(1, 8), (2, 5)]


@pytest.fixture(scope="module")
def large_llama(tmp_path_factory):
    """The model, its inputs, eager logits at each shape, and the folder holding those inputs (`.npy`)."""
    model, inputs = build_preset("llama", vocab_size=40000, hidden_size=256, intermediate_size=32,
                                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                 tie_word_embeddings=False)
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    assert weights > EXTERNAL_WEIGHTS_BYTES
    folder = tmp_path_factory.mktemp("native-save")
    expected = []
    for index, (batch, length) in enumerate(SHAPES):
        ids = inputs["input_ids"] if index == 0 else torch.randint(3, 40000, (batch, length),
                                                                   generator=torch.Generator().manual_seed(index))
        mask = torch.ones_like(ids)
        np.save(folder / f"input_ids_{index}.npy", ids.numpy())
        np.save(folder / f"attention_mask_{index}.npy", mask.numpy())
        with torch.no_grad():
            expected.append(model(input_ids=ids, attention_mask=mask).logits.numpy())
    return model, inputs, expected, folder


def _run_fresh(folder, loader: str) -> list[np.ndarray]:
    """Run `loader` in a new Python process: it defines `run(input_ids, attention_mask) -> logits`
    (numpy in, numpy out) after opening the saved files in `folder`; its logits at each shape."""
    code = textwrap.dedent(loader) + textwrap.dedent(f"""
        import numpy as np
        for index in range({len(SHAPES)}):
            ids = np.load(f"{folder}/input_ids_{{index}}.npy")
            mask = np.load(f"{folder}/attention_mask_{{index}}.npy")
            np.save(f"{folder}/logits_{{index}}.npy", np.asarray(run(ids, mask)))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [np.load(folder / f"logits_{index}.npy") for index in range(len(SHAPES))]


def _assert_like_eager(got: list[np.ndarray], expected: list[np.ndarray]) -> None:
    for shape, out, ref in zip(SHAPES, got, expected):
        assert out.shape == ref.shape, (shape, out.shape)
        assert np.abs(out - ref).max() < ATOL, (shape, np.abs(out - ref).max())


def test_exported_program_saves_and_loads_with_torch_export(large_llama):
    from hfexport import DynamoConfig, DynamoExporter

    model, inputs, expected, folder = large_llama
    program = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    torch.export.save(program, folder / "model.pt2")
    got = _run_fresh(folder, f"""
        import torch
        from transformers import DynamicCache
        from hfexport.exporter_dynamo import register_pytree_node

        register_pytree_node(DynamicCache)  # its output holds the cache (README, "Caches as inputs and outputs")
        module = torch.export.load("{folder}/model.pt2").module()

        def run(ids, mask):
            return module(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.detach().numpy()
        """)
    _assert_like_eager(got, expected)


def test_onnx_program_saves_its_data_file_and_loads_in_onnx_runtime(large_llama):
    require_backend("onnx")
    from hfexport import OnnxConfig, OnnxExporter

    model, inputs, expected, folder = large_llama
    (folder / "onnx").mkdir()
    program = OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True))
    program.save(str(folder / "onnx" / "model.onnx"))
    assert sorted(p.name for p in (folder / "onnx").iterdir()) == ["model.onnx", "model.onnx.data"]
    got = _run_fresh(folder, f"""
        import onnxruntime

        session = onnxruntime.InferenceSession("{folder}/onnx/model.onnx")

        def run(ids, mask):
            return session.run(["logits"], {{"input_ids": ids, "attention_mask": mask}})[0]
        """)
    _assert_like_eager(got, expected)


def test_openvino_model_saves_its_bin_and_loads_in_openvino(large_llama):
    require_backend("openvino")
    from hfexport import OpenVINOConfig, OpenVINOExporter

    model, inputs, expected, folder = large_llama
    (folder / "openvino").mkdir()
    ov_model = OpenVINOExporter().export(model, inputs, config=OpenVINOConfig(dynamic=True))
    ov_model.save(str(folder / "openvino" / "model.xml"))
    assert sorted(p.name for p in (folder / "openvino").iterdir()) == ["model.bin", "model.xml"]
    got = _run_fresh(folder, f"""
        import openvino

        core = openvino.Core()
        compiled = core.compile_model(core.read_model("{folder}/openvino/model.xml"), "CPU",
                                      {{"INFERENCE_PRECISION_HINT": "f32"}})

        def run(ids, mask):
            return compiled({{"input_ids": ids, "attention_mask": mask}})[compiled.output("logits")]
        """)
    _assert_like_eager(got, expected)


def test_executorch_program_keeps_its_weights_and_loads_in_executorch_runtime(large_llama):
    """The seed's own lines: `et_program.save("model.pte")`, then `Runtime.get().load_program`."""
    require_backend("executorch")
    from hfexport import ExecutorchConfig, ExecutorchExporter

    model, inputs, expected, folder = large_llama
    (folder / "executorch").mkdir()
    et_program = ExecutorchExporter().export(model, inputs, config=ExecutorchConfig(dynamic=True))
    et_program.save(str(folder / "executorch" / "model.pte"))
    assert [p.name for p in (folder / "executorch").iterdir()] == ["model.pte"]
    assert (folder / "executorch" / "model.pte").stat().st_size > EXTERNAL_WEIGHTS_BYTES  # the weights are in it
    got = _run_fresh(folder, f"""
        import torch
        from executorch.runtime import Runtime

        method = Runtime.get().load_program("{folder}/executorch/model.pte").load_method("forward")

        def run(ids, mask):
            return method.execute([torch.from_numpy(ids), torch.from_numpy(mask)])[0].numpy()
        """)
    _assert_like_eager(got, expected)
