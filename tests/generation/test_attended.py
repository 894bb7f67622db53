"""A static cache's attention follows its mask's length (`generation/attended.py`, issue 17): a
step costs what the tokens cached cost, not what `max_cache_len` costs. The mask's last axis is
its own size (`attended`, from cached + query up to the cache's length); every width in that
range gives eager's logits, and the full-length mask of the seed's loops still works."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from hfexport import GenerationExport
from tests.harness import require_backend

from .conftest import MAX_CACHE_LEN

PROMPT = [5, 17, 42, 9, 77, 3]


def _mask(past: int, q: int, width: int, padding: torch.Tensor | None = None) -> torch.Tensor:
    """The boolean causal mask `[b, 1, q, width]` of `q` tokens after `past` (padding: `[b, >= past]`)."""
    positions = torch.arange(past, past + q)
    causal = (torch.arange(width)[None, :] <= positions[:, None])[None, None]
    if padding is None:
        return causal
    pad = torch.ones(padding.shape[0], width, dtype=torch.bool)
    pad[:, :min(width, padding.shape[1])] = padding[:, :width].bool()
    return causal & pad[:, None, None, :]


def test_attending_narrows_what_a_static_layer_returns_and_restores_it():
    from transformers.cache_utils import StaticLayer

    from hfexport.generation.attended import attending

    original = StaticLayer.update
    layer = StaticLayer(max_cache_len=16)
    keys = torch.randn(1, 2, 3, 8)
    with attending(5):
        got_keys, got_values = layer.update(keys, keys.clone())
    assert StaticLayer.update is original
    assert got_keys.shape == (1, 2, 5, 8) and torch.equal(got_keys[:, :, :3], keys)
    assert int(layer.cumulative_length) == 3 and layer.keys.shape == (1, 2, 16, 8)  # the write is unchanged
    with pytest.raises(RuntimeError, match="attends 17 slots of a cache of 16"), attending(17):
        layer.update(keys, keys)


def test_a_static_decode_attends_its_mask_and_keeps_the_documented_full_length_mask():
    """The component's kwargs keep the mask over the whole cache (what a static export takes);
    its front narrows attention to the mask's length, with eager's logits at every width."""
    from transformers import GenerationConfig

    from hfexport.generation.front import ComponentFront
    from hfexport.presets import build_preset
    from hfexport.utils import decompose_for_generation

    model, inputs = build_preset("llama")
    config = GenerationConfig(cache_implementation="static", max_cache_len=MAX_CACHE_LEN)
    decode, kwargs = decompose_for_generation(model, inputs, config, multi_token_decode=True)["decode"]
    assert isinstance(decode, ComponentFront) and decode.attended
    assert kwargs["attention_mask"].shape[-1] == MAX_CACHE_LEN
    past, q = inputs["input_ids"].shape[1], kwargs["input_ids"].shape[1]
    logits = []
    for width in (past + q, past + q + 5, MAX_CACHE_LEN):
        call = {**copy.deepcopy(kwargs), "attention_mask": kwargs["attention_mask"][..., :width]}
        with torch.no_grad():
            logits.append(decode(**call).logits)
    torch.testing.assert_close(logits[0], logits[2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[1], logits[2], atol=1e-5, rtol=1e-5)


def test_a_model_that_builds_its_mask_from_a_padding_row_keeps_the_cache_length():
    """BLOOM's mask is a 2-D row over the whole cache (its alibi): sized by the buffers, not narrowed."""
    from transformers import GenerationConfig

    from hfexport.generation.front import ComponentFront
    from hfexport.presets import build_preset
    from hfexport.utils import decompose_for_generation

    model, inputs = build_preset("bloom")
    config = GenerationConfig(cache_implementation="static", max_cache_len=MAX_CACHE_LEN)
    decode, _ = decompose_for_generation(model, inputs, config, multi_token_decode=True)["decode"]
    assert not (isinstance(decode, ComponentFront) and decode.attended)


def test_the_attended_axis_is_a_size_of_its_own(saved_generation):
    saved = saved_generation("dynamo", "llama-static")
    manifest = json.loads((saved.directory / "manifest.json").read_text())
    shapes = {i["name"]: i["shape"] for i in manifest["components"]["decode"]["inputs"]}
    lengths = {shape[2] for name, shape in shapes.items() if name.endswith((".keys", ".values"))}
    assert isinstance(shapes["attention_mask"][-1], str) and shapes["attention_mask"][-1] not in lengths


def test_the_runner_passes_a_mask_over_the_written_slots(saved_generation):
    """`GenerationRunner` feeds cached + query slots, not the whole cache (else every step would
    still cost what max_cache_len costs, with the same tokens)."""
    from hfexport import GenerationRunner
    from hfexport.generation.loop import DecodeState

    runner = GenerationRunner.load(saved_generation("dynamo", "llama-static").directory)
    record = runner.runners["decode"].record
    state = DecodeState(runner, torch.tensor([PROMPT]), None, {})
    state.step(torch.tensor([PROMPT]))
    shape = dict(zip(record.input_names, record.input_shapes))["attention_mask"]
    mask = state._value(record, "attention_mask", shape, "bool", torch.tensor([[7]]))
    assert mask.shape == (1, 1, 1, len(PROMPT) + 1) and bool(mask.all())


@pytest.mark.slow
def test_the_onnx_graph_names_the_attended_axis(saved_generation):
    require_backend("onnx")
    import onnxruntime as ort

    saved = saved_generation("onnx", "llama-static")
    session = ort.InferenceSession(str(saved.directory / "decode.onnx"), providers=["CPUExecutionProvider"])
    shapes = {i.name: i.shape for i in session.get_inputs()}
    assert shapes["attention_mask"][-1] == "attended" and shapes["input.cache.0.keys"][2] == "cache_length"


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["dynamo", "onnx", "executorch"])
def test_every_width_from_the_written_slots_to_the_whole_cache_gives_eager_logits(saved_generation, fmt):
    """A prompt, 3 tokens, 1 token, 2 tokens, each with another mask width: exactly the written
    slots, the whole cache, a few slots more than written; each step's logits equal eager's on a
    StaticCache given the whole-cache mask."""
    from transformers import StaticCache

    require_backend(fmt)
    saved = saved_generation(fmt, "llama-static")
    component = GenerationExport.load(saved.directory).components["decode"]
    runner = component.runner()
    cache = {name: torch.zeros([d if isinstance(d, int) else MAX_CACHE_LEN for d in shape], dtype=getattr(torch, dtype))
             for name, shape, dtype in zip(component.record.input_names, component.record.input_shapes,
                                           component.record.input_dtypes) if name.startswith("cache.")}
    eager_cache = StaticCache(config=saved.model.config, max_cache_len=MAX_CACHE_LEN)
    ids = torch.tensor([PROMPT + [11, 12, 13, 14, 15, 16]])
    past = 0
    for q, extra in ((len(PROMPT), 0), (3, None), (1, 3), (2, 0)):
        width = MAX_CACHE_LEN if extra is None else past + q + extra
        step = ids[:, past:past + q]
        positions = torch.arange(past, past + q)[None]
        out = runner.run_named({"input_ids": step, "attention_mask": _mask(past, q, width),
                                "position_ids": positions, **cache})
        with torch.no_grad():
            want = saved.model(input_ids=step, attention_mask=_mask(past, q, MAX_CACHE_LEN), position_ids=positions,
                               cache=eager_cache).logits
        torch.testing.assert_close(out["logits"], want, atol=1e-4, rtol=1e-4)
        cache = {k: out[k] for k in cache}
        past += q
    if fmt == "executorch":  # ExecuTorch's own LLM ops are not used, and the record says why
        record = json.loads((saved.directory / "report.json").read_text())["components"]["decode"]["record"]
        assert record["llm_custom_ops"]["used"] is False and "update_cache" in record["llm_custom_ops"]["reason"]


@pytest.mark.slow
def test_drawn_llamas_give_eager_logits_over_the_written_slots():
    """Drawn beyond the preset: key/value heads, head size, layers, prompt length, a left-padded
    batch. The Dynamo program, given masks over the written slots only, equals eager given the
    whole-cache mask, for the prompt and two decode steps."""
    pytest.importorskip("hypothesis")
    from hypothesis import HealthCheck, given, settings, strategies as st
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, StaticCache

    from hfexport import DynamoConfig, DynamoExporter

    @settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(kv_heads=st.sampled_from([1, 2, 4]), head_dim=st.sampled_from([8, 16, 32]), layers=st.integers(1, 2),
           prompt=st.integers(1, 9), batch=st.integers(1, 3), pad=st.integers(0, 3))
    def check(kv_heads, head_dim, layers, prompt, batch, pad):
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=head_dim,
                             max_position_embeddings=64, pad_token_id=0, eos_token_id=None, bos_token_id=1)
        model = LlamaForCausalLM(config).eval()
        ids = torch.randint(3, 64, (batch, prompt))
        padding = torch.ones(batch, prompt, dtype=torch.long)
        padding[batch - 1, :min(pad, prompt - 1)] = 0  # the last row left-padded, one token kept
        generation = GenerationConfig(cache_implementation="static", max_cache_len=MAX_CACHE_LEN)
        decode = DynamoExporter().export_for_generation(
            model, {"input_ids": ids, "attention_mask": padding}, config=DynamoConfig(dynamic=True),
            generation_config=generation, multi_token_decode=True)["decode"].module()
        program_cache = StaticCache(config=config, max_cache_len=MAX_CACHE_LEN)
        program_cache.early_initialization(batch, kv_heads, head_dim, torch.float32, torch.device("cpu"))
        eager_cache = StaticCache(config=config, max_cache_len=MAX_CACHE_LEN)
        past, step = 0, ids
        for _ in range(3):
            q = step.shape[1]
            full = torch.cat([padding, torch.ones(batch, past + q - padding.shape[1], dtype=torch.long)], dim=1) \
                if past + q > padding.shape[1] else padding
            positions = torch.arange(past, past + q)[None].expand(batch, -1)
            with torch.no_grad():
                got = decode(input_ids=step, attention_mask=_mask(past, q, past + q, full), position_ids=positions,
                             past_key_values=program_cache).logits
                want = model(input_ids=step, attention_mask=_mask(past, q, MAX_CACHE_LEN, full), position_ids=positions,
                             cache=eager_cache).logits
            rows = full[:, past:past + q].bool()  # padded query rows attend nothing: no logits to compare
            torch.testing.assert_close(got[rows], want[rows], atol=1e-4, rtol=1e-4)
            past += q
            step = want[:, -1:].argmax(-1)

    check()
