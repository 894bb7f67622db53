"""`hfexport generate` and `hfexport chat` on a runtime's LLM package drive the runtime's own engine
(`folder/engine.py`: onnxruntime-genai's `og.Generator`, OpenVINO GenAI's `LLMPipeline`,
ExecuTorch's `TextLLMRunner`) and give eager `generate`'s tokens; `--engine hfexport` runs
hfexport's loop; options an engine cannot run fall back to the loop and say why, or are refused
with `--engine runtime`; the engine never reads the folder once it is open.

The packages are the session fixture `llm_package("llama", runtime)`'s (shared with
`test_llm_package.py`), each run through the CLI as a user runs it.
"""

from __future__ import annotations

import io
import json
import shutil

import pytest
import torch

from hfexport.cli.main import main

from .exports import LLM_CACHE

pytestmark = pytest.mark.slow  # LLM package exports (shared), generation in their runtimes

RUNTIMES = ("onnx", "openvino", "executorch")
ENGINES = {"onnx": "onnxruntime-genai ", "openvino": "openvino-genai ", "executorch": "executorch TextLLMRunner "}
NEW_TOKENS = 12
MESSAGES = ("once upon a time", "the quick brown fox")


def _generate(capsys, folder, ids: list[int], *options: str) -> dict:
    code = main(["generate", str(folder), "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens",
                 str(NEW_TOKENS), "--json", *options])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_generate_drives_the_runtimes_engine_and_gives_eagers_tokens(llm_package, capsys, runtime):
    package = llm_package("llama", runtime)
    ids = package.ids[0].tolist()
    got = _generate(capsys, package.folder, ids)
    assert got["engine"].startswith(ENGINES[runtime]) and got["engine_reason"] is None, got
    eager = package.eager(NEW_TOKENS, stop_at_eos=True)
    assert got["tokens"] == eager and got["prompt"] == ids
    assert got["stopped_at_eos"] == (eager[-1] == package.tokenizer.eos_token_id)
    assert got["text"] == package.tokenizer.decode(eager, skip_special_tokens=True)
    assert got["time_to_first_token_s"] > 0 and got["fast_path"] is False

    ours = _generate(capsys, package.folder, ids, "--engine", "hfexport")
    assert ours["engine"] == "hfexport" and ours["engine_reason"] is None
    assert ours["tokens"] == eager


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_what_the_engine_cannot_run_falls_back_and_says_why_or_is_refused(llm_package, capsys, runtime):
    package = llm_package("llama", runtime)
    ids = package.ids[0].tolist()
    sampled = _generate(capsys, package.folder, ids, "--do-sample", "--temperature", "0.7", "--seed", "3")
    assert sampled["engine"] == "hfexport" and "sampling" in sampled["engine_reason"], sampled
    assert sampled["tokens"] == _generate(capsys, package.folder, ids, "--engine", "hfexport", "--do-sample",
                                          "--temperature", "0.7", "--seed", "3")["tokens"]
    penalty = _generate(capsys, package.folder, ids, "--repetition-penalty", "1.3")
    assert penalty["engine"] == "hfexport" and "repetition penalty" in penalty["engine_reason"], penalty

    assert main(["generate", str(package.folder), "--prompt-ids", "1,2", "--do-sample", "--engine", "runtime"]) == 2
    assert "sampling" in capsys.readouterr().err

    # a minimum of new tokens: LLMPipeline masks the stop tokens as generate() does; onnxruntime-genai
    # (its model's own end tokens only) and TextLLMRunner (none) cannot, so hfexport's loop runs it
    least = _generate(capsys, package.folder, ids, "--min-new-tokens", str(NEW_TOKENS))
    assert least["tokens"] == package.eager(NEW_TOKENS)
    if runtime == "openvino":
        assert least["engine"].startswith(ENGINES[runtime]), least
    else:
        assert least["engine"] == "hfexport" and "min_new_tokens" in least["engine_reason"], least
    # more tokens than the engine's cache holds: hfexport's loop, which says where the cache ends
    long = _generate(capsys, package.folder, ids, "--max-new-tokens", str(LLM_CACHE + 1 - len(ids)))
    assert long["engine"] == "hfexport" and "cache" in long["engine_reason"], long


def test_a_prompt_ending_with_onnxruntime_genais_pad_token_runs_hfexports_loop(llm_package, capsys):
    """og masks a prompt's trailing pad tokens (right padding; the pad is the end token where the
    model has none), where `generate()` attends to them: such a prompt runs hfexport's loop and says
    why, and `--engine runtime` refuses it."""
    package = llm_package("llama", "onnx")
    pad = json.loads((package.folder / "genai_config.json").read_text())["model"]["pad_token_id"]
    ids = [*package.ids[0].tolist(), pad]
    got = _generate(capsys, package.folder, ids)
    assert got["engine"] == "hfexport" and "pad token" in got["engine_reason"], got
    with torch.no_grad():
        eager = package.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                       max_new_tokens=NEW_TOKENS, do_sample=False)
    assert got["tokens"] == eager[0, len(ids):].tolist()
    assert main(["generate", str(package.folder), "--prompt-ids", ",".join(map(str, ids)), "--engine", "runtime"]) == 2
    assert "pad token" in capsys.readouterr().err


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_engine_runs_a_private_copy_not_the_folder(llm_package, capsys, tmp_path, runtime):
    """Once open, the folder's files are never read again: damaged after `load`, the engine still
    gives eager's tokens (stopping at a token of the request's, not the model's)."""
    from hfexport import GenerationRunner

    package = llm_package("llama", runtime)
    folder = shutil.copytree(package.folder, tmp_path / "copy")
    runner = GenerationRunner.load(folder)
    for path in folder.iterdir():
        if path.name != "manifest.json":
            path.write_bytes(b"\0" * 16)
    stop = package.eager(NEW_TOKENS)[5]
    with torch.no_grad():
        eager = package.model.generate(package.ids, attention_mask=torch.ones_like(package.ids),
                                       max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=[stop])
    got = runner.generate(package.ids, max_new_tokens=NEW_TOKENS, eos_token_id=[stop])
    assert got.engine.startswith(ENGINES[runtime]) and got.tokens == eager[0, package.ids.shape[1]:].tolist()
    assert got.tokens[-1] == stop


def _eager_answers(package, messages: list[str], end_ids: list[int]) -> list[list[int]]:
    """Eager greedy answers to a conversation, each on the whole templated conversation so far."""
    conversation, answers = [], []
    for message in messages:
        conversation.append({"role": "user", "content": message})
        prompt = package.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_tensors="pt",
                                                       return_dict=True)
        with torch.no_grad():
            out = package.model.generate(**prompt, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=end_ids)
        answers.append(out[0, prompt["input_ids"].shape[1]:].tolist())
        conversation.append({"role": "assistant",
                             "content": package.tokenizer.decode(answers[-1], skip_special_tokens=True)})
    return answers


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_chat_on_the_engine_keeps_the_conversation_and_gives_eagers_answers(llm_package, capsys, monkeypatch,
                                                                            runtime):
    from hfexport.generation.chat import end_of_turn_ids

    package = llm_package("llama", runtime)
    first, second = _eager_answers(package, list(MESSAGES), end_of_turn_ids(package.tokenizer,
                                                                            package.model.generation_config))
    lines = f"{MESSAGES[0]}\n{MESSAGES[1]}\n/reset\n{MESSAGES[0]}\n/quit\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    assert main(["chat", str(package.folder), "--max-new-tokens", str(NEW_TOKENS), "--json"]) == 0
    captured = capsys.readouterr()
    turns = [json.loads(line) for line in captured.out.splitlines()]
    assert [turn["tokens"] for turn in turns] == [first, second, first]
    assert all(turn["engine"].startswith(ENGINES[runtime]) for turn in turns), turns
    assert ENGINES[runtime] in captured.err  # the banner names the engine
    # the second turn feeds only what its prompt adds to what the engine's cache holds, where the
    # conversation so far is a prefix of it (else it says why it prefilled again); /reset starts over
    if turns[1]["prefilled"] == len(turns[1]["prompt"]):
        assert "prefills the whole conversation" in captured.err
    else:
        assert turns[1]["prefilled"] <= len(turns[1]["prompt"]) - len(turns[0]["prompt"])
    assert turns[2]["prefilled"] == len(turns[2]["prompt"]) == len(turns[0]["prompt"])

    # streamed: the same answers, written as they come
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{MESSAGES[0]}\n{MESSAGES[1]}\n"))
    assert main(["chat", str(package.folder), "--max-new-tokens", str(NEW_TOKENS)]) == 0
    decoded = [package.tokenizer.decode(tokens, skip_special_tokens=True) for tokens in (first, second)]
    assert capsys.readouterr().out == "".join(f"{text}\n" for text in decoded)


def _as_version_3(folder) -> None:
    """Rewrite `folder`'s manifest as hfexport 0.4 wrote it (version 3): the runtime's package
    in its runtime's own entry (ExecuTorch's: the cache kind alone), no `runtime_package`."""
    manifest = json.loads((folder / "manifest.json").read_text())
    entry = manifest.pop("runtime_package")
    old = {"onnxruntime-genai": lambda: {"onnxruntime_genai": {"config": "genai_config.json"}},
           "LLMPipeline": lambda: {"openvino_genai": {
               "model": entry["settings"]["model"], "properties": entry["settings"]["properties"], "llm_pipeline": True,
               "tokenizer": [f for f in entry["files"] if f.startswith(("openvino_tokenizer", "openvino_detokenizer"))]}},
           "TextLLMRunner": lambda: {}}[entry["runner"]]()
    (folder / "manifest.json").write_text(json.dumps({**manifest, **old, "hfexport_manifest": 3}))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_folder_hfexport_0_4_wrote_still_drives_the_runtimes_engine(llm_package, capsys, tmp_path, runtime):
    """A version-3 manifest's runtime package (five shapes, one per runner) is read as the one
    `runtime_package` entry: the folder still opens in its runtime's engine with eager's tokens,
    and `verify --upgrade` rewrites it as version 4, which does too."""
    package = llm_package("llama", runtime)
    folder = shutil.copytree(package.folder, tmp_path / "copy")
    _as_version_3(folder)
    ids, eager = package.ids[0].tolist(), package.eager(NEW_TOKENS, stop_at_eos=True)
    got = _generate(capsys, folder, ids)
    assert got["engine"].startswith(ENGINES[runtime]) and got["tokens"] == eager, got
    assert main(["verify", str(folder), "--upgrade"]) == 0
    assert "upgraded from version 3 to 4, its runtime package written as one entry" in capsys.readouterr().out
    assert json.loads((folder / "manifest.json").read_text())["runtime_package"] == package.manifest["runtime_package"]
    assert _generate(capsys, folder, ids)["tokens"] == eager
