"""The runtime's own LLM engine driving `hfexport generate` and `chat` on a runtime's LLM package.

```python
runner = GenerationRunner.load("out/llama")              # engine="auto": og.Generator on an onnxruntime-genai folder
runner.generate([1, 2, 3], max_new_tokens=16).engine     # 'onnxruntime-genai 0.18.0'
GenerationRunner.load("out/llama", engine="hfexport")    # hfexport's own loop (`loop.py`), as before
```

# NOTE: why drive the vendor's engine rather than speed up our loop further. On the same folder,
# onnxruntime-genai's `og.Generator`, OpenVINO GenAI's `LLMPipeline` and ExecuTorch's `TextLLMRunner`
# run their decode loop in C++ (bench/RESULTS.md "Our runner vs the vendor's runner": our Python
# loop lost 27-66% of tokens/s to them), and the export job's runner check already proved each
# engine gives eager's greedy tokens on the folder. So where the folder is a runtime's LLM package
# and the engine is installed, `engine="auto"` (the default) runs the engine, and hfexport keeps
# what it owns: the prompt's ids, the chat template and its end-of-turn tokens, the conversation
# (which tokens the engine's cache holds, `EngineConversation`), streaming and the result's fields.
#
# The engines run greedy decoding only, with `max_new_tokens`, the stop tokens and (where the
# engine masks the stop tokens as `generate()`'s `min_new_tokens` does) `min_new_tokens`. Sampling,
# a repetition penalty, forced tokens and per-step logits run hfexport's loop: the engines'
# samplers draw other tokens than torch's from the same `--seed`, so "the same options" would not
# mean the same tokens. Under `engine="auto"` the result says which ran and why
# (`GenerationResult.engine`, `.engine_reason`); `engine="runtime"` refuses instead
# (`EngineRefused`). A generation that may run past the engine's cache runs our loop too, which
# says where the cache ends.
#
# Trust (docs/trust.md): every engine opens files by path, so each is given a private folder of
# the checked bytes (links to the private copies the component's load already made, files written
# from the checked bytes, the model the load read serialized again), never the export folder;
# OpenVINO GenAI takes its tokenizer from memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import RuntimeLoadError

__all__ = ["ENGINE_CHOICES", "HFEXPORT", "EngineRequest", "EngineConversation", "LlmEngine", "EngineRefused",
           "loop_reason", "fits", "open_engine", "engine_request", "route", "run_on_engine"]

#: `engine=` / `--engine`: the runtime's engine where it can run (auto), always it (runtime), or our loop
ENGINE_CHOICES = ("auto", "runtime", "hfexport")
#: `GenerationResult.engine` of hfexport's own loop
HFEXPORT = "hfexport"


class EngineRefused(RuntimeLoadError):
    """`engine="runtime"` was asked and the runtime's engine cannot run this folder or these options."""


@dataclasses.dataclass(frozen=True)
class EngineRequest:
    """A greedy generation asked of an engine: at most `max_new_tokens`, stopping after any of
    `eos` (empty: never), with no stop token before `min_new_tokens` (their logits masked, as
    `generate()`'s `min_new_tokens`)."""

    max_new_tokens: int
    min_new_tokens: int = 0
    eos: tuple[int, ...] = ()


class EngineConversation(Protocol):
    """One sequence in an engine's cache, continued turn after turn (a chat) or generated once.

    Attributes:
        fed: the tokens whose keys and values the engine's cache holds, in order (the last
            generated token is never fed until the next turn feeds it).
        first_token_at: when the last `generate` chose its first token (`time.perf_counter()`).
    """

    fed: list[int]
    first_token_at: float | None

    def continuation(self, ids: list[int], request: EngineRequest) -> int | str:
        """How many of the first tokens of `ids` (the whole sequence of the next turn) the cache
        keeps for it (0: it starts over), or why this conversation cannot go on to `ids` (the
        caller starts a new one)."""

    def generate(self, ids: list[int], keep: int, request: EngineRequest,
                 on_token: Callable[[int], Any] | None) -> list[int]:
        """Feed `ids[keep:]` after the `keep` tokens kept (`continuation`), generate as `request`
        asks, calling `on_token` with each new token as it comes (where given: a streamer's,
        which may cost the engine a callback per token), and return the new tokens."""


class LlmEngine(Protocol):
    """A runtime's own LLM engine opened on a private copy of a package's checked files."""

    #: the engine and its version, as results name it ("onnxruntime-genai 0.18.0")
    name: str
    #: how many tokens a sequence may hold in its cache (None: no bound)
    capacity: int | None

    def refusal(self, request: EngineRequest, ids: list[int]) -> str | None:
        """Why this engine cannot run `request` after the sequence `ids` as `generate()` would, or None."""

    def conversation(self, *, keep: bool) -> EngineConversation:
        """A new sequence; `keep`: one a chat continues (sized for the whole cache)."""


def loop_reason(config: Any, *, output_logits: bool = False, encoder_inputs: bool = False) -> str | None:
    """Why a generation with the generation config `config` needs hfexport's loop rather than a
    runtime's greedy engine, or None."""
    if config.do_sample:
        return ("sampling (do_sample) runs hfexport's loop: the runtimes' samplers draw other tokens than "
                "transformers' from the same seed")
    if config.repetition_penalty is not None and config.repetition_penalty != 1.0:
        return "a repetition penalty runs hfexport's loop (transformers' RepetitionPenaltyLogitsProcessor)"
    if any(getattr(config, name, None) is not None for name in ("forced_bos_token_id", "forced_eos_token_id")):
        return "forced first or last tokens run hfexport's loop"
    if any(getattr(config, name, None) is not None for name in ("suppress_tokens", "begin_suppress_tokens")):
        return "suppressed tokens (suppress_tokens, begin_suppress_tokens) run hfexport's loop"
    if output_logits:
        return "per-step logits (output_logits) come from hfexport's loop"
    if encoder_inputs:
        return "image or audio inputs run hfexport's loop"
    return None


def fits(engine: LlmEngine, length: int, request: EngineRequest) -> str | None:
    """Why a sequence of `length` tokens with `request.max_new_tokens` more may outgrow `engine`'s
    cache (hfexport's loop then runs it, and says where the cache ends), or None."""
    if request.max_new_tokens < 1:
        return "no new token is asked for"
    if engine.capacity is not None and length + request.max_new_tokens > engine.capacity:
        return (f"{length} tokens and up to {request.max_new_tokens} new ones may not fit the engine's cache of "
                f"{engine.capacity}: hfexport's loop runs it and says where the cache ends")
    return None


def open_engine(export: Any, choice: str) -> tuple[LlmEngine | None, str | None]:
    """The runtime's engine on `export` (a `GenerationExport`) as `choice` (`ENGINE_CHOICES`) asks:
    `(engine, None)`, or `(None, why hfexport's loop runs)` (`None` reason for `"hfexport"`).

    Raises:
        EngineRefused: `choice` is `"runtime"` and the folder has no engine here.
        ValueError: `choice` is not one of `ENGINE_CHOICES`.
    """
    from ..auto import AutoHfExporter
    from .package import RunnerUnavailable

    if choice not in ENGINE_CHOICES:
        raise ValueError(f"engine={choice!r}: one of {', '.join(ENGINE_CHOICES)}")
    if choice == HFEXPORT:
        return None, None
    try:
        # the format's engine, whatever the folder's task: it refuses a folder that is not its package
        return AutoHfExporter.from_format(export.format).runtime_package().open_engine(export), None
    except RunnerUnavailable as error:
        if choice == "runtime":
            raise EngineRefused(f"{export.directory} cannot run in its runtime's own engine: {error.why}",
                                remedy="drop --engine runtime (engine='auto' runs hfexport's loop on it)") from None
        return None, error.why


def engine_request(config: Any) -> EngineRequest:
    """The `EngineRequest` of a generation config (`GenerationRunner.generation_config`)."""
    from ..generation.result import as_token_list

    return EngineRequest(int(config.max_new_tokens), int(config.min_new_tokens or 0),
                         tuple(as_token_list(config.eos_token_id)))


def route(runner: Any, config: Any, ids: list[int], *, output_logits: bool = False,
          encoder_inputs: bool = False) -> tuple[EngineRequest | None, str | None]:
    """Where `runner` (a `GenerationRunner`) runs a generation of `config` after the sequence `ids`:
    `(request, None)` on its engine, or `(None, why hfexport's loop runs it)` (`None` where the loop
    was asked for).

    Raises:
        EngineRefused: the runner was opened with `engine="runtime"` and the engine cannot run it.
    """
    if runner.engine is None:
        return None, runner.engine_reason
    request = engine_request(config)
    why = (loop_reason(config, output_logits=output_logits, encoder_inputs=encoder_inputs)
           or runner.engine.refusal(request, ids) or fits(runner.engine, len(ids), request))
    if why is None:
        return request, None
    if runner.engine_choice == "runtime":
        raise EngineRefused(f"{runner.engine.name} cannot run this generation as asked: {why}",
                            remedy="drop --engine runtime (engine='auto' runs hfexport's loop for it), or drop the "
                                   "option it names")
    return None, why


def run_on_engine(runner: Any, conversation: EngineConversation, ids: list[int], keep: int,
                  request: EngineRequest, *, streamer: Any = None, start: float | None = None) -> Any:
    """Generate on `conversation` (of `runner.engine`) after the sequence `ids`, of which its cache
    keeps the first `keep`; return a `GenerationResult` as hfexport's loop fills it (`streamer` fed
    as `generate()` feeds one: the prompt, then each token, then `end`)."""
    import time

    import torch

    from ..generation.result import GenerationResult

    start = time.perf_counter() if start is None else start
    on_token = None
    if streamer is not None:
        streamer.put(torch.tensor([ids]))

        def on_token(token: int) -> None:
            streamer.put(torch.tensor([token]))

    tokens = conversation.generate(ids, keep, request, on_token)
    if streamer is not None:
        streamer.end()
    end = time.perf_counter()
    first = conversation.first_token_at or end
    decoded = len(tokens) - 1

    def text(export=runner.export, tokens=tuple(tokens)) -> str | None:
        tokenizer = export.tokenizer
        return tokenizer.decode(list(tokens), skip_special_tokens=True) if tokenizer is not None else None

    return GenerationResult(tokens=list(tokens), prompt=list(ids), time_to_first_token_s=first - start,
                            tokens_per_s=decoded / (end - first) if decoded > 0 and end > first else float("nan"),
                            _text=text, stopped_at_eos=bool(tokens) and tokens[-1] in request.eos,
                            engine=runner.engine.name)
