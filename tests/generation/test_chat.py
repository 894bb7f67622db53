"""The parts of a chat that need no export: which tokens end a turn, and how an answer's text is
streamed (`generation/chat.py`). The chat itself, on exports, is in `tests/cli/test_chat.py`."""

from __future__ import annotations

import copy

import pytest
import torch

from hfexport.generation.chat import TextStream, end_of_turn_ids

from ..gguf_files import SPECIAL_TOKENS, write_tiny_llama_gguf

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    path = write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def test_a_turn_ends_at_the_config_end_token_and_the_one_the_template_closes_a_turn_with(tokenizer):
    from transformers import GenerationConfig

    end = [SPECIAL_TOKENS.index("<|endoftext|>"), SPECIAL_TOKENS.index("<|im_end|>")]
    assert end_of_turn_ids(tokenizer, GenerationConfig(eos_token_id=0)) == end
    assert end_of_turn_ids(tokenizer, GenerationConfig(eos_token_id=[5, 0])) == [5, *end]
    # a template without a special token after the answer adds none (the tokenizer's own end token stays)
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = "{% for m in messages %}{{ m['content'] + '\n' }}{% endfor %}"
    assert end_of_turn_ids(plain, None) == [0]


def test_the_stream_writes_whole_characters_as_they_come_and_ends_with_the_decoded_answer(tokenizer):
    text = "hé, 猫!"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > len(text)  # multi-byte characters span several byte tokens
    written: list[str] = []
    stream = TextStream(tokenizer, written.append)
    stream.put(torch.tensor([[1, 2, 3]]))  # the prompt: not written
    for token in [*ids, SPECIAL_TOKENS.index("<|im_end|>")]:
        stream.put(torch.tensor([token]))
    stream.end()
    assert "".join(written) == text
    assert "\ufffd" not in "".join(written) and len(written) > 1  # piece by piece, never half a character


@pytest.mark.parametrize("text", ["one\n  two. three!\n", "a,b;c\n\n x", "猫猫 end."])
def test_the_stream_joins_into_the_decoded_answer_across_lines_and_punctuation(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    written: list[str] = []
    stream = TextStream(tokenizer, written.append)
    stream.put(torch.tensor([[1, 2, 3]]))
    for token in ids:
        stream.put(torch.tensor([token]))
    stream.end()
    assert "".join(written) == tokenizer.decode(ids, skip_special_tokens=True) == text
    assert "" not in written
