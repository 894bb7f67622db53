"""How close a saved generation export stays to fp32 eager `generate`, over many tokens.

A per-output cosine on one sample says little about a quantized LLM: what its users see is
whether the tokens stay the ones the fp32 model picks. `greedy_agreement` runs eager `generate`
greedily for `new_tokens`, then feeds the export the same tokens (teacher forcing,
`GenerationRunner.score`) and compares step by step: the share of steps whose greedy token is
eager's (`agreement`) and the cosine of each step's logits with eager's. Teacher forcing keeps
one near-tie from counting as a miss at every later step.

`quantized_criteria(scheme)` are what the export job holds a quantized export to, set from the
measurements below; `default_min_agreement` is its agreement floor.

# The criteria, measured on a real LLM

SmolLM2-135M-Instruct (30 layers, `bench/quant_criteria.py`, the table in `bench/RESULTS.md`),
exported with a static cache of 512 as the README's recipe does. ONNX `int4-weights`: the logits'
cosine with eager is 0.9991 in every validation case (max abs difference 3.8, which is why a
quantized export is not judged by it), while single cache tensors fall to 0.965 (layer 13's
values); teacher-forced, its greedy tokens are eager's on 0.70-0.78 of 64 steps over the sample
and the chat prompts, the steps' logits cosine 0.84-0.86 on average (a step's whole 49152-word
vector, tail included; the top-10 overlap 0.68-0.74), and it answers the chat prompts correctly.
ONNX `int8-dynamic`: logits 0.9998, cache 0.996, agreement 0.80-0.92, steps' cosine 0.94-0.96.
OpenVINO `int4-weights` (ratio 0.8): agreement 0.69-0.88, steps' cosine 0.85-0.92. The floors
(`INT4_CRITERIA`, `INT8_CRITERIA`) sit 0.1 under the lowest prompt's agreement and 0.04-0.1
under its steps' cosine. A broken int4 quantizer (each block's scale off by a random factor,
lognormal sigma 0.3, or taken from its neighbour) loses the logits first: on the tiny Llama
their cosine falls from 0.996 to 0.955 and 0.13, its greedy agreement from 0.94 to 0.44 and 0.0;
on SmolLM2 the random factor alone takes the agreement to 0.00 on every prompt (mean step cosine
-0.23; logits -0.58 in validation).

The default export (`--generate`, a dynamic cache: prefill + decode) showed why validation's
floors cannot be what refuses a quantized generation export of a real LLM: there the prefill's
logits are one position per sequence, and a correct int4 quantization puts that position's cosine
anywhere from 0.99 down to -0.23 (eager PyTorch, the same round-to-nearest int4, over a chat
prompt): SmolLM2's sample prompt gives 0.95, random tokens at batch 3 give 0.32, one cache tensor
0.59, while the same export's teacher-forced steps agree with eager on 0.80 (sample) and 0.73-0.74
(chat prompts) at a mean step cosine of 0.85, and it answers the chat prompts. So where the gate
runs, the export job makes validation's default cosine floors advisory (measured and reported,
`validation`'s docstring) and the gate's floors refuse; a floor the caller gives binds validation
again (`JudgingOptions(min_cosine=...)`).

A random-weight model shows something else: its logits are nearly flat, so a near-tie flips the
greedy token at any step and the agreement says little (int4 on the 134 MB random Llama of
`bench/decode.py` agrees on 0.30-0.58 of the steps; a correct int8 export of the 2.1M-parameter
tiny Llama on 0.83-1.0, int4 on 0.85-1.0), while its cosines stay high (the tiny one's logits
0.996 int4, 0.9999 int8). A tiny model in the test suite passes these floors with a correct
quantizer; where a test's point is elsewhere (calibration on one prompt) it lowers the agreement
floor itself (`min_agreement=`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

__all__ = ["AccuracyReport", "QuantizedCriteria", "INT8_CRITERIA", "INT4_CRITERIA", "INT8_DYNAMIC_INT4_CRITERIA",
           "greedy_agreement", "quantized_criteria", "default_min_agreement", "edit_distance", "DEFAULT_TOKENS"]

#: Steps compared by default (fewer when a static cache holds fewer after the prompt).
DEFAULT_TOKENS = 64
#: The candidates `top_k_overlap` compares per step (eager's best TOP_K against the export's).
TOP_K = 10


@dataclasses.dataclass
class AccuracyReport:
    """The export's greedy tokens and logits against fp32 eager, step by step."""

    tokens: int  # steps compared
    agreement: float  # share of steps whose greedy token is eager's
    min_cosine: float  # the lowest per-step logits cosine
    mean_cosine: float
    first_difference: int | None  # the first step whose greedy token differs, if any
    min_agreement: float | None = None  # the floor it was held to
    top_k_overlap: float | None = None  # mean share of eager's TOP_K tokens among the export's, per step
    min_mean_cosine: float | None = None  # the floor `mean_cosine` was held to
    clips: int | None = None  # a speech model's: the clips whose steps are pooled
    token_error_rate: float | None = None  # a speech model's: its free-running tokens' edit distance from eager's

    @property
    def passed(self) -> bool:
        """Whether the agreement and the mean logits cosine reach their floors (no floor: passed)."""
        return ((self.min_agreement is None or self.agreement >= self.min_agreement)
                and (self.min_mean_cosine is None or self.mean_cosine >= self.min_mean_cosine))

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-able dict (with `passed`)."""
        return {**dataclasses.asdict(self), "passed": self.passed}


@dataclasses.dataclass(frozen=True)
class QuantizedCriteria:
    """What a quantized export must reach against fp32 eager to be written (see the module docstring).

    Validation (`hfexport.validate`, each component at the sample and other sizes):
    `min_cosine` for the logits (every output a caller reads), `min_cache_cosine` for each cache
    tensor. The accuracy gate (`greedy_agreement` over the sample prompt of a generation export):
    `min_agreement` for the share of teacher-forced greedy tokens equal to eager's,
    `min_mean_cosine` for the mean of the steps' logits cosines (each step's vector on its own,
    where validation's cosine runs over every position at once and the largest logits weigh most).
    """

    min_cosine: float
    min_cache_cosine: float
    min_agreement: float
    min_mean_cosine: float


#: Per family of schemes; a scheme with `int4` in its name is judged as int4, any other as int8, a
#: custom quantizer as int4; int4 weights with int8 dynamic activations (ExecuTorch's 8da4w) on
#: their own (`INT8_DYNAMIC_INT4_CRITERIA`).
INT8_CRITERIA = QuantizedCriteria(min_cosine=0.995, min_cache_cosine=0.95, min_agreement=0.7, min_mean_cosine=0.9)
INT4_CRITERIA = QuantizedCriteria(min_cosine=0.99, min_cache_cosine=0.9, min_agreement=0.6, min_mean_cosine=0.75)
#: 8da4w's logits over a whole prompt at once are further from fp32's than weight-only int4's, where
#: its steps are not: on SmolLM2-135M-Instruct the ExecuTorch program's validation measured a logits
#: cosine of 0.828 (ONNX's weight-only int4: 0.9991), and torchao's 8da4w in eager 0.967 on the
#: sample prompt and 0.768 on a 10-token sentence whose positions 3-6 fall to cosine -0.01-0.35
#: (per-token int8 activations on those positions' inputs), while its teacher-forced steps over
#: nine chat answers agree 0.56-0.75 (mean 0.66) with a mean step cosine of 0.85, as weight-only
#: int4's (0.70-0.78, 0.84; `bench/RESULTS.md`, `bench/int4_options.py`). So its logits floor sits
#: under those measurements; the steps' floors, which a broken quantizer misses, stay int4's.
INT8_DYNAMIC_INT4_CRITERIA = dataclasses.replace(INT4_CRITERIA, min_cosine=0.7)


def quantized_criteria(quantize: Any) -> QuantizedCriteria | None:
    """The criteria a quantized export is held to by default (`QuantizedCriteria`), from its scheme
    (a name or a quantizer's `scheme`); `None` unquantized (the fp32 tolerance applies)."""
    if not quantize:
        return None
    scheme = quantize if isinstance(quantize, str) else getattr(quantize, "scheme", "")
    if scheme == "int8-dynamic-int4-weights":
        return INT8_DYNAMIC_INT4_CRITERIA
    return INT8_CRITERIA if scheme.startswith("int8") and "int4" not in scheme else INT4_CRITERIA


def default_min_agreement(quantize: Any) -> float | None:
    """The agreement floor of a quantized export (`quantized_criteria(quantize).min_agreement`);
    `None` (no floor) unquantized."""
    criteria = quantized_criteria(quantize)
    return criteria.min_agreement if criteria else None


def greedy_agreement(directory: str | Path, model: torch.nn.Module, prompt: dict[str, Any], *,
                     generation_config: Any = None, new_tokens: int = DEFAULT_TOKENS,
                     min_agreement: float | None = None, min_mean_cosine: float | None = None,
                     verify: bool = True, extractor: Any = None) -> AccuracyReport:
    """Compare the generation export in `directory` with `model` (fp32 eager) over `new_tokens`
    greedy steps after `prompt` (its first sequence), held to `min_agreement` and
    `min_mean_cosine` when given; see the module docstring. `verify=False` skips the hash check
    of the folder's files (`GenerationExport.load`): the export job's gate, on the folder it has
    just written and hashed.

    A speech model's sample (`input_features`, no `input_ids`) is compared on two clips made
    offline, `audio_input.sample_clip` and `held_out_clip`, turned into features by `extractor`
    (the saved feature extractor; without one, on the sample's own features): their steps are
    pooled, and the report adds the error rate of the export's own free-running transcripts against
    eager's, in tokens (`token_error_rate`)."""
    from .loop import GenerationRunner

    runner = GenerationRunner.load(directory, verify=verify, engine="hfexport")  # what the components give
    speech = "input_ids" not in prompt and "input_features" in prompt
    if speech:
        cases = [((), {"input_features": features}) for features in _speech_features(prompt, extractor)]
    else:
        extra = {k: v[:1] for k, v in prompt.items() if k not in ("input_ids", "attention_mask")
                 and isinstance(v, torch.Tensor)}
        cases = [(prompt["input_ids"][:1], extra)]
    steps = _Steps()
    for ids, extra in cases:
        steps.add(runner, model, ids, extra, generation_config, new_tokens, transcribe=speech)
    return AccuracyReport(tokens=len(steps.same), agreement=sum(steps.same) / len(steps.same),
                          min_cosine=min(steps.cosines), mean_cosine=sum(steps.cosines) / len(steps.cosines),
                          first_difference=next((i for i, ok in enumerate(steps.same) if not ok), None),
                          min_agreement=min_agreement, top_k_overlap=sum(steps.overlaps) / len(steps.overlaps),
                          min_mean_cosine=min_mean_cosine,
                          clips=len(cases) if speech else None,
                          token_error_rate=steps.token_error_rate() if speech else None)


def _speech_features(prompt: dict[str, Any], extractor: Any) -> list[torch.Tensor]:
    """The features a speech model's gate compares on: the sample and held-out clips' (`extractor`'s),
    or the sample's own without one."""
    if extractor is None:
        return [prompt["input_features"][:1]]
    from .audio_input import held_out_clip, sample_clip

    rate = int(extractor.sampling_rate)
    return [extractor(clip, sampling_rate=rate, return_tensors="pt")["input_features"]
            for clip in (sample_clip(extractor), held_out_clip(extractor))]


class _Steps:
    """Teacher-forced steps of the export against eager's, over one prompt (or clip) after another."""

    def __init__(self):
        self.same: list[bool] = []  # whether the step's greedy token is eager's
        self.cosines: list[float] = []
        self.overlaps: list[float] = []
        self.transcripts: list[tuple[list[int], list[int]]] = []  # (eager's, the export's free-running) new tokens

    def add(self, runner: Any, model: torch.nn.Module, ids: Any, extra: dict[str, Any], generation_config: Any,
            new_tokens: int, transcribe: bool) -> None:
        """Eager `generate` greedily for `new_tokens` after `ids` (none: a speech model's decoder
        prompt) and `extra`, then the export fed eager's tokens; with `transcribe`, the export's own
        greedy tokens too."""
        length = len(ids[0]) if len(ids) else 0
        new_tokens = max(1, min(new_tokens, _positions_left(runner, model, generation_config, length)))
        prompt = {"input_ids": ids} if length else {}
        with torch.no_grad():
            out = model.generate(**prompt, **extra, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 do_sample=False, generation_config=generation_config, output_logits=True,
                                 output_scores=True, return_dict_in_generate=True)
        tokens = out.sequences[0, out.sequences.shape[1] - len(out.logits):].tolist()  # after any decoder prompt
        want = [step[0].float() for step in out.logits]
        got = runner.score(ids, tokens, **extra)
        # eager's token was picked after its processors had ruled tokens out (`min_new_tokens`' end token,
        # a speech model's suppress lists): the export's raw step picks among the same tokens
        ruled_out = [scores[0] == float("-inf") for scores in out.scores]
        self.same += [int(g.masked_fill(ruled, float("-inf")).argmax()) == token
                      for g, ruled, token in zip(got, ruled_out, tokens)]
        self.cosines += [float(torch.nn.functional.cosine_similarity(g.double(), w.double(), dim=0))
                         for g, w in zip(got, want)]
        self.overlaps += [_top_k_overlap(g, w) for g, w in zip(got, want)]
        if transcribe:
            free = runner.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **extra)
            self.transcripts.append((tokens, list(free.tokens)))

    def token_error_rate(self) -> float:
        """The export's free-running greedy tokens' edit distance from eager's, over eager's count:
        a speech model's word error rate in tokens (a tiny model's text has few words to count)."""
        return sum(edit_distance(want, got) for want, got in self.transcripts) / max(
            sum(len(want) for want, _ in self.transcripts), 1)


def _positions_left(runner: Any, model: torch.nn.Module, generation_config: Any, prompt_length: int) -> int:
    """How many new tokens fit after a prompt of `prompt_length`: a static cache's length (an
    OpenVINO state bounded at it), or a speech decoder's positions after its decoder prompt."""
    if model.config.is_encoder_decoder:
        positions = getattr(model.config, "max_target_positions", None)
        if positions is None:
            return DEFAULT_TOKENS
        from .decoder_prompt import decoder_prompt

        return int(positions) - len(decoder_prompt(generation_config or model.generation_config, model.config))
    return int(runner.max_cache_len) - prompt_length if runner.max_cache_len else DEFAULT_TOKENS


def edit_distance(want: list[Any], got: list[Any]) -> int:
    """Levenshtein distance of two sequences (substitutions, insertions, deletions)."""
    row = list(range(len(got) + 1))
    for i, a in enumerate(want, 1):
        previous, row[0] = row[0], i
        for j, b in enumerate(got, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (a != b))
    return row[-1]


def _top_k_overlap(got: torch.Tensor, want: torch.Tensor, k: int = TOP_K) -> float:
    """The share of `want`'s `k` highest logits whose tokens are among `got`'s `k` highest."""
    k = min(k, want.numel())
    return len(set(got.topk(k).indices.tolist()) & set(want.topk(k).indices.tolist())) / k
