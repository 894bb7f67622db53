"""ExecutorchExporter: the panel in the ExecuTorch runtime, the seed's snippets, targets, planning.

ExecuTorch lowering takes ~10-20 s per tiny model, so each architecture is exported once
(dynamic) and checked at the captured size and a resized one; shared exports are module fixtures.
"""

from __future__ import annotations

import pytest
import torch

Runtime = pytest.importorskip("executorch.runtime").Runtime

from hfexport import (AutoExportConfig, AutoHfExporter, ExecutorchConfig, ExecutorchExporter, record_of,  # noqa: E402
                      validate)
from hfexport.errors import ConversionError, PrepareError  # noqa: E402
from hfexport.workarounds import FX_NODE_FIXES  # noqa: E402
from hfexport.presets import build_preset  # noqa: E402
from tests.backends.panel import panel_params  # noqa: E402
from tests.harness import seed_dynamic_shapes, without  # noqa: E402

ATOL = 1e-4


@pytest.fixture(scope="module")
def dynamic_export(executorch_lowering):
    """`dynamic_export(name)`: `(model, inputs, program)`, preset `name` lowered to XNNPACK with
    `dynamic=True` (the seed's `ExecutorchConfig(delegate="xnnpack", dynamic=True)`), made once per
    session whichever test asks first (`executorch_lowering`): the panel validates each, the seed's
    snippets save and run the Qwen3 one (one lowering, ~20 s, where there were two), and
    test_external_weights.py reads the Llama one. No test changes the program."""
    return executorch_lowering


@pytest.mark.slow
@pytest.mark.parametrize("name", panel_params("executorch"))
def test_panel_matches_eager_in_executorch_runtime(name, dynamic_export):
    model, inputs, program = dynamic_export(name)
    report = validate(program, model, inputs)
    assert report.passed, report.to_table()
    assert report.runtime.startswith("ExecuTorch")
    delegation = record_of(program).details["delegation"]
    assert delegation["delegate"] == "xnnpack" and delegation["delegated_nodes"] > 0


@pytest.fixture(scope="module")
def qwen3_pte(dynamic_export, tmp_path_factory):
    model, inputs, et_program = dynamic_export("qwen3")
    path = tmp_path_factory.mktemp("pte") / "model.pte"
    et_program.save(str(path))
    return model, inputs, et_program, path


@pytest.mark.slow
def test_seed_snippet_save_load_execute(qwen3_pte):
    model, inputs, _, path = qwen3_pte
    program = Runtime.get().load_program(str(path))
    method = program.load_method("forward")
    outputs = method.execute(list(inputs.values()))
    with torch.no_grad():
        expected = model(**inputs).logits
    assert (outputs[0] - expected).abs().max() < ATOL


@pytest.mark.slow
def test_dynamic_program_takes_other_sizes(qwen3_pte):
    model, _, _, path = qwen3_pte
    method = Runtime.get().load_program(str(path)).load_method("forward")
    for batch, length in [(3, 5), (1, 17)]:
        ids = torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(length))
        mask = torch.ones_like(ids)
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=mask).logits
        assert (method.execute([ids, mask])[0] - expected).abs().max() < ATOL


@pytest.mark.slow
def test_dynamic_bounds_come_from_the_config(qwen3_pte):
    model, _, et_program, _ = qwen3_pte
    bounds = record_of(et_program).details["dim_bounds"]
    assert bounds["input_ids[0] (batch)"] == "<= 8: ExecutorchConfig.max_batch_size"
    assert any("max_batch_size" in why and "<= 8" in why for why in bounds.values())
    assert any("max_position_embeddings" in why and f"<= {model.config.max_position_embeddings}" in why
               for why in bounds.values())


@pytest.mark.slow
def test_explicit_dims_win_over_derived_bounds():
    # one layer: the bounds are the inputs', which layers do not change (the panel lowers the preset's two)
    model, _ = build_preset("llama", num_hidden_layers=1)
    ids = torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    config = ExecutorchConfig(dynamic_shapes=seed_dynamic_shapes(batch_max=4, seq_max=64),
                              prefer_deferred_runtime_asserts_over_guards=True)
    et_program = ExecutorchExporter().export(model, inputs, config=config)
    # memory planning uses the upper bounds; the user's Dims set them, not max_batch_size (8)
    uppers = sorted(int(v.upper) for v in et_program.exported_program().range_constraints.values())
    assert uppers == [4, 64]
    assert validate(et_program, model, inputs).passed
    method = Runtime.get().load_program(et_program.buffer).load_method("forward")
    for batch, length in [(1, 5), (3, 11)]:  # within the Dims, batch 1 included
        ids = torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(batch))
        mask = torch.ones_like(ids)
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=mask).logits
        assert (method.execute([ids, mask])[0] - expected).abs().max() < ATOL


@pytest.mark.slow
def test_seed_auto_classes_with_executorch_format():
    model, inputs = build_preset("gpt2")
    config = AutoExportConfig.from_dict({"export_format": "executorch", "backend": "xnnpack", "dynamic": False})
    exporter = AutoHfExporter.from_config(config)
    assert isinstance(exporter, ExecutorchExporter)
    assert validate(exporter.export(model, inputs, config=config), model, inputs).passed


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where CUDA is absent")
def test_cuda_delegate_without_cuda_raises_before_any_work(monkeypatch):
    traced = []
    monkeypatch.setattr("hfexport.exporter.capture", lambda *a, **k: traced.append(1))
    model, inputs = build_preset("bert")
    with pytest.raises(RuntimeError, match="delegate='cuda'.*torch.cuda.is_available"):
        ExecutorchExporter().export(model, inputs, config=ExecutorchConfig(delegate="cuda"))
    assert traced == []


def test_mlx_delegate_off_apple_silicon_raises(monkeypatch):
    import sys

    if sys.platform == "darwin":
        pytest.skip("this machine may run MLX; the error path is for other platforms")
    model, inputs = build_preset("bert")
    with pytest.raises(RuntimeError, match="macOS 14\\+ on Apple Silicon"):
        ExecutorchExporter().export(model, inputs, config=ExecutorchConfig(delegate="mlx"))


def test_mlx_refuses_a_static_cache(monkeypatch):
    from transformers import StaticCache

    monkeypatch.setattr("hfexport.backends.executorch.exporter.check_delegate", lambda delegate, name: None)
    model, inputs = build_preset("llama")
    cache = StaticCache(config=model.config, max_cache_len=16)
    with pytest.raises(PrepareError, match="DynamicCache"):
        ExecutorchExporter().export(model, dict(inputs, past_key_values=cache), config=ExecutorchConfig(delegate="mlx"))


@pytest.mark.slow
def test_memory_planning_flags_change_the_planned_program():
    model, inputs = build_preset("bert")

    def planned(**flags):
        program = ExecutorchExporter().export(model, inputs, config=ExecutorchConfig(**flags))
        meta = Runtime.get().load_program(program.buffer).metadata("forward")
        inputs_planned = [meta.input_tensor_meta(i).is_memory_planned() for i in range(meta.num_inputs())]
        outputs_planned = [meta.output_tensor_meta(i).is_memory_planned() for i in range(meta.num_outputs())]
        return inputs_planned, outputs_planned, program, meta

    default_in, default_out, default, _ = planned()
    caller_in, caller_out, program, _ = planned(alloc_graph_input=False, alloc_graph_output=False,
                                                alloc_mutable_buffers=False)
    assert all(default_in) and all(default_out)
    assert not any(caller_in) and not any(caller_out)
    # the record says what the runtime allocates for the plan when it loads the method: the arenas
    # the serialized plan declares (index 0 is reserved, 0 bytes)
    arenas = sum(default.executorch_program.execution_plan[0].non_const_buffer_sizes)
    assert arenas > 0
    assert record_of(default).details["planned_memory"] == f"{arenas / 2**20:,.1f} MiB"


@pytest.mark.slow
def test_save_refuses_to_overwrite_when_told(qwen3_pte, tmp_path):
    from hfexport.errors import SerializationError

    _, _, et_program, _ = qwen3_pte
    target = tmp_path / "model.pte"
    target.write_bytes(b"old")
    with pytest.raises(SerializationError, match="already exists"):
        et_program.save(target, overwrite=False)
    with pytest.raises(ValueError, match="saved as a .pte file"):
        et_program.save(tmp_path / "model.bin")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["model.pte"]
    assert et_program.save(target) == [target] and target.read_bytes() == et_program.buffer  # the default replaces


class _Halves(torch.nn.Module):
    """chunk(2) on the feature axis of a (batch, features) input: a Tensor[] op whose pieces keep the
    batch. The input is named as an audio model's, so its first axis is the batch (bound: max_batch_size)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, input_values):
        left, right = self.proj(input_values).chunk(2, dim=-1)
        return left * torch.sigmoid(right)


@pytest.mark.slow
def test_split_pieces_keep_a_dynamic_batch():
    """ExecuTorch's edge verifier calls len() on the first piece of a Tensor[] op, which fixed the
    batch at the traced size (2): batch 1 then failed at run time with error 0x12 (Mamba, Phi-3,
    GPT-NeoX, ModernBERT in the coverage matrix). The fix takes each piece with a slice."""
    module = _Halves().eval()
    x = torch.randn(1, 8, generator=torch.Generator().manual_seed(0))
    et_program = ExecutorchExporter().export(module, {"input_values": x}, config=ExecutorchConfig(dynamic=True))
    assert "fix_split_outputs_as_slices" in record_of(et_program).details["fx_fixes"]
    method = Runtime.get().load_program(et_program.buffer).load_method("forward")
    for batch in (1, 3, 8):
        x = torch.randn(batch, 8, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            assert (method.execute([x])[0] - module(x)).abs().max() < ATOL
    with without(FX_NODE_FIXES, "fix_split_outputs_as_slices"), \
            pytest.raises(ConversionError, match=r"fixed 1 dimension.*input_values, axis 0 \(now 2\)"):
        ExecutorchExporter().export(module, {"input_values": x[:1]}, config=ExecutorchConfig(dynamic=True))


@pytest.mark.slow
def test_the_edge_dtype_check_runs_once_on_the_program_partitioned(monkeypatch):
    """ExecuTorch's default edge config ran its dtype check at every graph the lowering built (a
    tiny Llama: 36 times, 6.8 of 47 s); the lowering runs with it off, as XNNPACK's own edge config
    does, and the check runs once per method on the program the partitioner takes; what it finds
    fails the export."""
    from executorch.exir.verification import verifier

    checked = []
    check = verifier._check_tensor_args_matching_op_allowed_dtype
    monkeypatch.setattr(verifier, "_check_tensor_args_matching_op_allowed_dtype",
                        lambda graph_module: checked.append(graph_module) or check(graph_module))
    x = torch.randn(1, 8, generator=torch.Generator().manual_seed(0))
    ExecutorchExporter().export(_Halves().eval(), {"input_values": x}, config=ExecutorchConfig(dynamic=True))
    (graph_module,) = checked  # ExecuTorch's verifier calls it by this name too: it did not run
    assert "sigmoid" in str(graph_module.graph) and "call_delegate" not in str(graph_module.graph)

    def mismatched(graph_module):
        raise verifier.SpecViolationError("These operators are taking Tensor inputs with mismatched dtypes: sigmoid")

    monkeypatch.setattr(verifier, "_check_tensor_args_matching_op_allowed_dtype", mismatched)
    with pytest.raises(ConversionError, match="mismatched dtypes: sigmoid"):
        ExecutorchExporter().export(_Halves().eval(), {"input_values": x}, config=ExecutorchConfig(dynamic=True))


@pytest.mark.slow
def test_a_plan_larger_than_memory_is_refused_at_export(monkeypatch):
    """A plan over this machine's memory used to load as a bare std::bad_alloc (BLOOM planned 8 TB);
    now the export says how much, which tensor, and which bounds to lower."""
    from hfexport.backends.executorch import exporter

    monkeypatch.setattr(exporter, "_physical_memory", lambda: 0)  # any plan is too large
    x = torch.randn(1, 8, generator=torch.Generator().manual_seed(0))
    wants = r"(?s)memory plan needs .* the largest is .*max_sequence_length.*--static-cache N"
    with pytest.raises(ConversionError, match=wants):
        ExecutorchExporter().export(_Halves().eval(), {"input_values": x}, config=ExecutorchConfig(dynamic=True))


@pytest.mark.slow
def test_a_large_plan_is_named_at_export(monkeypatch, caplog):
    """A plan that fits this machine but not a device (T5 plans 16.9 GiB by default) is named at
    export with the bounds behind it and how to lower them; a static program has none to lower."""
    from hfexport.backends.executorch import exporter

    monkeypatch.setattr(exporter, "LARGE_PLAN", 0)  # any plan is large
    x = torch.randn(1, 8, generator=torch.Generator().manual_seed(0))
    with caplog.at_level("WARNING", logger="hfexport"):
        ExecutorchExporter().export(_Halves().eval(), {"input_values": x}, config=ExecutorchConfig(dynamic=True))
    assert any("will allocate" in r.message and "<= 8" in r.message and "max_sequence_length" in r.message
               for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="hfexport"):
        ExecutorchExporter().export(_Halves().eval(), {"input_values": x}, config=ExecutorchConfig(dynamic=False))
    assert not any("will allocate" in r.message for r in caplog.records)


@pytest.mark.slow
def test_max_sequence_length_bounds_the_sequence():
    """A sequence bound and a batch bound at the sample's own batch (2, which the capture once read
    as a range narrowed to the sample and refused): the plan takes both, and validation resizes the
    batch inside 1..2 (it stepped past the bound, then gave up). One layer: the bounds are the
    inputs', which layers do not change (the panel lowers the preset's two)."""
    model, inputs = build_preset("llama", num_hidden_layers=1)
    config = ExecutorchConfig(dynamic=True, max_sequence_length=32, max_batch_size=2)
    et_program = ExecutorchExporter().export(model, inputs, config=config)
    bounds = record_of(et_program).details["dim_bounds"]
    assert bounds["input_ids[1] (sequence)"] == "<= 32: ExecutorchConfig.max_sequence_length"
    assert bounds["input_ids[0] (batch)"] == "<= 2: ExecutorchConfig.max_batch_size"
    # and memory planning got it: every symbol of the program is a batch (<= 2) or a sequence (<= 32)
    uppers = {int(v.upper) for v in et_program.exported_program().range_constraints.values()}
    assert uppers == {2, 32}
    report = validate(et_program, model, inputs)
    assert report.passed, report.to_table()
    resized = next(case for case in report.cases if case.label == "resized")
    assert resized.passed and not resized.error
    with pytest.raises(ValueError, match="max_sequence_length must be >= 2"):
        ExecutorchConfig(max_sequence_length=1)


class _CrossAttention(torch.nn.Module):
    """Whisper's cross-attention shape: the encoder states are viewed with the *decoder's* batch,
    `[b, (b_enc * frames) // b, heads, head_dim]`, so the view's sizes are an expression over symbols
    of two inputs."""

    def __init__(self):
        super().__init__()
        self.q, self.k = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

    def forward(self, inputs_embeds, encoder_hidden_states):
        batch = inputs_embeds.shape[0]
        q = self.q(inputs_embeds).view(batch, -1, 4, 8).transpose(1, 2)
        k = self.k(encoder_hidden_states).view(batch, -1, 4, 8).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q, k, k).transpose(1, 2).reshape(batch, -1, 32)


@pytest.mark.slow
def test_a_view_is_planned_within_its_base(monkeypatch):
    """ExecuTorch bounds a view's sizes apart from its base's, and `(b_enc * frames) // b` bounds far
    above the base: the view ran past the arena and Whisper's prefill failed to *load* (error 0x21).
    The view's bound is capped at its base's element count; a plan that still does not fit its arenas
    is refused at export."""
    from hfexport.backends.executorch import planning

    module = _CrossAttention().eval()
    g = torch.Generator().manual_seed(0)
    inputs = {"inputs_embeds": torch.randn(1, 3, 32, generator=g), "encoder_hidden_states": torch.randn(1, 6, 32, generator=g)}
    et_program = ExecutorchExporter().export(module, inputs, config=ExecutorchConfig(dynamic=True))
    assert record_of(et_program).details["views_bounded_by_base"]
    method = Runtime.get().load_program(et_program.buffer).load_method("forward")
    for batch, sequence, frames in ((1, 5, 7), (3, 2, 12)):
        x = {"inputs_embeds": torch.randn(batch, sequence, 32, generator=g),
             "encoder_hidden_states": torch.randn(batch, frames, 32, generator=g)}
        with torch.no_grad():
            assert (method.execute(list(x.values()))[0] - module(**x)).abs().max() < ATOL
    monkeypatch.setattr(planning, "_cap", lambda node: None)  # ExecuTorch's own bounds
    with pytest.raises(ConversionError, match=r"outside their storage.*aten_view_copy.* is a view of"):
        ExecutorchExporter().export(module, inputs, config=ExecutorchConfig(dynamic=True))


class _DecayFromWeights(torch.nn.Module):
    """Mamba's discretized decay, `exp(dt[..., None] * A)` with `A = -exp(A_log)` computed from the
    weights at every call."""

    def __init__(self):
        super().__init__()
        self.a_log = torch.nn.Parameter(torch.randn(64, 8, generator=torch.Generator().manual_seed(0)) * 0.1)

    def forward(self, input_values):
        return torch.exp(input_values[..., None] * -torch.exp(self.a_log))


@pytest.mark.slow
def test_weight_only_math_is_folded():
    """Left to the XNNPACK delegate, `-exp(a_log)` broadcast against a dynamic batch wrote outside
    its buffers once the program, first run at batch 1, ran at batch 3 (heap corruption here; wrong
    rows 1.. in Mamba's decode). Folded into a constant, it is right in any order of batch sizes."""
    module = _DecayFromWeights().eval()
    et_program = ExecutorchExporter().export(module, {"input_values": torch.rand(1, 64)},
                                             config=ExecutorchConfig(dynamic=True))
    graph = et_program.exported_program().graph
    assert not any(n.op == "placeholder" and "a_log" in n.name for n in graph.nodes)  # folded away
    method = Runtime.get().load_program(et_program.buffer).load_method("forward")
    for batch in (1, 3, 1, 3):
        x = torch.rand(batch, 64, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            assert (method.execute([x])[0] - module(x)).abs().max() < ATOL


@pytest.mark.slow
def test_a_one_token_prompt_is_traced_at_two_tokens():
    """A size-1 sequence left the dim orders of a Llama's rotary `cat` inputs ambiguous and the
    planned orders disagreed: every call failed, at every size ("input tensors have different dim
    orders", error 0x12; the fuzzer's first finding of its long run). Traced at two tokens, the
    program takes one token, and more. One layer: each layer's rotary `cat` failed alike."""
    model, inputs = build_preset("llama", num_hidden_layers=1)
    one = {k: v[:, :1] for k, v in inputs.items()}
    program = ExecutorchExporter().export(model, one, config=ExecutorchConfig(dynamic=True))
    report = validate(program, model, one)
    assert report.passed and [c.label for c in report.cases] == ["sample", "resized"], report.to_table()


@pytest.mark.parametrize(("config", "expected"), [
    ({"n_positions": 512}, (512, "the model config's n_positions")),  # t5-small's config.json
    ({"n_positions": 96, "num_layers": 3, "num_heads": 2}, (96, "the model config's n_positions")),
    ({"n_positions": None}, (4096, "no position limit in the config (max_position_embeddings, "
                                   "max_target_positions, n_positions): 4096")),
])
def test_t5s_sequences_are_bounded_at_its_n_positions(config, expected):
    """T5's checkpoints name their position limit only as `n_positions`: without it their sequences
    were planned at `FALLBACK_MAX` (the preset's encoder 10 GiB, allocated and zeroed at every load);
    a config with no limit at all keeps the fallback."""
    from transformers import T5Config

    from hfexport.backends.executorch.exporter import FALLBACK_MAX, ConfigBounds

    model, inputs = build_preset("t5", **config)
    assert isinstance(model.config, T5Config)
    bounds = ConfigBounds(model, inputs, ExecutorchConfig())
    assert bounds.max_positions == expected and FALLBACK_MAX == 4096
    assert bounds("input_ids", 1, inputs["input_ids"].shape[1], "sequence")[1] == expected[0]
    bounded = ConfigBounds(model, inputs, ExecutorchConfig(max_sequence_length=64))
    assert bounded.max_positions == (64, "ExecutorchConfig.max_sequence_length")


@pytest.mark.parametrize("leaf", ["encoder_outputs.0", "model-output.0", "encoder_hidden_states"])
@pytest.mark.parametrize(("config", "expected"), [
    ({}, (128, "the model config's n_positions")),
    ({"n_positions": 96, "d_model": 48, "num_heads": 3}, (96, "the model config's n_positions")),
])
def test_the_encoders_sequence_a_decoder_reads_is_bounded_at_the_position_limit(leaf, config, expected):
    """A T5 prefill takes `encoder_outputs` (the export job's: a `BaseModelOutput`, whose children the
    capture names by position): its leaf `encoder_outputs.0` had no role, so its sequence was bounded
    and planned at twice the sample (14). It is the encoder's sequence, bounded as the encoder's
    input is; an encoder naming its own limit (`max_source_positions`, Whisper's) is bounded at that,
    and `max_sequence_length` wins. The bounds get the role the capture read from the leaf as traced
    (a first form looked the leaf's rank up again by name and missed a `ModelOutput`'s children)."""
    from transformers.modeling_outputs import BaseModelOutput

    from hfexport.backends.executorch.exporter import ConfigBounds
    from hfexport.capture.dynamic import plan_dynamic_shapes
    from hfexport.capture.names import role_of

    model, inputs = build_preset("t5", **config)
    states = torch.zeros(1, 7, model.config.d_model)
    inputs = {"decoder_input_ids": inputs["decoder_input_ids"][:, :1],  # a prefill's arguments
              "encoder_outputs": BaseModelOutput(last_hidden_state=states) if leaf == "model-output.0" else (states,)}
    leaf = leaf.replace("model-output", "encoder_outputs")
    if leaf == "encoder_hidden_states":
        inputs = {"input_ids": inputs["decoder_input_ids"], "encoder_hidden_states": states}
    assert role_of(leaf, 3, 1) == "encoder_sequence" and role_of(leaf, 3, 0) == "batch"
    assert role_of("encoder_outputs.1", 3, 1) is None  # another field of the output: no role

    def planned(model: torch.nn.Module, config: ExecutorchConfig) -> tuple[int, str]:
        """The encoder sequence's bound as the capture asks for it: `(upper, why)`."""
        bounds = ConfigBounds(model, inputs, config)
        plan_dynamic_shapes(inputs, dynamic=True, dynamic_shapes=None, bounds=bounds)
        upper, why = bounds.chosen[f"{leaf}[1] (encoder_sequence)"].removeprefix("<= ").split(": ", 1)
        return int(upper), why

    assert planned(model, ExecutorchConfig()) == expected
    assert planned(model, ExecutorchConfig(max_sequence_length=64)) == (64, "ExecutorchConfig.max_sequence_length")
    model.config.max_source_positions = 1500  # an encoder with a limit of its own
    assert planned(model, ExecutorchConfig()) == (1500, "the model config's max_source_positions")
    assert ConfigBounds(model, inputs, ExecutorchConfig())("input_ids", 1, 7, "sequence") == (1, expected[0])
    # a module without a config: twice the sample (the fallback on both sides of a cross-attention
    # planned 48 GiB: test_a_view_is_planned_within_its_base)
    assert planned(torch.nn.Identity(), ExecutorchConfig())[0] == 14


def test_the_text_embeddings_token_ids_are_bounded_as_a_sequence_not_twice_the_sample():
    """An image-text model's `text_embeddings` component (`nn.Embedding.forward(input)`): its ids'
    sequence axis is bounded as a sequence (a prompt over twice the sample's length failed in
    `set_inputs` before); another module's unnamed `input` keeps twice the sample."""
    from hfexport import ExecutorchConfig
    from hfexport.backends.executorch.exporter import FALLBACK_MAX, ConfigBounds

    ids = torch.zeros(1, 12, dtype=torch.long)
    embedding = ConfigBounds(torch.nn.Embedding(128, 8), {"input": ids}, ExecutorchConfig())
    assert embedding("input", 1, 12, None) == (1, FALLBACK_MAX)  # `input` of rank 2: no role of its own
    assert embedding("input", 0, 1, None) == (1, ExecutorchConfig().max_batch_size)
    linear = ConfigBounds(torch.nn.Linear(256, 8), {"input": torch.zeros(1, 256)}, ExecutorchConfig())
    assert linear("input", 1, 256, None) == (1, 512)
