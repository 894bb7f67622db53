"""The generation `decode` as one stateful OpenVINO model: the cache in variables that grow with the
tokens, a static-cache request mapped onto it, tokens unchanged."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

ov = pytest.importorskip("openvino")

from hfexport import GenerationRunner, OpenVINOConfig  # noqa: E402
from hfexport.errors import ExportError  # noqa: E402
from hfexport.job.export import GenerationOptions, JudgingOptions, export_to_folder  # noqa: E402
from hfexport.presets import build_preset  # noqa: E402
from tests.generation.exports import MAX_CACHE_LEN, SavedExport, _generation_config  # noqa: E402

pytestmark = pytest.mark.slow  # every test exports to OpenVINO and generates

NEW_TOKENS = 24
LEAVES = [f"cache.{layer}.{leaf}" for layer in (0, 1) for leaf in ("keys", "values")]


@pytest.fixture(scope="module")
def stateless_static(tmp_path_factory) -> SavedExport:
    """The static-cache Llama case exported with `stateful=False`."""
    model, inputs = build_preset("llama")
    directory = tmp_path_factory.mktemp("ov-stateless") / "export"
    export_to_folder((model, inputs), OpenVINOConfig(dynamic=True, stateful=False), directory,
                     generation=GenerationOptions(generate=True, static_cache=MAX_CACHE_LEN),
                     judging=JudgingOptions(validate=False))
    return SavedExport(directory, model, inputs, _generation_config(MAX_CACHE_LEN))


def _generate(saved: SavedExport, new_tokens: int = NEW_TOKENS) -> list[int]:
    runner = GenerationRunner.load(saved.directory)
    return runner.generate(saved.inputs["input_ids"], max_new_tokens=new_tokens, min_new_tokens=new_tokens).tokens


def test_a_static_cache_request_is_a_growing_state_bounded_at_its_length(saved_generation, stateless_static):
    stateful = saved_generation("openvino", "llama-static")
    manifest = json.loads((stateful.directory / "manifest.json").read_text())
    entry = manifest["components"]["decode"]
    assert list(manifest["components"]) == ["decode"] and entry["files"] == ["openvino_model.xml", "openvino_model.bin"]
    assert entry["state"]["layout"] == "growing" and entry["state"]["max_cache_len"] == MAX_CACHE_LEN
    assert entry["state"]["variables"] == LEAVES and entry["state"]["beam_idx"] == "beam_idx"
    # what a caller without hfexport passes to compile_model (also in the model's rt_info)
    assert entry["compile_properties"] == {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    model = ov.Core().read_model(stateful.directory / "openvino_model.xml")
    assert sorted(i.get_any_name() for i in model.inputs) == ["attention_mask", "beam_idx", "input_ids", "position_ids"]
    assert [o.get_any_name() for o in model.outputs] == ["logits"]
    ops = {op.get_type_name() for op in model.get_ops()}
    assert "ScatterUpdate" not in ops and "ScatterNDUpdate" not in ops and "ScaledDotProductAttention" in ops
    for read in (op for op in model.get_ops() if op.get_type_name() == "ReadValue"):  # ReadValue -> Gather -> Concat -> Assign
        gather = next(iter(read.output(0).get_target_inputs())).get_node()
        concat = next(t.get_node() for t in gather.output(0).get_target_inputs() if t.get_node().get_type_name() == "Concat")
        assert gather.get_type_name() == "Gather"
        assert "Assign" in {t.get_node().get_type_name() for t in concat.output(0).get_target_inputs()}
    stateless = json.loads((stateless_static.directory / "manifest.json").read_text())["components"]["decode"]
    assert "state" not in stateless

    tokens, _ = stateful.eager(NEW_TOKENS)
    assert _generate(stateful) == tokens
    assert _generate(stateless_static) == tokens
    with pytest.raises(ExportError, match="bounded at 32 tokens"):
        _generate(stateful, MAX_CACHE_LEN)


def test_a_reset_state_is_the_empty_cache_a_cpp_caller_starts_from(saved_generation):
    """No hfexport at run time: plain `compile_model`, `reset_state()`, only tokens, mask, positions fed."""
    saved = saved_generation("openvino", "llama-static")
    compiled = ov.Core().compile_model(str(saved.directory / "openvino_model.xml"), "CPU",
                                       {"INFERENCE_PRECISION_HINT": "f32"})
    assert compiled.get_property("KV_CACHE_PRECISION") == ov.Type.f32  # recorded in rt_info, honoured by the plugin
    request = compiled.create_infer_request()
    request.reset_state()
    ids = saved.inputs["input_ids"].numpy()
    past, tokens = 0, []
    for _ in range(NEW_TOKENS):
        q = ids.shape[1]
        request.infer({"input_ids": ids, "position_ids": np.arange(past, past + q)[None],
                       "attention_mask": np.ones((1, past + q), np.int64), "beam_idx": np.zeros(1, np.int32)})
        token = int(request.get_tensor("logits").data[0, -1].argmax())
        tokens.append(token)
        past += q
        ids = np.array([[token]])
    assert tokens == saved.eager(NEW_TOKENS)[0]
    assert {state.name: state.state.shape[2] for state in request.query_state()} == dict.fromkeys(LEAVES, past)


def test_dynamic_cache_decode_is_stateful_and_beam_idx_reorders_its_batch(saved_generation):
    saved = saved_generation("openvino", "llama")
    runner = GenerationRunner.load(saved.directory)
    decode = runner.runners["decode"]
    assert decode.is_stateful and decode.record.details["state"]["reordered"] == decode.variables
    assert runner.generate(saved.inputs["input_ids"], max_new_tokens=NEW_TOKENS,
                           min_new_tokens=NEW_TOKENS).tokens == saved.eager(NEW_TOKENS)[0]

    # a batch of two different caches; beam_idx [1, 0] swaps the rows before the step.
    # NOTE: on a model compiled afresh: the CPU plugin (openvino 2026.4.1) crashed now and then
    # (SIGSEGV, or "mem_desc->getOrder().size() == mem->getStaticDims().size()" in its fused
    # KV-cache SDPA) when a compiled model that had run batch 1 was given a batch-2 state from outside
    decode = GenerationRunner.load(saved.directory).runners["decode"]
    torch.manual_seed(0)
    cache = {name: torch.randn(2, *[int(d) for d in shape[1:-2]], 5, int(shape[-1]))
             for name, shape in zip(decode.record.input_names, decode.record.input_shapes) if name.startswith("cache.")}
    feed = {"input_ids": torch.tensor([[3], [7]]), "attention_mask": torch.ones(2, 6, dtype=torch.long),
            "position_ids": torch.tensor([[5], [5]])}
    request = decode.compiled.create_infer_request()
    for state in request.query_state():
        state.state = ov.Tensor(cache[state.name].numpy())
    request.infer({**{k: v.numpy() for k, v in feed.items()}, "beam_idx": np.array([1, 0], np.int32)})
    swapped = decode.run_named({**feed, **{name: value.flip(0) for name, value in cache.items()}})
    np.testing.assert_allclose(request.get_tensor("logits").data, swapped["logits"].numpy(), atol=1e-5, rtol=1e-5)
    state = {s.name: s.state.data for s in request.query_state()}
    for name in decode.variables:  # the state is the swapped cache with the new token appended
        np.testing.assert_allclose(state[name], swapped[name].numpy(), atol=1e-5, rtol=1e-5)


def test_gemma2_sliding_window_and_softcapping_on_the_growing_state_equal_generate(tmp_path):
    """Gemma-2 (window 4 < the 8-token prompt, attention and final logit softcapping) exported with a
    static-cache request: one growing-state model whose greedy tokens and logits equal eager's."""
    model, inputs = build_preset("gemma2")
    assert model.config.sliding_window < inputs["input_ids"].shape[1] and model.config.attn_logit_softcapping
    # validated, as the CLI exports it
    export_to_folder((model, inputs), OpenVINOConfig(dynamic=True), tmp_path / "export",
                     generation=GenerationOptions(generate=True, static_cache=MAX_CACHE_LEN))
    saved = SavedExport(tmp_path / "export", model, inputs, _generation_config(MAX_CACHE_LEN))
    runner = GenerationRunner.load(saved.directory)
    assert list(runner.runners) == ["decode"] and runner.runners["decode"].starts_empty
    result = runner.generate(inputs["input_ids"], max_new_tokens=16, min_new_tokens=16, output_logits=True)
    tokens, logits = saved.eager(16)
    assert result.tokens == tokens
    for step, (got, want) in enumerate(zip(result.logits, logits)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=lambda m, s=step: f"step {s}: {m}")


@pytest.mark.parametrize("static", [None, 32])
def test_the_seed_api_keeps_prefill_and_decode_an_export_folder_plans_one_model(static):
    """`OpenVINOExporter().export_for_generation` splits a decoder into the seed's `prefill` and
    `decode` (R6), as asked; the export job (`OpenVINORuntimePackage.plan`) and `genai_layout=True` plan the one
    stateful model LLMPipeline runs, a static cache becoming its bound."""
    from hfexport import OpenVINOExporter

    model, inputs = build_preset("llama")
    generation_config = _generation_config(static)
    seed = OpenVINOExporter().plan_generation(model, inputs, OpenVINOConfig(dynamic=True), generation_config)
    assert not seed.decode_prefills and not seed.config.genai_layout and seed.generation_config is generation_config
    for plan_generation, config in ((OpenVINOExporter().runtime_package().plan, OpenVINOConfig(dynamic=True)),
                                    (OpenVINOExporter().plan_generation, OpenVINOConfig(dynamic=True, genai_layout=True))):
        plan = plan_generation(model, inputs, config, generation_config)
        assert plan.decode_prefills and plan.multi_token_decode and plan.config.genai_layout
        assert plan.config.max_cache_len == static
