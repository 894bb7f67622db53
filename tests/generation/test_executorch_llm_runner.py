"""The ExecuTorch program shaped for ExecuTorch's own LLM runner (`backends/executorch/llm.py`):
its cache in program buffers written by `llama::update_cache` and read by `llama::custom_sdpa`,
run by `TextLLMRunner`, `hfexport`'s `GenerationRunner` and compared with eager `generate`."""

from __future__ import annotations

import json
import random

import pytest
import torch

from tests.harness import both_llm_runners, require_backend, tiny_bpe_tokenizer

NEW_TOKENS = 10
CACHE = 48
PROMPT = "once upon a time"

#: Families the coverage matrix runs with a static cache, and how their layers attend in the program.
FAMILIES = {
    "llama": {"custom_sdpa"},
    "qwen2": {"custom_sdpa"},
    "qwen3": {"custom_sdpa"},
    "phi3": {"custom_sdpa"},
    "mistral": {"custom_sdpa+window"},  # the preset's window (4) is shorter than the cache
    "gemma3_text": {"custom_sdpa", "custom_sdpa+window"},
    "gemma2": {"torch"},  # attention logit softcapping: the op has none
}


def _greedy(program, ids: torch.Tensor, new_tokens: int) -> list[int]:
    """Greedy tokens of an eager `LlmProgram`: the prompt in one call, then one token per call."""
    with torch.no_grad():
        tokens = [int(program(ids, torch.tensor([0]))["logits"][0, -1].argmax())]
        for past in range(ids.shape[1], ids.shape[1] + new_tokens - 1):
            tokens.append(int(program(torch.tensor([[tokens[-1]]]), torch.tensor([past]))["logits"][0, -1].argmax()))
    return tokens


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_attends_through_the_program_cache_with_generates_tokens(family):
    """Eager `LlmProgram` (the ExecuTorch ops' own eager kernels) gives `generate`'s greedy tokens,
    and the record says how each layer attends and why a layer falls back."""
    pytest.importorskip("executorch")
    from hfexport.backends.executorch.llm import LlmProgram
    from hfexport.presets import build_preset

    model, inputs = build_preset(family)
    ids = inputs["input_ids"][:1]
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False)[0, ids.shape[1]:].tolist()
    program = LlmProgram(model, 32)
    assert _greedy(program, ids, 6) == want
    summary = program.plan_summary()
    assert set(summary["layers_by_op"]) == FAMILIES[family]
    assert sorted(i for layers in summary["layers_by_op"].values() for i in layers) == list(range(2))
    assert set(summary.get("why", {})) == {str(i) for op, layers in summary["layers_by_op"].items()
                                           if op != "custom_sdpa" for i in layers}
    assert model.config._attn_implementation != "hfexport_executorch_llm"  # the eager model is left as it was


def test_a_model_whose_attention_bypasses_the_interface_is_refused():
    pytest.importorskip("executorch")
    from hfexport.backends.executorch.llm import LlmProgram
    from hfexport.errors import PrepareError
    from hfexport.presets import build_preset

    model, _ = build_preset("bloom")
    with pytest.raises(PrepareError, match="AttentionInterface") as error:
        LlmProgram(model, 32)
    assert "--no-llm-runner" in error.value.remedy


def _batch_of_two(model, inputs):
    return {"input_ids": torch.cat([inputs["input_ids"][:1]] * 2)}


#: Exports the program cannot serve: preset, how the sample prompt is made, what the reason says.
FALLBACKS = {
    "two sequences": ("llama", _batch_of_two, "holds 2 sequences"),
    "encoder-decoder": ("t5", None, "drives a text decoder"),
    "alibi": ("bloom", None, "AttentionInterface"),
    "state-space cache": ("mamba", None, "did not run with its cache in the program"),
}


@pytest.mark.parametrize("case", list(FALLBACKS))
def test_where_the_program_cannot_serve_the_export_the_default_falls_back_and_says_why(case, caplog):
    """`llm_runner=None` (default): the static-cache components, a warning naming the reason and
    that TextLLMRunner cannot load them; `llm_runner=True`: `PrepareError` with the opt-out."""
    pytest.importorskip("executorch")
    from hfexport.backends.executorch.llm_export import default_llm_component, llm_component
    from hfexport.errors import PrepareError
    from hfexport.presets import build_preset

    preset, make_prompt, reason = FALLBACKS[case]
    model, inputs = build_preset(preset)
    prompt = make_prompt(model, inputs) if make_prompt else {k: v for k, v in inputs.items()
                                                              if not k.startswith("decoder_")}
    with caplog.at_level("WARNING", logger="hfexport"):
        program, why = default_llm_component(model, prompt, 32)
    assert program is None and reason in why
    assert reason in caplog.text and "TextLLMRunner cannot load" in caplog.text
    with pytest.raises(PrepareError, match=reason) as error:
        llm_component(model, prompt, 32)
    assert "--no-llm-runner" in error.value.remedy


def test_the_job_falls_back_to_the_static_cache_components_with_the_reason(caplog):
    """ExecuTorch's plan of a folder's generation export (no lowering: that is `saved_generation`'s
    static case): a batch of two gets the components the request exported before, and the report
    and the decode record say why; asked for by name, an error."""
    pytest.importorskip("executorch")
    from hfexport import AutoHfExporter, ExecutorchConfig
    from hfexport.errors import PrepareError
    from hfexport.job.export import _static_cache
    from hfexport.presets import build_preset

    model, inputs = build_preset("llama")
    prompt = _batch_of_two(model, inputs)
    package, config = AutoHfExporter.from_config(ExecutorchConfig()).runtime_package(), ExecutorchConfig(dynamic=True)
    with caplog.at_level("WARNING", logger="hfexport"):
        plan = package.plan(model, prompt, config, _static_cache(32, None), True, static_cache=32)
        components = package.components(model, plan)
    assert list(components) == ["decode"] and "input_pos" not in components["decode"][1]
    assert any(k.startswith("cache") or k == "past_key_values" for k in components["decode"][1])
    why = plan.report["llm_runner"]["why"]
    assert "holds 2 sequences" in why and "TextLLMRunner" in caplog.text
    assert plan.record_details["decode"]["llm_custom_ops"] == {"used": False, "reason": why}
    with pytest.raises(PrepareError, match="holds 2 sequences"):
        package.plan(model, prompt, config.replace(llm_runner=True), _static_cache(32, None), True, static_cache=32)
    # the seed's export_for_generation keeps its components whatever llm_runner says
    seed = AutoHfExporter.from_config(ExecutorchConfig()).plan_generation(
        model, inputs, ExecutorchConfig(dynamic=True, llm_runner=True), _static_cache(32, None), True)
    assert seed.components is None and seed.report == {}


def test_llm_runner_needs_executorch_and_a_generation_export(tmp_path):
    from transformers import GenerationConfig

    from hfexport import ExecutorchConfig, OnnxConfig
    from hfexport.job.export import GenerationOptions, export_to_folder

    with pytest.raises(ValueError, match="generate=True"):
        export_to_folder("tiny:llama", ExecutorchConfig(), tmp_path / "a", llm_runner=True)
    with pytest.raises(ValueError, match="llm_runner is not an option of OnnxConfig"):
        export_to_folder("tiny:llama", OnnxConfig(), tmp_path / "b", generation=GenerationOptions(static_cache=32),
                         llm_runner=True)
    with pytest.raises(ValueError, match="pass static_cache=N"):
        static = GenerationConfig(cache_implementation="static", max_cache_len=32)
        export_to_folder("tiny:llama", ExecutorchConfig(), tmp_path / "c",
                         generation=GenerationOptions(generate=True, generation_config=static), llm_runner=True)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(("positions", "bound", "want"), [
    (128, None, 128), (2048, None, 2048), (8192, None, 2048), (8192, 300, 300), (64, 300, 300)])
def test_a_plain_generation_export_sizes_the_cache_from_the_bound_or_the_models_positions(positions, bound, want):
    """`default_cache_length`: `ExecutorchConfig.max_sequence_length` where given, else the
    model's positions up to `DEFAULT_CACHE_LENGTH`, and the reason names the way to change it."""
    pytest.importorskip("executorch")
    from transformers import LlamaConfig, LlamaForCausalLM

    from hfexport.backends.executorch.llm_export import DEFAULT_CACHE_LENGTH, default_cache_length

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, max_position_embeddings=positions))
    length, why = default_cache_length(model, bound)
    assert length == want
    if bound is not None:
        assert "max_sequence_length" in why
    elif positions > DEFAULT_CACHE_LENGTH:
        assert "--static-cache N" in why and str(positions) in why
    else:
        assert "max_position_embeddings" in why


def test_a_plain_generation_export_the_program_cannot_serve_gets_the_dynamic_cache_components(caplog):
    """Where the program cannot serve a plain `--generate` (a batch of two here), the
    components `generate` exported before (a dynamic cache: no `input_pos`, the cache as inputs),
    said at info level, not warned; the report's note names the dynamic-cache components."""
    pytest.importorskip("executorch")
    from hfexport import AutoHfExporter, ExecutorchConfig
    from hfexport.presets import build_preset

    model, inputs = build_preset("llama")
    package, config = AutoHfExporter.from_config(ExecutorchConfig()).runtime_package(), ExecutorchConfig(dynamic=True)
    with caplog.at_level("INFO", logger="hfexport"):
        plan = package.plan(model, _batch_of_two(model, inputs), config, None, False)
        components = package.components(model, plan)
    assert "input_pos" not in str(components) and {"prefill", "decode"} <= set(components)
    note = plan.report["llm_runner"]
    assert "holds 2 sequences" in note["why"] and "dynamic-cache" in caplog.text
    assert not [r for r in caplog.records if r.name == "hfexport" and r.levelname == "WARNING"]
    assert "dynamic-cache" in note["fallback"] and plan.generation_config is None


@pytest.fixture(scope="module")
def llm_export(tmp_path_factory):
    """A tiny random Llama (key/value heads and head size drawn) and its tokenizer saved with
    `save_pretrained`, its config allowing 4x `DEFAULT_CACHE_LENGTH` positions, exported with a plain
    `generate=True` and `ExecutorchConfig(max_sequence_length=N)` (`--max-sequence-length N`): the
    LLM-runner program over a cache of N is the default of an ExecuTorch generation export (one
    export for the module; `--static-cache N` reaches the same program: test_external_weights.py,
    test_real_llm.py)."""
    require_backend("executorch")
    from transformers import LlamaConfig, LlamaForCausalLM

    from hfexport import ExecutorchConfig
    from hfexport.backends.executorch.llm_export import DEFAULT_CACHE_LENGTH
    from hfexport.job.export import GenerationOptions, LoadingOptions, export_to_folder

    draw = random.Random(30)
    kv_heads, head_dim = draw.choice([1, 2, 4]), draw.choice([8, 16])
    tokenizer = tiny_bpe_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=head_dim,
                         max_position_embeddings=4 * DEFAULT_CACHE_LENGTH, bos_token_id=0, eos_token_id=1)
    source = tmp_path_factory.mktemp("llm-source")
    LlamaForCausalLM(config).eval().save_pretrained(source)
    tokenizer.save_pretrained(source)
    out = tmp_path_factory.mktemp("llm-export") / "out"
    result = export_to_folder(str(source), ExecutorchConfig(dynamic=True, max_sequence_length=CACHE), out,
                              generation=GenerationOptions(generate=True), loading=LoadingOptions(prompt=PROMPT))
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        eager = result.model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                      do_sample=False)[0, ids.shape[1]:].tolist()
    return result, tokenizer, ids, eager


@pytest.mark.slow
def test_the_program_holds_its_cache_and_says_what_the_runner_reads(llm_export):
    result, tokenizer, _, _ = llm_export
    manifest = result.manifest
    assert manifest["cache"] == "program" and manifest["max_cache_len"] == CACHE
    package = manifest["runtime_package"]
    assert package["runner"] == "TextLLMRunner" and package["ready"] and package["settings"]["program"] == "decode.pte"
    assert {"decode.pte", "tokenizer.json"} <= set(package["files"]) <= set(manifest["files"]), package
    decode = manifest["components"]["decode"]
    assert [i["name"] for i in decode["inputs"]] == ["input_ids", "input_pos"] and decode["outputs"] == ["logits"]
    assert decode["kernel_libraries"] == ["llama"]  # what a fresh process loads before the program
    record = json.loads((result.directory / "report.json").read_text())["components"]["decode"]["record"]
    program = record["llm_program"]
    assert program["layers_by_op"] == {"custom_sdpa": [0, 1]}
    assert program["constant_methods"] == {
        "get_max_seq_len": CACHE, "get_max_context_len": CACHE, "get_vocab_size": len(tokenizer), "use_kv_cache": True,
        "use_sdpa_with_kv_cache": False, "enable_dynamic_shape": True, "get_bos_id": 0, "get_eos_ids": [1]}
    assert record["kernel_libraries"] == ["llama"] and "llm_custom_ops" not in record
    assert result.report["llm_runner"]["tokenizer"] == "tokenizer.json"
    assert result.report["llm_runner"]["cache"] == {"tokens": CACHE, "from": "ExecutorchConfig.max_sequence_length "
                                                                            "(--max-sequence-length)"}
    assert (result.directory / "tokenizer.json").is_file()
    assert result.reports["decode"].passed and len(result.reports["decode"].cases) >= 2  # validated against eager
    runner = result.report["runner"]  # the job ran TextLLMRunner on it (drawn kv heads and head size)
    assert runner["checked"] and runner["tokens_equal"] and runner["runner"].startswith("executorch"), runner


@pytest.mark.slow
def test_a_fresh_process_generates_eagers_tokens_with_both_runners(llm_export):
    """`hfexport generate`'s runner and ExecuTorch's `TextLLMRunner` give eager's greedy tokens."""
    result, tokenizer, ids, eager = llm_export
    got = both_llm_runners(result.directory, PROMPT, ids[0].tolist(), NEW_TOKENS)
    assert got["ours"] == eager
    # the runner stops at an EOS id (get_eos_ids); eager was held to NEW_TOKENS
    stop = next((i + 1 for i, token in enumerate(eager) if token == 1), NEW_TOKENS)
    assert got["pieces"] == [tokenizer.decode([token]) for token in eager][:stop]


@pytest.mark.slow
def test_a_new_prompt_overwrites_the_cache_and_an_overflow_is_refused(llm_export):
    from hfexport import GenerationRunner
    from hfexport.errors import ExportError

    result, _, ids, eager = llm_export
    runner = GenerationRunner.load(result.directory)
    assert runner.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS).tokens == eager
    again = runner.generate(ids[:, :2], max_new_tokens=3, min_new_tokens=3)
    with torch.no_grad():
        want = result.model.generate(ids[:, :2], max_new_tokens=3, min_new_tokens=3, do_sample=False)[0, 2:].tolist()
    assert again.tokens == want
    with pytest.raises(ExportError, match="do not fit the program's cache"):
        runner.generate(torch.zeros((1, CACHE - 2), dtype=torch.long), max_new_tokens=4, min_new_tokens=4)


def _eager(model, ids: torch.Tensor, new_tokens: int, **options) -> list[int]:
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new_tokens, **options)[0, ids.shape[1]:].tolist()


@pytest.mark.slow
def test_greedy_runs_the_fast_path_with_generates_tokens_and_anything_else_the_generic_loop(llm_export):
    """Greedy with end-token stopping takes `greedy.GreedySteps` (the result says so) and gives
    `generate`'s tokens, on drawn prompt lengths and end tokens; a sampling or penalised config
    takes the generic loop and gives `generate`'s tokens under the same seed; a state kept between
    two calls (a chat's) continues where the fast steps left it."""
    from hfexport import GenerationRunner
    from hfexport.generation.loop import DecodeState

    result, tokenizer, _, _ = llm_export
    model, runner = result.model, GenerationRunner.load(result.directory, engine="hfexport")
    draw = random.Random(31)
    for length in (1, draw.randint(2, 8), draw.randint(9, 24)):
        ids = torch.tensor([[draw.randrange(2, len(tokenizer)) for _ in range(length)]])
        free = _eager(model, ids, NEW_TOKENS, eos_token_id=None, do_sample=False)
        # an end token the greedy answer reaches after its first token (a random model may repeat one)
        later = [token for i, token in enumerate(free) if i and token not in free[:i]]
        eos = draw.choice(later) if later else free[0]
        for options in ({"eos_token_id": None}, {"eos_token_id": eos}, {"eos_token_id": [1, eos]}):
            got = runner.generate(ids, max_new_tokens=NEW_TOKENS, **options)
            assert got.fast_path == (len(got.tokens) > 1), (length, options)
            assert got.tokens == _eager(model, ids, NEW_TOKENS, do_sample=False, **options), (length, options)
            assert got.stopped_at_eos == (options["eos_token_id"] is not None)

    ids = torch.tensor([[draw.randrange(2, len(tokenizer)) for _ in range(5)]])
    for options in ({"do_sample": True, "top_k": 20, "temperature": 0.7}, {"repetition_penalty": 1.5},
                    {"min_new_tokens": NEW_TOKENS}):
        got = runner.generate(ids, max_new_tokens=NEW_TOKENS, seed=7, **options)
        torch.manual_seed(7)  # eager samples from the global generator, the runner from one seeded alike
        want = _eager(model, ids, NEW_TOKENS, **{"do_sample": False, **options})
        assert not got.fast_path and got.tokens == want, options

    config = runner.generation_config(4, eos_token_id=None)
    state = DecodeState(runner, ids, None, {})
    first = runner._generate_on(state, ids, ids, config)
    assert first.fast_path and state.past == ids.shape[1] + 3 and state.fed == ids[0].tolist() + first.tokens[:-1]
    sequence = torch.tensor([ids[0].tolist() + first.tokens])
    then = runner._generate_on(state, sequence[:, -1:], sequence, runner.generation_config(5, eos_token_id=None))
    assert first.tokens + then.tokens == _eager(model, ids, 9, eos_token_id=None, do_sample=False)
