"""The generation `decode` as a stateful OpenVINO model: the cache in variables, tokens unchanged."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

ov = pytest.importorskip("openvino")

from hfexport import GenerationRunner, OpenVINOConfig  # noqa: E402
from hfexport.job import export_to_folder  # noqa: E402
from hfexport.presets import build_preset  # noqa: E402
from tests.generation.exports import MAX_CACHE_LEN, SavedExport, _generation_config  # noqa: E402

pytestmark = pytest.mark.slow  # every test exports to OpenVINO and generates

NEW_TOKENS = 24
STATIC_LEAVES = [f"cache.{layer}.{leaf}" for layer in (0, 1) for leaf in ("cumulative_length", "keys", "values")]


@pytest.fixture(scope="module")
def stateless_static(tmp_path_factory) -> SavedExport:
    """The static-cache Llama case exported with `stateful=False`."""
    model, inputs = build_preset("llama")
    directory = tmp_path_factory.mktemp("ov-stateless") / "export"
    export_to_folder((model, inputs), OpenVINOConfig(dynamic=True, stateful=False), directory, generate=True,
                     static_cache=MAX_CACHE_LEN, validate=False)
    return SavedExport(directory, model, inputs, _generation_config(MAX_CACHE_LEN))


def _generate(saved: SavedExport) -> list[int]:
    runner = GenerationRunner.load(saved.directory)
    return runner.generate(saved.inputs["input_ids"], max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS).tokens


def test_static_decode_is_stateful_and_its_tokens_equal_stateless_and_generate(saved_generation, stateless_static):
    stateful = saved_generation("openvino", "llama-static")
    entry = json.loads((stateful.directory / "manifest.json").read_text())["components"]["decode"]
    assert entry["state"]["stateful"] and entry["state"]["variables"] == STATIC_LEAVES
    assert entry["state"]["beam_idx"] == "beam_idx"
    assert entry["state"]["variable_types"] == {"cache.0.cumulative_length": "i32", "cache.1.cumulative_length": "i32"}
    # what a caller without hfexport passes to compile_model (also in the model's rt_info)
    assert entry["compile_properties"] == {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    model = ov.Core().read_model(stateful.directory / "decode.xml")
    assert sorted(i.get_any_name() for i in model.inputs) == ["attention_mask", "beam_idx", "input_ids", "position_ids"]
    assert [o.get_any_name() for o in model.outputs] == ["logits"]
    stateless = json.loads((stateless_static.directory / "manifest.json").read_text())["components"]["decode"]
    assert "state" not in stateless

    tokens, _ = stateful.eager(NEW_TOKENS)
    assert _generate(stateful) == tokens
    assert _generate(stateless_static) == tokens


def test_a_reset_state_is_the_empty_static_cache_a_cpp_caller_starts_from(saved_generation):
    """No hfexport at run time: plain `compile_model`, `reset_state()`, only tokens, positions and mask fed."""
    saved = saved_generation("openvino", "llama-static")
    compiled = ov.Core().compile_model(str(saved.directory / "decode.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    assert compiled.get_property("KV_CACHE_PRECISION") == ov.Type.f32  # recorded in rt_info, honoured by the plugin
    request = compiled.create_infer_request()
    request.reset_state()
    ids = saved.inputs["input_ids"].numpy()
    past, tokens = 0, []
    for _ in range(NEW_TOKENS):
        q = ids.shape[1]
        positions = np.arange(past, past + q)
        mask = (np.arange(MAX_CACHE_LEN)[None, :] <= positions[:, None])[None, None]
        request.infer({"input_ids": ids, "position_ids": positions[None], "attention_mask": mask,
                       "beam_idx": np.zeros(1, np.int32)})
        token = int(request.get_tensor("logits").data[0, -1].argmax())
        tokens.append(token)
        past += q
        ids = np.array([[token]])
    assert tokens == saved.eager(NEW_TOKENS)[0]


def test_dynamic_cache_decode_is_stateful_and_beam_idx_reorders_its_batch(saved_generation):
    saved = saved_generation("openvino", "llama")
    runner = GenerationRunner.load(saved.directory)
    decode = runner.runners["decode"]
    assert decode.is_stateful and decode.record.details["state"]["reordered"] == decode.variables
    assert runner.generate(saved.inputs["input_ids"], max_new_tokens=NEW_TOKENS,
                           min_new_tokens=NEW_TOKENS).tokens == saved.eager(NEW_TOKENS)[0]

    # a batch of two different caches; beam_idx [1, 0] swaps the rows before the step
    torch.manual_seed(0)
    cache = {name: torch.randn(2, *[int(d) for d in shape[1:-2]], 5, int(shape[-1]))
             for name, shape in zip(decode.record.input_names, decode.record.input_shapes) if name.startswith("cache.")}
    feed = {"input_ids": torch.tensor([[3], [7]]), "position_ids": torch.tensor([[5], [5]])}
    request = decode.compiled.create_infer_request()
    for state in request.query_state():
        state.state = ov.Tensor(cache[state.name].numpy())
    request.infer({**{k: v.numpy() for k, v in feed.items()}, "beam_idx": np.array([1, 0], np.int32)})
    swapped = decode.run_named({**feed, **{name: value.flip(0) for name, value in cache.items()}})
    np.testing.assert_allclose(request.get_tensor("logits").data, swapped["logits"].numpy(), atol=1e-5, rtol=1e-5)
    state = {s.name: s.state.data for s in request.query_state()}
    for name in decode.variables:  # the state is the swapped cache with the new token appended
        np.testing.assert_allclose(state[name], swapped[name].numpy(), atol=1e-5, rtol=1e-5)
