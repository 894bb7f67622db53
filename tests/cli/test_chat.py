"""GGUF in, chat out, as a user runs them: `hfexport export model.gguf --generate`, then
`hfexport generate DIR --chat MESSAGE` and `hfexport chat DIR` (stdin piped), on the tiny GGUF
written in the test (`tests/gguf_files.py`). Every answer is compared token for token with eager
`model.generate` on the chat-templated conversation, stopping at the same end-of-turn token."""

from __future__ import annotations

import io
import json

import pytest
import torch

from hfexport.cli.main import main

from ..gguf_files import FIRST_MESSAGE, SPECIAL_TOKENS, write_chat_gguf

pytest.importorskip("gguf")

IM_END = SPECIAL_TOKENS.index("<|im_end|>")
END_IDS = [SPECIAL_TOKENS.index("<|endoftext|>"), IM_END]  # the generation config's, then the template's
SECOND_MESSAGE = "what about you?"
MAX_NEW_TOKENS = 8
#: format -> static cache length (None: a dynamic cache); both kinds of cache are cut back between turns
CASES = {"dynamo": None, "onnx": 96}


@pytest.fixture(scope="module")
def chat_gguf(tmp_path_factory):
    return write_chat_gguf(tmp_path_factory.mktemp("gguf") / "tiny-chat-Q4_1.gguf")


@pytest.fixture(scope="module")
def eager(chat_gguf):
    """The model as transformers loads the GGUF, and its greedy answers to a conversation."""
    from hfexport.loading import load_model

    loaded = load_model(str(chat_gguf))

    def answers(messages: list[str]) -> list[list[int]]:
        conversation, out = [], []
        for message in messages:
            conversation.append({"role": "user", "content": message})
            prompt = loaded.tokenizer.apply_chat_template(conversation, add_generation_prompt=True,
                                                          return_tensors="pt", return_dict=True)
            with torch.no_grad():
                sequence = loaded.model.generate(**prompt, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                                 eos_token_id=END_IDS)
            tokens = sequence[0, prompt["input_ids"].shape[1]:].tolist()
            out.append(tokens)
            conversation.append({"role": "assistant",
                                 "content": loaded.tokenizer.decode(tokens, skip_special_tokens=True)})
        return out

    answers.tokenizer = loaded.tokenizer
    return answers


@pytest.fixture(scope="module", params=list(CASES))
def exported(request, chat_gguf, tmp_path_factory):
    """`hfexport export <the .gguf> --format F --generate` (a static cache for ONNX): (format, folder, stdout)."""
    fmt, static = request.param, CASES[request.param]
    out = tmp_path_factory.mktemp(f"chat-{fmt}") / "export"
    args = ["export", str(chat_gguf.parent), "--gguf-file", chat_gguf.name] if static else ["export", str(chat_gguf)]
    args += ["--format", fmt, "--generate", "-o", str(out), "--quiet"]
    if static:
        args += ["--multi-token-decode", "--static-cache", str(static)]
    with pytest.MonkeyPatch.context() as patch:
        printed = io.StringIO()
        patch.setattr("sys.stdout", printed)
        assert main(args) == 0
    return fmt, out, printed.getvalue()


@pytest.mark.slow
def test_a_gguf_export_records_its_quantization_and_carries_the_chat_files(exported):
    fmt, out, printed = exported
    assert "weights:        from GGUF tiny-chat-Q4_1.gguf (Q4_1), dequantized to float32" in printed
    manifest, report = (json.loads((out / name).read_text()) for name in ("manifest.json", "report.json"))
    assert manifest["weights_from"]["quantization"] == report["weights_from"]["quantization"] == "Q4_1"
    assert manifest["weights_from"]["tensor_types"] == {"Q4_1": 14, "F32": 6, "Q8_0": 1}
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (out / name).is_file(), name
    assert "quantization_config" not in json.loads((out / "config.json").read_text())  # weights are float32 now


@pytest.mark.slow
def test_generate_chat_answers_like_eager_and_stops_at_the_template_end_token(exported, eager, capsys):
    fmt, out, _ = exported
    assert main(["generate", str(out), "--chat", FIRST_MESSAGE, "--max-new-tokens", str(MAX_NEW_TOKENS),
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    (expected,) = eager([FIRST_MESSAGE])
    # the model ends this answer with <|im_end|>, which only the chat template names (the config says <|endoftext|>)
    assert expected[-1] == IM_END and len(expected) < MAX_NEW_TOKENS
    assert result["tokens"] == expected and result["stopped_at_eos"]
    assert result["text"] == eager.tokenizer.decode(expected, skip_special_tokens=True)


@pytest.mark.slow
def test_chat_keeps_the_conversation_and_its_cache_across_turns(exported, eager, capsys, monkeypatch):
    fmt, out, _ = exported
    first, second = eager([FIRST_MESSAGE, SECOND_MESSAGE])
    lines = f"{FIRST_MESSAGE}\n{SECOND_MESSAGE}\n/reset\n{FIRST_MESSAGE}\n/quit\nnever read\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    assert main(["chat", str(out), "--max-new-tokens", str(MAX_NEW_TOKENS), "--json"]) == 0
    turns = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [turn["tokens"] for turn in turns] == [first, second, first]
    # the second turn feeds only what its prompt adds to the first turn's, which stays in the cache (of
    # the answer, the tokens its text re-encodes to: a random model's bytes are no valid UTF-8, so they
    # come back as other tokens); after /reset the whole prompt is fed again
    assert turns[1]["prefilled"] <= len(turns[1]["prompt"]) - len(turns[0]["prompt"])
    assert turns[2]["prefilled"] == len(turns[2]["prompt"]) == len(turns[0]["prompt"])

    # streamed: the same answers, written as they come; the end of input ends the chat
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{FIRST_MESSAGE}\n{SECOND_MESSAGE}\n"))
    assert main(["chat", str(out), "--max-new-tokens", str(MAX_NEW_TOKENS)]) == 0
    captured = capsys.readouterr()
    decoded = [eager.tokenizer.decode(tokens, skip_special_tokens=True) for tokens in (first, second)]
    assert captured.out == "".join(f"{text}\n" for text in decoded)
    assert "prefills the whole conversation" not in captured.err


@pytest.mark.slow
def test_an_answer_that_fills_the_static_cache_says_so_and_the_chat_goes_on(tmp_path, capsys, monkeypatch):
    """`tiny:llama` (random weights: it never ends a turn) with a 48-token cache: the first answer is
    cut where the cache ends and says so and how to go on; the next turn, which cannot fit, is one
    error line and the chat continues; /reset starts over."""
    cache = 48
    out = tmp_path / "export"
    assert main(["export", "tiny:llama", "-f", "onnx", "--static-cache", str(cache), "-o", str(out), "--quiet"]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\nand again\n/reset\nhello\n"))
    capsys.readouterr()
    assert main(["chat", str(out), "--max-new-tokens", "1000", "--json"]) == 0
    captured = capsys.readouterr()
    turns = [json.loads(line) for line in captured.out.splitlines()]
    assert len(turns) == 2  # the first turn, and the first turn again after /reset; the second did not fit
    for turn in turns:
        assert not turn["stopped_at_eos"] and len(turn["prompt"]) + len(turn["tokens"]) == cache + 1
    err = captured.err.splitlines()
    full = f"hfexport: the answer stopped where the export's static cache ends ({cache} tokens); /reset starts"
    assert sum(line.startswith(full) for line in err) == 2
    assert sum(f"the export's static cache holds {cache}" in line for line in err) == 1  # the second turn's
