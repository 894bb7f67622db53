"""The static-cache multi-token decode graph (SPEC R7, R8) and the seed's three decode loops.

One `decode` graph takes the whole prompt on an empty cache, then any number of tokens; each
backend updates the cache its own way. The loops are the ones in `examples/` (CPU variants).
"""

from __future__ import annotations

import json

import pytest
import torch

from hfexport import GenerationExport
from tests.harness import require_backend

from .conftest import MAX_CACHE_LEN
from .exports import load_example

PROMPT = [5, 17, 42, 9, 77, 3]
NEW_TOKENS = 8


def _eager_tokens(model) -> list[int]:
    from transformers import GenerationConfig

    config = GenerationConfig(cache_implementation="static", max_cache_len=MAX_CACHE_LEN)
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False, generation_config=config)
    return out[0, len(PROMPT):].tolist()


def _causal_mask(past: int, q: int) -> torch.Tensor:
    positions = torch.arange(past, past + q)
    return (torch.arange(MAX_CACHE_LEN)[None, :] <= positions[:, None])[None, None]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["dynamo", "onnx"])
def test_one_decode_graph_takes_a_prompt_then_3_tokens_then_1(saved_generation, fmt):
    """Query lengths: whole prompt on an empty cache, a block of 3, a single token; logits match
    eager calls on a StaticCache at every step."""
    from transformers import StaticCache

    require_backend(fmt)
    saved = saved_generation(fmt, "llama-static")
    component = GenerationExport.load(saved.directory).components["decode"]
    runner = component.runner()
    names = component.record.input_names
    cache = {}
    for name, shape, dtype in zip(names, component.record.input_shapes, component.record.input_dtypes):
        if name.startswith("cache."):
            cache[name] = torch.zeros([d if isinstance(d, int) else MAX_CACHE_LEN for d in shape],
                                      dtype=getattr(torch, dtype))
    eager_cache = StaticCache(config=saved.model.config, max_cache_len=MAX_CACHE_LEN)
    ids = torch.tensor([PROMPT + [11, 12, 13, 14]])
    past = 0
    for q in (len(PROMPT), 3, 1):
        step = ids[:, past:past + q]
        feed = {"input_ids": step, "attention_mask": _causal_mask(past, q),
                "position_ids": torch.arange(past, past + q)[None], **cache}
        out = runner.run_named(feed)
        with torch.no_grad():
            want = saved.model(input_ids=step, attention_mask=feed["attention_mask"], position_ids=feed["position_ids"],
                               cache=eager_cache).logits
        assert out["logits"].shape == (1, q, saved.model.config.vocab_size)
        torch.testing.assert_close(out["logits"], want, atol=1e-4, rtol=1e-4)
        cache = {k: out[k] for k in cache}
        past += q
    assert int(cache["cache.0.cumulative_length"]) == past  # the counters travel with the cache


def test_a_static_export_freezes_the_query_length():
    from transformers import GenerationConfig

    from hfexport import DynamoConfig, DynamoExporter, record_of
    from hfexport.presets import build_preset

    model, inputs = build_preset("llama")
    config = GenerationConfig(cache_implementation="static", max_cache_len=MAX_CACHE_LEN)
    artifacts = DynamoExporter().export_for_generation(model, inputs, config=DynamoConfig(dynamic=False),
                                                       generation_config=config, multi_token_decode=True)
    record = record_of(artifacts["decode"])
    shapes = dict(zip(record.input_names, record.input_shapes))
    assert shapes["input_ids"] == (1, 2) and shapes["attention_mask"] == (1, 1, 2, MAX_CACHE_LEN)


@pytest.mark.slow
def test_dynamo_seed_loop_on_the_saved_program(saved_generation):
    """The seed's loop: torch.export.load, the program's own StaticCache template reset, in place."""
    saved = saved_generation("dynamo", "llama-static")
    program = torch.export.load(saved.directory / "decode.pt2")
    kinds = {spec.kind.name for spec in program.graph_signature.output_specs}
    assert "USER_INPUT_MUTATION" in kinds  # the cache write is part of the program's signature
    tokens = load_example("decode_loop_dynamo").generate(str(saved.directory / "decode.pt2"), PROMPT, NEW_TOKENS)
    assert tokens == _eager_tokens(saved.model)


@pytest.mark.slow
def test_onnx_cache_inputs_and_outputs_pair_up_and_the_seed_loop_runs(saved_generation):
    require_backend("onnx")
    import onnxruntime as ort

    saved = saved_generation("onnx", "llama-static")
    session = ort.InferenceSession(str(saved.directory / "decode.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    cache_inputs = [name for name in inputs if name.startswith("input.")]
    assert cache_inputs and [name for name in outputs if name.startswith("output.")] == [
        "output." + name[len("input."):] for name in cache_inputs]
    for name in cache_inputs:
        paired = outputs["output." + name[len("input."):]]
        assert paired.type == inputs[name].type and len(paired.shape) == len(inputs[name].shape)
    assert [name for name in inputs if not name.startswith("input.")] == ["input_ids", "attention_mask", "position_ids"]
    loop = load_example("decode_loop_onnxruntime")
    tokens = loop.generate_cpu(str(saved.directory / "decode.onnx"), PROMPT, NEW_TOKENS, MAX_CACHE_LEN)
    assert tokens == _eager_tokens(saved.model)


@pytest.mark.slow
def test_executorch_method_order_from_method_meta_and_the_python_loop(saved_generation):
    Runtime = pytest.importorskip("executorch.runtime").Runtime

    saved = saved_generation("executorch", "llama-static")
    path = saved.directory / "decode.pte"
    meta = Runtime.get().load_program(str(path)).load_method("forward").metadata
    num_cache = meta.num_inputs() - 3
    manifest = json.loads((saved.directory / "manifest.json").read_text())
    names = [i["name"] for i in manifest["components"]["decode"]["inputs"]]
    assert names[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert len(names) == meta.num_inputs() and all(name.startswith("cache.") for name in names[3:])
    assert meta.num_outputs() == 2 * num_cache + 1  # [cache x N, logits, cache x N]
    logits = meta.output_tensor_meta(num_cache)
    assert len(logits.sizes()) == 3 and logits.sizes()[-1] == saved.model.config.vocab_size
    for i in range(num_cache):
        cache_in = meta.input_tensor_meta(3 + i)
        for out in (meta.output_tensor_meta(i), meta.output_tensor_meta(num_cache + 1 + i)):
            assert tuple(out.sizes()) == tuple(cache_in.sizes()) and out.nbytes() == cache_in.nbytes()
    tokens = load_example("decode_loop_executorch").generate(str(path), PROMPT, NEW_TOKENS)
    assert tokens == _eager_tokens(saved.model)


@pytest.mark.slow
def test_executorch_unplanned_io_for_the_zero_copy_loop(tmp_path):
    """`alloc_graph_input/output=False, alloc_mutable_buffers=False` (the seed's flags): the
    method's inputs and outputs are the caller's memory, and Python still generates the same."""
    from transformers import GenerationConfig

    from hfexport import ExecutorchConfig, ExecutorchExporter
    from hfexport.presets import build_preset

    Runtime = pytest.importorskip("executorch.runtime").Runtime

    model, inputs = build_preset("llama")
    config = ExecutorchConfig(delegate="xnnpack", dynamic=True, alloc_graph_input=False, alloc_graph_output=False,
                              alloc_mutable_buffers=False)
    generation_config = GenerationConfig(cache_implementation="static", max_cache_len=MAX_CACHE_LEN)
    decode = ExecutorchExporter().export_for_generation(model, inputs, config=config,
                                                        generation_config=generation_config,
                                                        multi_token_decode=True)["decode"]
    meta = Runtime.get().load_program(decode.buffer).load_method("forward").metadata
    assert not any(meta.input_tensor_meta(i).is_memory_planned() for i in range(meta.num_inputs()))
    assert not any(meta.output_tensor_meta(i).is_memory_planned() for i in range(meta.num_outputs()))
    (tmp_path / "decode.pte").write_bytes(decode.buffer)
    tokens = load_example("decode_loop_executorch").generate(str(tmp_path / "decode.pte"), PROMPT, NEW_TOKENS)
    assert tokens == _eager_tokens(model)
