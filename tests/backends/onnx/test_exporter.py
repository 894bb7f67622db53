"""OnnxExporter: the panel in ONNX Runtime, names, the seed's snippets, saving."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
ort = pytest.importorskip("onnxruntime")

from hfexport import OnnxConfig, OnnxExporter, record_of, validate  # noqa: E402
from hfexport.errors import CaptureError, SerializationError  # noqa: E402
from hfexport.presets import build_preset  # noqa: E402
from tests.backends.panel import panel_params  # noqa: E402
from tests.harness import expected_cases, export_and_validate, without  # noqa: E402

pytestmark = pytest.mark.slow  # an optional backend; most exports take 3-20 s here, Swin's 90 s

ATOL = 1e-4


def _shared(dynamic_llama, name: str, dynamic: bool):
    """The dynamic tiny Llama is the export the module's other tests read (`dynamic_llama`): the panel
    validates that one rather than exporting the same preset with the same config again."""
    return dynamic_llama("onnx") if dynamic and name == "llama" else None


@pytest.mark.parametrize("name", panel_params("onnx"))
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_panel_matches_eager_in_onnxruntime(name, dynamic, dynamic_llama):
    program, report, _, inputs = export_and_validate(OnnxExporter(), OnnxConfig(dynamic=dynamic), name, steps=(2, 5),
                                                     exported=_shared(dynamic_llama, name, dynamic))
    assert isinstance(program, torch.onnx.ONNXProgram)
    assert report.runtime.startswith("ONNX Runtime")
    assert [c.label for c in report.cases] == expected_cases(inputs, dynamic, steps=(2, 5))


@pytest.fixture(scope="module")
def llama_onnx(dynamic_llama, tmp_path_factory):
    model, inputs, program = dynamic_llama("onnx")
    path = tmp_path_factory.mktemp("onnx") / "model.onnx"
    program.save(path)
    return model, inputs, program, path


def test_seed_snippet_plain_inference_session(llama_onnx):
    model, inputs, _, path = llama_onnx
    session = ort.InferenceSession(str(path))
    ort_inputs = {k: v.numpy() for k, v in inputs.items()}
    outputs = session.run(None, ort_inputs)
    with torch.no_grad():
        expected = model(**inputs).logits.numpy()
    assert np.abs(outputs[0] - expected).max() < ATOL


def test_names_follow_kwargs_fields_and_roles(llama_onnx):
    _, _, _, path = llama_onnx
    session = ort.InferenceSession(str(path))
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = {o.name: o.shape for o in session.get_outputs()}
    assert list(inputs) == ["input_ids", "attention_mask"]
    assert inputs["input_ids"] == ["batch", "sequence"]
    assert list(outputs)[0] == "logits" and outputs["logits"] == ["batch", "sequence", 128]
    assert "output.cache.0.keys" in outputs and outputs["output.cache.1.values"][0] == "batch"
    assert not any(isinstance(d, str) and d.startswith("s") and d[1:].isdigit() for d in outputs["logits"])


def test_cache_inputs_and_outputs_pair_up_by_name():
    from transformers import DynamicCache

    model, inputs = build_preset("llama")
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(**inputs, past_key_values=cache)  # fill it with the prompt
    step = {"input_ids": inputs["input_ids"][:, :1], "attention_mask": torch.ones(1, 9, dtype=torch.long),
            "past_key_values": cache}
    program = OnnxExporter().export(model, step, config=OnnxConfig(dynamic=True))
    names_in = [v.name for v in program.model.graph.inputs]
    names_out = [v.name for v in program.model.graph.outputs]
    cache_in = sorted(n.removeprefix("input.") for n in names_in if n.startswith("input."))
    cache_out = sorted(n.removeprefix("output.") for n in names_out if n.startswith("output."))
    assert cache_in == cache_out and len(cache_in) == 2 * model.config.num_hidden_layers
    assert validate(program, model, step, resized=False).passed


def test_save_refuses_missing_parent_and_with_overwrite_false_an_existing_file(llama_onnx, tmp_path):
    _, _, program, _ = llama_onnx
    with pytest.raises(SerializationError, match="does not exist"):
        program.save(tmp_path / "missing" / "model.onnx")
    assert not (tmp_path / "missing").exists()
    target = tmp_path / "model.onnx"
    target.write_bytes(b"keep me")
    with pytest.raises(SerializationError, match="(?s)already exists.*overwrite=True"):
        program.save(target, overwrite=False)
    assert target.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]  # no partial files left
    program.save(target)  # replaces it by default, as ONNXProgram.save does
    assert ort.InferenceSession(str(target)).get_inputs()[0].name == "input_ids"


def test_external_data_writes_weights_beside_the_model(llama_onnx, tmp_path):
    model, inputs, program, _ = llama_onnx
    files = program.save(tmp_path / "model.onnx", external_data=True)
    assert sorted(f.name for f in files) == ["model.onnx", "model.onnx.data"]
    outputs = ort.InferenceSession(str(tmp_path / "model.onnx")).run(None, {k: v.numpy() for k, v in inputs.items()})
    with torch.no_grad():
        assert np.abs(outputs[0] - model(**inputs).logits.numpy()).max() < ATOL


def test_record_lists_readable_dims(llama_onnx):
    _, _, program, _ = llama_onnx
    details = record_of(program).details
    assert details["onnx_inputs"]["input_ids"] == ["batch", "sequence"]


def test_grouped_mm_translation_is_needed_and_works():
    """Minimal reproduction: a module calling transformers' grouped matmul dispatcher."""
    from transformers.integrations import moe

    from hfexport.errors import ConversionError
    from hfexport.workarounds import PATCHES

    class Grouped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(3, 8, 8))  # 16-byte strides for eager grouped_mm

        def forward(self, x, offs):
            return moe._grouped_mm(x, self.weight, offs)

    x = torch.randn(6, 8)
    offs = torch.tensor([2, 2, 6], dtype=torch.int32)  # expert 1 gets no rows
    inputs = {"x": x, "offs": offs}
    module = Grouped()
    program = OnnxExporter().export(module, inputs, config=OnnxConfig())
    report = validate(program, module, inputs)  # eager runs transformers' own fallback kernel
    assert report.passed, report.to_table()
    with without(PATCHES, "patch_transformers_moe_grouped_mm"), pytest.raises(ConversionError, match="grouped_mm_fallback"):
        OnnxExporter().export(module, inputs, config=OnnxConfig())


def test_swin_pads_sides_that_are_not_a_multiple_of_the_patch():
    """A 32 x 32 sample used to trace Swin without its patch padding: ONNX Runtime then floored a
    34 x 34 image to the sample's 8 x 8 patch grid and gave wrong logits (eager pads to 9 x 9), and
    refused a 30 x 30 one. Every image with the sample's patch grid now matches eager; another grid
    fails loudly instead of running with wrong numbers."""
    model, inputs = build_preset("swin")
    with pytest.raises(CaptureError, match=r"pixel_values, axis 0 \(batch; traced at 1; allowed [01]..2\)"):
        OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True))  # see KNOWN_FAILURES["swin"]
    program = OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True, allow_size_one_specialization=True))
    assert [e["input"] for e in record_of(program).details["specialized_size_one"]] == ["pixel_values"]
    session = ort.InferenceSession(program.model_proto.SerializeToString())
    name = session.get_inputs()[0].name
    generator = torch.Generator().manual_seed(0)
    for height, width in ((30, 30), (29, 32), (32, 31)):
        pixels = torch.randn(1, 3, height, width, generator=generator)
        got = session.run(None, {name: pixels.numpy()})[0]
        with torch.no_grad():
            want = model(pixel_values=pixels).logits.numpy()
        np.testing.assert_allclose(got, want, atol=ATOL, err_msg=f"{height} x {width}")
    with pytest.raises(Exception, match="Reshape"):
        session.run(None, {name: torch.randn(1, 3, 34, 34).numpy()})
    assert "patch_swin_patch_embedding_pad" in record_of(program).details["patches"]  # applied, not just registered


@pytest.mark.parametrize("name", ["bloom", "llama"])
def test_a_one_token_prompt_is_traced_at_two_tokens(name):
    """Traced at one token, BLOOM's padding-mask indexing (`mask[batch_idx, kv_idx]`, every index
    of size 1) lost its broadcast in the ONNX graph: ONNX Runtime refused 3 tokens ("Non concat axis
    dimensions must match") while the Dynamo program took them (the long fuzz run, seed 206)."""
    model, inputs = build_preset(name)
    one = {k: v[:1, :1] for k, v in inputs.items()}
    program = OnnxExporter().export(model, one, config=OnnxConfig(dynamic=True))
    report = validate(program, model, one)
    assert report.passed and [c.label for c in report.cases] == ["sample", "resized"], report.to_table()
    three = {k: v[:, :3].repeat(3 // v.shape[0] + 1, 1)[:3] for k, v in inputs.items()}
    assert validate(program, model, three, resized=False).passed
