"""`ChatSession`: a conversation with a generation export, through the chat template saved with it.

```python
from hfexport import GenerationRunner
from hfexport.generation.chat import ChatSession

chat = ChatSession(GenerationRunner.load("out/smollm2"))
chat.send("What is the capital of France?").text      # 'The capital of France is Paris.'
chat.send("And of Italy?")                             # the first turn stays in the conversation
```

Each turn applies the template to the whole conversation (`add_generation_prompt=True`), so the
tokens are those eager `model.generate` would produce on `apply_chat_template(messages)`, and
generation stops at the model's end-of-turn tokens: the generation config's end tokens, the
tokenizer's, and the token the chat template closes an assistant turn with (`<|im_end|>`,
`<|eot_id|>`, `<end_of_turn>`), which a model's generation config often lacks.

# NOTE: the cache is kept between turns rather than prefilling the conversation again: the next
# turn's tokens start with those the cache holds (the last answer's last token aside, and the
# template's end-of-turn text after it), so the cache is cut back to the longest common prefix
# (`DecodeState.rewind`) and only the rest is fed. A static cache is cut back by resetting its write
# counters, a dynamic one by slicing its keys and values; a cache that cannot be cut back to a token
# (a sliding window that has rolled over, a recurrent state) prefills the whole conversation again,
# and `reprefill_reason` says why. On a runtime's LLM package the turns run on the runtime's own
# engine (`engine.py`), whose conversation (`engine.EngineConversation`) keeps its cache the same
# way where the engine can cut it back (onnxruntime-genai), or goes on only after what it holds
# (`LLMPipeline`'s chat, `TextLLMRunner`) and else prefills again, saying why; a turn the engine
# cannot run as asked runs hfexport's loop on a new state (and back).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from transformers import TextStreamer

from ..errors import ExportError
from ..folder.engine import route, run_on_engine
from .loop import DecodeState, GenerationRunner
from .result import GenerationResult, as_token_list

__all__ = ["ChatSession", "TextStream", "end_of_turn_ids"]

logger = logging.getLogger(__name__)
_SENTINEL = "hfexport-answer-sentinel"


def end_of_turn_ids(tokenizer: Any, generation_config: Any = None) -> list[int]:
    """The tokens that end a model's turn: the generation config's end tokens, the tokenizer's
    end token, and the special token the chat template writes right after an assistant message."""
    ids = [*as_token_list(getattr(generation_config, "eos_token_id", None)),
           *as_token_list(getattr(tokenizer, "eos_token_id", None))]
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _SENTINEL}], tokenize=False)
    except Exception as error:  # noqa: BLE001 - a template's own checks (roles, alternation) raise anything
        logger.warning("the chat template did not render a sample assistant turn (%s); turns end at the "
                       "generation config's and the tokenizer's end tokens only", error)
        text = ""
    if _SENTINEL in text:
        after = tokenizer(text.split(_SENTINEL, 1)[1], add_special_tokens=False)["input_ids"]
        special = getattr(tokenizer, "added_tokens_decoder", {})
        if after and (after[0] in special and special[after[0]].special or after[0] in tokenizer.all_special_ids):
            ids.append(after[0])
    return list(dict.fromkeys(ids))


class TextStream(TextStreamer):
    """`transformers.TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)` that hands
    each piece of the answer's text to `write` instead of printing it, with no newline at the end.

    Its pieces join into `tokenizer.decode(answer, skip_special_tokens=True)`: a piece goes out as
    soon as it is letters, digits or spaces (or a CJK character); punctuation and a character whose
    bytes are still coming wait for the next space or the end, and a newline keeps the token before
    it as context for the next line's leading space.
    """

    def __init__(self, tokenizer: Any, write: Callable[[str], Any]):
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
        self.write = write

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        """Hand `text` to `write` (the caller ends the answer's line, not the stream's end)."""
        if text:
            self.write(text)


class ChatSession:
    """A conversation with the export `runner` drives (see the module docstring).

    Args:
        runner: a `GenerationRunner` of a decoder-only generation export saved with a tokenizer
            that has a chat template.
        system: a system message to start the conversation with.

    Attributes:
        messages: the conversation so far (`{"role", "content"}` dicts).
        end_ids: the tokens a turn stops at (`end_of_turn_ids`).
        reprefill_reason: why the last turn prefilled the whole conversation again instead of
            reusing the cache (None while it reuses it).
        prefilled: how many of the last turn's prompt tokens were fed (the rest came from the cache).
        cache_full: whether the last answer stopped because a static cache was full, not at an
            end of turn (the next turn will not fit: `reset`).
    """

    def __init__(self, runner: GenerationRunner, *, system: str | None = None):
        tokenizer = runner.export.tokenizer
        folder = runner.export.directory
        if runner.is_speech:  # before the template: its remedy (a text prompt) is refused on a speech export too
            raise ExportError(f"{folder} is a speech export: it transcribes audio, it does not chat",
                              remedy=f"`hfexport generate {folder} --audio FILE` transcribes a wav or flac file")
        # what runs on this folder without a chat template: text where it has a tokenizer, else token ids
        instead = (f"`hfexport generate {folder} --prompt TEXT` generates from raw text" if tokenizer is not None
                   else f"`hfexport generate {folder} --prompt-ids 1,2,3` generates from token ids")
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            what = "no tokenizer" if tokenizer is None else "a tokenizer without a chat template"
            raise ExportError(f"{folder} holds {what}, so a chat cannot be templated",
                              remedy=f"{instead}; for a chat, export from a model folder (or GGUF file) whose "
                              "tokenizer has a chat template")
        if "encoder" in runner.runners:
            raise ExportError(f"{folder} is an encoder-decoder export; a chat drives decoder-only models",
                              remedy=instead)
        self.runner, self.tokenizer = runner, tokenizer
        self.system = system
        self.messages: list[dict[str, str]] = []
        self.end_ids = end_of_turn_ids(tokenizer, runner.export.generation_config)
        self.reprefill_reason: str | None = None
        self.prefilled = 0
        #: whether the last answer stopped because the static cache was full (`send`)
        self.cache_full = False
        self._state: DecodeState | None = None
        self._conversation: Any = None  # the runtime engine's (`engine.EngineConversation`), where it runs the turns
        self.reset()

    def reset(self) -> None:
        """Start a new conversation (the system message kept)."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self._state = None
        self._conversation = None

    def prompt_ids(self, message: str) -> list[int]:
        """The token ids of the conversation with `message` as the next user turn, templated
        with `add_generation_prompt=True` (what eager `generate` is given)."""
        messages = [*self.messages, {"role": "user", "content": message}]
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                       return_dict=False))

    def send(self, message: str, max_new_tokens: int = 256, *, streamer: Any = None,
             **options: Any) -> GenerationResult:
        """Add `message` as the user's turn, generate the answer (stopping at an end-of-turn
        token, or after `max_new_tokens`; fewer where a static cache has less room) and add it
        to the conversation; return it (`text` is the answer).

        Args:
            streamer: as `GenerationRunner.generate`'s (`TextStream` writes the text as it comes).
            options: `generate`'s sampling options (`do_sample`, `temperature`, `top_k`, `top_p`,
                `repetition_penalty`, `min_new_tokens`, `seed`).
        """
        ids = self.prompt_ids(message)
        room = self._room(len(ids))
        max_new_tokens = min(max_new_tokens, room)
        seed = options.pop("seed", None)
        config = self.runner.generation_config(max_new_tokens, eos_token_id=self.end_ids, **options)
        request, why = route(self.runner, config, ids)
        if request is not None:
            result = self._send_on_engine(ids, request, streamer)
        else:
            state, new_ids = self._continued(ids)
            self._state = None  # a turn that fails leaves no half-fed cache behind
            result = self.runner._generate_on(state, torch.tensor([new_ids]), torch.tensor([ids]), config, seed=seed,
                                              streamer=streamer)
            self._state, self.prefilled = state, len(new_ids)
            result.engine_reason = why
        # the answer ran into the end of a static cache, not to an end of turn: the next turn cannot fit
        self.cache_full = len(result.tokens) >= room and not (result.tokens and result.tokens[-1] in self.end_ids)
        answer = self.tokenizer.decode(result.tokens, skip_special_tokens=True)
        self.messages += [{"role": "user", "content": message}, {"role": "assistant", "content": answer}]
        return result

    def _send_on_engine(self, ids: list[int], request: Any, streamer: Any) -> GenerationResult:
        """The turn on the runtime's engine (`engine.py`), in the conversation it holds where that
        conversation goes on to `ids` (else a new one, `reprefill_reason` saying why)."""
        conversation, keep = self._conversation, 0
        if conversation is None and self._state is not None:
            self.reprefill_reason = "the last turn ran hfexport's loop, whose cache the runtime's engine does not hold"
        elif conversation is not None:
            keep = conversation.continuation(ids, request)
            if isinstance(keep, str):
                self.reprefill_reason, conversation, keep = keep, None, 0
        if conversation is None:
            conversation = self.runner.engine.conversation(keep=True)
        self._state = self._conversation = None  # a turn that fails leaves no half-fed cache behind
        result = run_on_engine(self.runner, conversation, ids, keep, request, streamer=streamer)
        self._conversation, self.prefilled = conversation, len(ids) - keep
        return result

    def _room(self, prompt_length: int) -> int:
        """How many tokens a static cache leaves for the answer (the last one is never fed back)."""
        capacity = self.runner.max_cache_len if self.runner.static else None
        if capacity is None:
            return 1 << 30
        if prompt_length >= capacity:
            raise ExportError(f"the conversation is {prompt_length} tokens; the export's static cache holds "
                              f"{capacity}", remedy="start a new conversation (/reset in `hfexport chat`), or export "
                              "with a larger --static-cache")
        return capacity - prompt_length + 1

    def _continued(self, ids: list[int]) -> tuple[DecodeState, list[int]]:
        """The state to generate on and the tokens to feed it: the kept state cut back to the
        longest prefix it shares with `ids`, or a new one that prefills all of `ids`."""
        state = self._state
        if state is None and self._conversation is not None:
            self.reprefill_reason = ("the last turn ran on the runtime's engine, whose cache hfexport's loop does "
                                     "not hold")
            self._conversation = None
        if state is not None:
            shared = 0
            for held, new in zip(state.fed, ids):
                if held != new:
                    break
                shared += 1
            keep = min(shared, len(ids) - 1)  # at least one token is fed: its logits pick the first answer token
            reason = state.rewind(keep) if keep else "the conversation shares no tokens with the last one"
            if reason is None:
                return state, ids[keep:]
            self.reprefill_reason = reason
        return DecodeState(self.runner, torch.tensor([ids]), None, {}), ids
