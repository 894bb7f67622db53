"""Tasks (`hfexport.generation.tasks`): which export a model gets with no option, how `--task` combines with
the generation options, and that `hfexport export MODEL -f F -o OUT` of a causal LM writes the
runtime's LLM package, whose own runner gives eager `generate`'s greedy tokens."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import torch

from hfexport.cli.main import main
from hfexport.errors import TaskError
from hfexport.presets import build_preset
from hfexport.generation.tasks import (DEFAULT_CACHE_LENGTH, TASKS, GenerationFlags, default_cache_length, graph_component,
                            infer_task, resolve_task)
from tests.harness import both_llm_runners, genai_tokens_in_a_new_process, require_backend, tiny_bpe_tokenizer

NEW_TOKENS = 8
PROMPT = "once upon a time"
#: the drawn Llama of the package exports (key/value heads, head size, prompt length), reproducibly
DRAW = random.Random(40)
VARIATION = {"num_key_value_heads": DRAW.choice([1, 2, 4]), "head_dim": DRAW.choice([8, 16, 32])}
PROMPT_LENGTH = DRAW.randint(2, 12)
#: the drawn Llama's positions: below `DEFAULT_CACHE_LENGTH`, so the package's default cache is this cap
POSITIONS = 128


# -- inference, without exporting --------------------------------------------------------------

@pytest.mark.parametrize(("preset", "task", "words"), [
    ("llama", "text-generation-with-past", "LlamaForCausalLM generates text; `--task forward` for one graph"),
    ("gpt2", "text-generation-with-past", "GPT2LMHeadModel generates text"),  # can_generate() and an LM head
    ("mamba", "generation-components", "recurrent state"),
    ("bert", "forward", "BertModel does not generate text"),
    ("vit", "forward", "ViTForImageClassification does not generate text"),
    ("t5", "forward", "no runtime's LLM package"),  # seq2seq
    ("whisper", "automatic-speech-recognition", "transcribes speech"),  # speech seq2seq: its runtime's speech package
    ("llava", "forward", "`--task generation-components`"),  # image-text-to-text
    ("clip", "forward", "CLIPModel does not generate text"),
])
def test_each_kind_of_model_gets_its_task_and_the_reason_says_how_to_ask_for_another(preset, task, words):
    model, _ = build_preset(preset)
    got, reason = infer_task(model)
    assert got == task and words in reason, reason


@pytest.mark.parametrize(("requested", "flags", "task", "want"), [
    (None, GenerationFlags(), "forward", GenerationFlags()),  # the Python API's default: the options decide
    (None, GenerationFlags(generate=True), "generation-components", GenerationFlags(generate=True)),
    (None, GenerationFlags(static_cache=32), "text-generation-with-past", GenerationFlags(static_cache=32)),
    ("auto", GenerationFlags(), "text-generation-with-past", GenerationFlags()),
    ("auto", GenerationFlags(static_cache=64), "text-generation-with-past", GenerationFlags(static_cache=64)),
    ("auto", GenerationFlags(generate=True), "generation-components", GenerationFlags(generate=True)),  # kept
    ("auto", GenerationFlags(True, True, 32), "text-generation-with-past", GenerationFlags(True, True, 32)),
    ("generation-components", GenerationFlags(), "generation-components", GenerationFlags(generate=True)),
    ("text-generation-with-past", GenerationFlags(static_cache=16), "text-generation-with-past",
     GenerationFlags(static_cache=16)),
    ("forward", GenerationFlags(), "forward", GenerationFlags()),
    ("text-generation", GenerationFlags(), "text-generation", GenerationFlags()),
])
def test_a_task_and_the_generation_options_resolve_to_what_they_ask(requested, flags, task, want):
    model, _ = build_preset("llama")
    choice = resolve_task(requested, model, flags)
    assert (choice.task, choice.flags) == (task, want)
    assert choice.to_dict()["name"] == task and choice.reason


@pytest.mark.parametrize(("preset", "requested", "flags", "message"), [
    ("llama", "forward", GenerationFlags(generate=True), "--task forward exports one graph"),
    ("llama", "feature-extraction", GenerationFlags(static_cache=8), "exports one graph"),
    ("llama", "text-generation-with-past", GenerationFlags(True, True), "makes the runtime's LLM package itself"),
    ("llama", "nope", GenerationFlags(), "unknown task 'nope'"),
    ("bert", "text-generation", GenerationFlags(), "BertModel does not generate text"),
    ("bert", "text-generation-with-past", GenerationFlags(), "BertModel does not generate text"),
    ("mamba", "text-generation-with-past", GenerationFlags(), "recurrent state"),
    ("t5", "text-generation-with-past", GenerationFlags(), "no runtime's LLM package"),
    ("bert", "auto", GenerationFlags(static_cache=32), "--static-cache 32 sizes an LLM package's cache"),
    ("whisper", "auto", GenerationFlags(static_cache=32), "--static-cache 32 sizes an LLM package's cache"),
    ("llama", "automatic-speech-recognition", GenerationFlags(), "LlamaForCausalLM is no speech encoder-decoder"),
    ("t5", "automatic-speech-recognition", GenerationFlags(), "(here forward)"),
])
def test_a_task_the_options_or_the_model_contradict_is_refused_with_a_remedy(preset, requested, flags, message):
    model, _ = build_preset(preset)
    with pytest.raises(TaskError, match="What to do: ") as refused:
        resolve_task(requested, model, flags)
    assert message in str(refused.value)


@pytest.mark.parametrize(("preset", "requested", "task"), [
    ("whisper", "auto", "automatic-speech-recognition"), ("whisper", "automatic-speech-recognition",
                                                          "automatic-speech-recognition"),
    ("mamba", "auto", "generation-components")])
def test_a_task_that_exports_components_asks_for_them(preset, requested, task):
    """Inferred or named, a components task generates (`--task auto` on Mamba exported one graph of
    its base model under the name `generation-components` before)."""
    model, _ = build_preset(preset)
    choice = resolve_task(requested, model, GenerationFlags())
    assert (choice.task, choice.flags) == (task, GenerationFlags(generate=True))


@pytest.mark.parametrize(("positions", "want"), [(128, 128), (DEFAULT_CACHE_LENGTH, DEFAULT_CACHE_LENGTH),
                                                 (8192, DEFAULT_CACHE_LENGTH), (None, DEFAULT_CACHE_LENGTH)])
def test_the_packages_default_cache_is_2048_capped_by_the_models_positions(positions, want):
    from types import SimpleNamespace

    from transformers import PretrainedConfig

    config = PretrainedConfig(**({} if positions is None else {"max_position_embeddings": positions}))
    length, why = default_cache_length(SimpleNamespace(config=config))
    assert DEFAULT_CACHE_LENGTH == 2048 and length == want
    assert ("max_position_embeddings" in why) if positions and positions <= 2048 else ("--static-cache N" in why)


@pytest.mark.parametrize(("fmt", "named", "want"), [
    ("dynamo", None, GenerationFlags(True, True, POSITIONS)),  # the static-cache multi-token decode
    ("onnx", None, GenerationFlags(True, True, POSITIONS)),  # onnxruntime-genai's folder
    ("onnx", 64, GenerationFlags(True, True, 64)),
    ("openvino", None, GenerationFlags(generate=True)),  # LLMPipeline's state grows
    ("openvino", 64, GenerationFlags(True, True, 64)),  # ... bounded by a cache named
    ("executorch", None, GenerationFlags(generate=True)),  # the LLM-runner program sizes its cache
])
def test_each_backend_asks_for_its_own_package(fmt, named, want):
    """`RuntimePackage.request`: what `--generate`, `--multi-token-decode` and `--static-cache` give each
    runtime's LLM package, and the report's word on its cache."""
    require_backend(fmt)
    from hfexport.auto import AutoExportConfig, AutoHfExporter

    model, _ = build_preset("llama")
    package = AutoHfExporter.from_config(AutoExportConfig.from_dict({"export_format": fmt})).runtime_package()
    flags, cache = package.request(model, named)
    assert flags == want
    assert cache["tokens"] == want.static_cache and cache["from"]


def test_text_generation_and_feature_extraction_are_graphs_without_the_cache():
    model, inputs = build_preset("llama")
    module, kwargs = graph_component("text-generation", model, inputs)
    assert module is model and kwargs == {**inputs, "use_cache": False}
    with torch.no_grad():
        assert module(**kwargs).past_key_values is None
    module, kwargs = graph_component("feature-extraction", model, inputs)
    assert module is model.model and kwargs["use_cache"] is False
    with torch.no_grad():
        assert module(**kwargs).last_hidden_state.shape[-1] == model.config.hidden_size
    assert graph_component("forward", model, inputs) == (model, inputs)
    assert set(TASKS) == {"text-generation-with-past", "automatic-speech-recognition", "generation-components",
                          "text-generation", "feature-extraction", "forward"}


# -- the command line ----------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["--task", "forward", "--generate"], "--task forward exports one graph"),
    (["--task", "text-generation", "--static-cache", "32"], "--task text-generation exports one graph"),
    (["--task", "text-generation-with-past", "--multi-token-decode"], "makes the runtime's LLM package itself"),
])
def test_a_conflicting_task_exits_2_before_any_work(tmp_path, capsys, monkeypatch, args, message):
    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("hfexport.loading.load_model", load_model)
    assert main(["export", "tiny:llama", *args, "-o", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert message in err and "What to do: " in err
    assert not (tmp_path / "out").exists()


def test_an_unknown_task_or_one_the_model_cannot_give_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        main(["export", "tiny:llama", "--task", "nope", "-o", str(tmp_path / "a")])
    assert refused.value.code == 2 and "--task: invalid choice: 'nope'" in capsys.readouterr().err
    assert main(["export", "tiny:bert", "--task", "text-generation", "-o", str(tmp_path / "b"), "-q"]) == 2
    assert "BertModel does not generate text" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def _eager(model, ids: list[int]) -> list[int]:
    """`model.generate`'s greedy `NEW_TOKENS` after `ids`."""
    prompt = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """A tiny Llama (key/value heads and head size drawn) with its tokenizer, saved as transformers
    does: (folder, model, tokenizer, drawn prompt ids)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_bpe_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=POSITIONS, bos_token_id=0, eos_token_id=1,
                         **VARIATION)
    model = LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("tasks") / "hf"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    ids = random.Random(PROMPT_LENGTH).choices(range(2, len(tokenizer)), k=PROMPT_LENGTH)
    return folder, model, tokenizer, ids


def _export(folder, fmt: str, out) -> dict:
    """`hfexport export FOLDER -f FMT -o OUT`, no other option (but --quiet); its report."""
    assert main(["export", str(folder), "-f", fmt, "-o", str(out), "-q"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["task"]["name"] == "text-generation-with-past" and report["generate"] is True
    assert report["task"]["reason"] == "LlamaForCausalLM generates text; `--task forward` for one graph"
    assert all(c["validation"]["passed"] for c in report["components"].values())  # validated against eager
    return report


@pytest.mark.slow
def test_onnx_gets_the_onnxruntime_genai_folder_from_the_readme_command(tmp_path):
    """The README's main job, in a fresh process: an onnxruntime-genai folder over the default cache
    (tiny:llama's 128 positions, below 2048) that `og.Model` opens in another fresh process and whose
    `og.Generator` gives eager's greedy tokens; the parent folders it names are made."""
    require_backend("onnx")
    pytest.importorskip("onnxruntime_genai")
    out = tmp_path / "out" / "tiny-llama"
    done = subprocess.run([sys.executable, "-m", "hfexport", "export", "tiny:llama", "--format", "onnx", "-o",
                           str(out), "--overwrite"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "task:           text-generation-with-past: LlamaForCausalLM generates text" in done.stdout
    assert "result: PASSED" in done.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["task"]["cache"] == {"tokens": 128, "from": "the model config's max_position_embeddings"}
    assert json.loads((out / "genai_config.json").read_text())["model"]["context_length"] == 128
    model, _ = build_preset("llama")
    ids = random.Random(PROMPT_LENGTH).choices(range(3, model.config.vocab_size), k=PROMPT_LENGTH)
    assert genai_tokens_in_a_new_process(out, ids, NEW_TOKENS) == _eager(model.eval(), ids)


@pytest.mark.slow
def test_openvino_gets_the_llm_pipeline_folder(drawn, tmp_path):
    require_backend("openvino")
    ov = pytest.importorskip("openvino")
    ov_genai = pytest.importorskip("openvino_genai")
    import numpy as np

    from hfexport.backends.openvino.genai import GENAI_PROPERTIES

    folder, model, _, ids = drawn
    report = _export(folder, "openvino", tmp_path / "ov")
    assert report["task"]["cache"]["tokens"] is None  # the state grows with the conversation
    assert json.loads((tmp_path / "ov" / "manifest.json").read_text())["runtime_package"]["ready"] is True
    pipe = ov_genai.LLMPipeline(str(tmp_path / "ov"), "CPU", **GENAI_PROPERTIES)
    config = ov_genai.GenerationConfig()
    config.max_new_tokens = config.min_new_tokens = NEW_TOKENS
    config.do_sample = False
    prompt = ov_genai.TokenizedInputs(ov.Tensor(np.array([ids], np.int64)), ov.Tensor(np.ones((1, len(ids)), np.int64)))
    assert list(pipe.generate(prompt, config).tokens[0]) == _eager(model, ids), VARIATION


@pytest.mark.slow
def test_executorch_gets_the_llm_runner_program(drawn, tmp_path):
    require_backend("executorch")
    folder, model, tokenizer, _ = drawn
    report = _export(folder, "executorch", tmp_path / "et")
    assert report["llm_runner"]["cache"] == {"tokens": POSITIONS, "from": "the model config's max_position_embeddings"}
    ids = tokenizer(PROMPT)["input_ids"]
    got = both_llm_runners(tmp_path / "et", PROMPT, ids, NEW_TOKENS)
    eager = _eager(model, ids)
    assert got["ours"] == eager, VARIATION
    stop = next((i + 1 for i, token in enumerate(eager) if token == 1), NEW_TOKENS)  # TextLLMRunner stops at EOS
    assert got["pieces"] == [tokenizer.decode([token]) for token in eager][:stop], VARIATION


@pytest.mark.slow
def test_dynamo_gets_the_static_cache_multi_token_decode_program(drawn, tmp_path, capsys):
    folder, model, _, ids = drawn
    report = _export(folder, "dynamo", tmp_path / "dynamo")
    assert list(report["components"]) == ["decode"]  # one graph prefills and decodes
    assert report["task"]["cache"]["tokens"] == POSITIONS
    manifest = json.loads((tmp_path / "dynamo" / "manifest.json").read_text())
    assert manifest["max_cache_len"] == POSITIONS
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "dynamo"), "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens",
                 str(NEW_TOKENS), "--min-new-tokens", str(NEW_TOKENS), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == _eager(model, ids), VARIATION


@pytest.mark.slow
def test_task_text_generation_is_one_onnx_graph_returning_the_logits_only(tmp_path):
    require_backend("onnx")
    import onnx

    out = tmp_path / "logits"
    assert main(["export", "tiny:llama", "-f", "onnx", "--task", "text-generation", "-o", str(out), "-q"]) == 0
    assert [o.name for o in onnx.load(out / "model.onnx").graph.output] == ["logits"]
    report = json.loads((out / "report.json").read_text())
    assert report["task"] == {"name": "text-generation", "reason": "asked for (--task text-generation)"}
    assert report["components"]["model"]["validation"]["passed"]
