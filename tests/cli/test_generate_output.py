"""What `hfexport generate` prints: the text where the export holds a tokenizer (the ids too with `--ids`,
everything with `--json`), the ids where it holds none, saying so; and the remedy `chat` gives on a folder
without a tokenizer runs."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from hfexport.cli import generate
from hfexport.cli.main import main

pytestmark = pytest.mark.slow

GENERATE = ["--max-new-tokens", "4", "--min-new-tokens", "4"]


@pytest.fixture(scope="module")
def with_tokenizer(exported_by_cli):
    """A generation export (dynamo) of tiny:llama, which carries a tokenizer and a chat template
    (`hfexport export tiny:llama --generate`, shared with tests/test_output_folder.py)."""
    return exported_by_cli("tiny:llama", "--generate")


@pytest.fixture(scope="module")
def without_tokenizer(exported_by_cli):
    """A generation export (dynamo) of tiny:qwen3, which has no tokenizer (tiny:llama has one)
    (`hfexport export tiny:qwen3 --generate`, shared with tests/cli/test_cli.py)."""
    return exported_by_cli("tiny:qwen3", "--generate")


def _generated(capsys, *args: str) -> list[str]:
    capsys.readouterr()
    assert main(["generate", *args]) == 0
    return capsys.readouterr().out.splitlines()


def test_with_a_tokenizer_generate_prints_the_text_and_the_ids_only_when_asked(with_tokenizer, capsys):
    as_json = json.loads(_generated(capsys, str(with_tokenizer), "--prompt", "hello world", *GENERATE, "--json")[0])
    text = _generated(capsys, str(with_tokenizer), "--prompt", "hello world", *GENERATE)
    assert text[0] == f"text:   {as_json['text']}" and len(text) == 2
    assert text[1].startswith("dynamo: time to first token ")
    with_ids = _generated(capsys, str(with_tokenizer), "--prompt", "hello world", *GENERATE, "--ids")
    assert with_ids[:2] == [f"text:   {as_json['text']}", f"tokens: {','.join(map(str, as_json['tokens']))}"]


def test_without_a_tokenizer_generate_prints_the_ids_saying_why(without_tokenizer, capsys):
    printed = _generated(capsys, str(without_tokenizer), "--prompt-ids", "5,17,42", *GENERATE, "--json")
    tokens = ",".join(map(str, json.loads(printed[0])["tokens"]))
    printed = _generated(capsys, str(without_tokenizer), "--prompt-ids", "5,17,42", *GENERATE)
    assert printed[0] == f"tokens: {tokens} ({without_tokenizer} holds no tokenizer to turn them into text)"
    assert not [line for line in printed if line.startswith("text:")]


def test_chat_without_a_tokenizer_gives_a_remedy_that_runs(without_tokenizer, capsys):
    capsys.readouterr()
    assert main(["chat", str(without_tokenizer)]) == 1
    err = capsys.readouterr().err
    assert "holds no tokenizer, so a chat cannot be templated" in err and "--prompt TEXT" not in err
    command = re.search(r"`hfexport (generate [^`]+)`", err)
    assert command, err
    assert main([*shlex.split(command[1]), *GENERATE]) == 0
    assert capsys.readouterr().out.startswith("tokens: ")


def test_a_prompt_that_ends_at_once_on_a_chat_model_says_to_chat(with_tokenizer, capsys):
    """SmolLM2-Instruct answers a bare `--prompt` with its end token: the empty text gets a hint, and
    the hint's remedy runs; a longer answer, a `--chat` turn and an image prompt (`--chat` takes no image) get none."""
    from types import SimpleNamespace

    from hfexport.generation.loop import GenerationRunner
    from hfexport.generation.result import GenerationResult

    runner = GenerationRunner.load(with_tokenizer)
    end = runner.export.tokenizer.eos_token_id
    args = SimpleNamespace(export_dir=str(with_tokenizer), ids=False, chat=None, image=None, image_inputs=None,
                           audio=None, audio_inputs=None)

    def printed(tokens, **changes):
        result = GenerationResult(tokens=tokens, prompt=[5, 6], time_to_first_token_s=0.01, tokens_per_s=50.0 if tokens[1:] else float("nan"),
                                  stopped_at_eos=tokens[-1] == end, _text="")
        return generate.result_lines(SimpleNamespace(**{**vars(args), **changes}), runner, result)

    ended = printed([end])
    assert ended[0] == "text:   " and "ask with --chat MESSAGE" in ended[1]
    assert ended[2].endswith("time to first token 10.0 ms, no decode steps")
    assert not any("--chat" in line for line in printed([7, end]) + printed([end], chat="hi"))
    # --chat takes no image: an image prompt that ends at once gets no remedy that would be refused
    assert not any("--chat" in line for line in printed([end], image="cat.png") + printed([end], image_inputs="x.npz"))
    assert printed([7, end])[-1].endswith("50.0 tokens/s over 1 decode steps")
    chatted = _generated(capsys, str(with_tokenizer), "--chat", "hello", *GENERATE)
    assert chatted[0].startswith("text:") and len(chatted) == 2
