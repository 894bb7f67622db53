"""A differential fuzzer: random tiny text decoders, exported with `dynamic=True`, run in their
runtime and compared with eager PyTorch, hunting silent specialisation and numeric mismatches.

    python -m hfexport.fuzz --examples 500 --backends dynamo,onnx,openvino,executorch --seed 0
    hfexport fuzz --examples 20 --backends dynamo --seed 3 --report /tmp/fuzz_findings.md

One example (drawn by hypothesis, see `examples`) is a preset text decoder whose config is
perturbed within what its architecture allows (heads, key/value heads, head_dim, layers,
vocabulary, sliding window, rope scaling, tied embeddings, pad/bos/eos ids), a prompt (batch,
length, left padding), a cache (dynamic, or static of `max_cache_len`), multi-token decode on or
off, and a backend. It is checked in two parts:

- `export`: `exporter.export(model, inputs)`, `validate` at the sample and two resized shapes,
  then the artifact run by the fuzzer itself at one more drawn shape (its own resizing, so a bug
  in `validate`'s cannot hide one in the export);
- `generate`: `decompose_for_generation` -> `export_components` -> `validate_components`, the
  export saved and driven by `GenerationRunner` (tokens and every step's logits against
  `model.generate`), and for a static cache with multi-token decode the one `decode` graph driven
  as the docs' loops drive it (`drive_decode_loop`).

Outcomes: *passed*; *refused*: the library declined with an `ExportError` while exporting, and
its remedy is a real alternative (not "rerun with --debug" or "please report"); *failed*:
anything else (an exception, a failed validation, a token or logits mismatch). A silent wrong
answer is always a failure. Failures are told apart by stage, kind and `Failure.signature` (an
error's first line with sizes, symbols and model names blanked; for a mismatch, what differs and
on which architecture). Each new one is shrunk by hypothesis (at most `--shrink-budget` runs per
round, only the part that failed) and printed as a ready-to-paste Python reproduction; the next
round (a new seed) hunts on until `--examples` examples have run. Outcomes are remembered, so an
example hypothesis draws again is not run again.

Examples run in this process: a runtime that crashes the interpreter (a segfault) ends the run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import json
import re
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["ARCHS", "Arch", "Example", "Failure", "Outcome", "Finding", "FuzzOptions", "FuzzSummary",
           "config_overrides", "examples", "build_example", "run_example", "compare_steps", "drive_decode_loop",
           "reproduction", "signature", "fuzz", "add_arguments", "main"]

BACKENDS = ("dynamo", "onnx", "openvino", "executorch")
MODES = ("export", "generate")
#: `validate`'s resized cases: every symbolic size moved by 2, then by 5.
VALIDATE_STEPS = (2, 5)
#: Per-step logits of a generation against `generate()`'s (the runner tests' tolerance).
STEP_ATOL = STEP_RTOL = 1e-4
#: The stages of each part, in order (a reproduction replays a stage's prerequisites).
EXPORT_STAGES = ("export", "validate", "other-shape")
GENERATE_STAGES = ("decompose", "export-components", "validate-components", "save", "runner", "decode-loop")
#: Stages where an `ExportError` with a real remedy is the library declining a request.
_REFUSING_STAGES = ("export", "decompose", "export-components")
#: Remedies that say "this is our bug": such an error is a failure, never a refusal.
_BUG_REMEDIES = ("--debug", "please report")


# -- architectures ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Arch:
    """How a preset's config names what the fuzzer perturbs."""

    name: str
    heads: str = "num_attention_heads"
    kv_heads: str | None = "num_key_value_heads"  # None: as many key/value heads as query heads
    layers: str = "num_hidden_layers"
    hidden: tuple[str, ...] = ("hidden_size",)
    head_dim: str | None = None  # the config key of the per-head size; None: hidden = heads * head_dim
    sliding: str | None = None  # "window": sliding_window=w; "qwen": use_sliding_window + max_window_layers
    rope: str | None = "plain"  # "plain": rope_parameters; "per_layer_type": Gemma-3's dict; None: no rope
    seq2seq: bool = False


ARCHS: dict[str, Arch] = {a.name: a for a in [
    Arch("llama"),  # its preset leaves head_dim derived; qwen3, mistral and the Gemmas set it apart
    Arch("qwen3", head_dim="head_dim", sliding="qwen"),
    Arch("qwen2", sliding="qwen"),
    Arch("mistral", head_dim="head_dim", sliding="window"),
    Arch("gemma2", head_dim="head_dim", sliding="window"),
    Arch("gemma3_text", head_dim="head_dim", sliding="window", rope="per_layer_type"),
    Arch("phi3", sliding="window", rope=None),  # Phi-3's rope validator takes only its own scalings
    Arch("starcoder2", sliding="window"),
    Arch("mixtral", head_dim="head_dim", sliding="window"),
    Arch("qwen3_moe", head_dim="head_dim"),
    Arch("olmo2"),
    Arch("olmoe"),
    Arch("phi"),
    Arch("smollm3"),
    Arch("gpt_neox", kv_heads=None),
    Arch("falcon", kv_heads="num_kv_heads"),
    Arch("gpt2", heads="n_head", kv_heads=None, layers="n_layer", hidden=("n_embd",), rope=None),
    Arch("gptj", heads="n_head", kv_heads=None, layers="n_layer", hidden=("n_embd",), rope=None),
    Arch("opt", kv_heads=None, hidden=("hidden_size", "word_embed_proj_dim"), rope=None),
    Arch("bloom", heads="n_head", kv_heads=None, layers="n_layer", rope=None),
    Arch("t5", heads="num_heads", kv_heads=None, layers="num_layers", hidden=("d_model",), head_dim="d_kv",
         rope=None, seq2seq=True),
]}
#: The decoders drawn by default (`--archs` picks others; `--seq2seq` adds T5).
DEFAULT_ARCHS = tuple(name for name, arch in ARCHS.items() if not arch.seq2seq)
_ROPE_LINEAR = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
_GEMMA3_ROPE_LINEAR = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                       "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}


#: Bugs this fuzzer found that are still open, `(arch, backend, mode) -> what fails`: drawn no
#: more (like the coverage matrix's known failures) until fixed, so a run hunts for new ones.
#: Each is listed in the run's summary; remove an entry to hunt it again.
OPEN_FINDINGS: dict[tuple[str, str, str], str] = {
}


def _known_failure(arch: str, backend: str, modes: Sequence[str]) -> bool:
    """Whether the coverage matrix declares (arch, backend) failing in one of `modes`, or the
    fuzzer has an open finding there (`OPEN_FINDINGS`)."""
    from .coverage.matrix import KNOWN_FAILURES

    return any((arch, backend, mode) in KNOWN_FAILURES or (arch, backend, mode) in OPEN_FINDINGS for mode in modes)


# -- examples -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Example:
    """One drawn case: the model (preset, config overrides, seed), the prompt, the cache, the backend."""

    arch: str
    backend: str
    overrides: dict[str, Any]
    seed: int = 0
    batch: int = 1
    prompt_len: int = 8
    padding: int = 0  # left-padding positions of the last row (batch > 1)
    other_batch: int = 2
    other_len: int = 5
    cache: str = "dynamic"  # "dynamic" | "static"
    max_cache_len: int | None = None
    multi_token_decode: bool = False
    new_tokens: int = 4
    modes: tuple[str, ...] = MODES

    def to_json(self) -> str:
        """The example as one line of JSON (`--replay` takes it back)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Example:
        """The example `to_json` wrote."""
        data = json.loads(text)
        data["modes"] = tuple(data.get("modes", MODES))
        return cls(**data)

    def prompt(self, batch: int | None = None, length: int | None = None, padding: int | None = None,
               vocab_size: int = 128, pad_id: int = 0) -> dict[str, torch.Tensor]:
        """`input_ids` and `attention_mask` (the last row left-padded by `padding`), seeded by `seed`."""
        batch = self.batch if batch is None else batch
        length = self.prompt_len if length is None else length
        padding = self.padding if padding is None else min(padding, length - 1)
        generator = torch.Generator().manual_seed(self.seed)
        ids = torch.randint(3, vocab_size, (batch, length), generator=generator)
        mask = torch.ones_like(ids)
        if batch > 1 and padding:
            mask[-1, :padding] = 0
            ids[-1, :padding] = pad_id
        return {"input_ids": ids, "attention_mask": mask}

    def generation_config(self) -> Any:
        """The `GenerationConfig` of the generation part (`None`: the model's own, a dynamic cache)."""
        if self.cache != "static":
            return None
        from transformers import GenerationConfig

        return GenerationConfig(cache_implementation="static", max_cache_len=self.max_cache_len)

    def only(self, modes: Sequence[str]) -> Example:
        """This example run for `modes` only, the fields no other part reads at their defaults (so
        the examples shrinking draws that differ only there are one example)."""
        modes = tuple(m for m in self.modes if m in modes)
        reset: dict[str, Any] = {}
        if "generate" not in modes:
            reset.update(cache="dynamic", max_cache_len=None, multi_token_decode=False, new_tokens=4)
        if "export" not in modes:
            reset.update(other_batch=2, other_len=5)
        return dataclasses.replace(self, modes=modes, **reset)

    @property
    def runs_loop(self) -> bool:
        """Whether the runner and the decode loop apply (one sequence; a static cache's batch is fixed)."""
        return self.cache != "static" or self.batch == 1

    def label(self) -> str:
        """A short description for progress lines: architecture, backend, shapes, cache, decode."""
        cache = f"static {self.max_cache_len}" if self.cache == "static" else "dynamic"
        return (f"{self.arch} {self.backend} b={self.batch} L={self.prompt_len} pad={self.padding} {cache} "
                f"mtd={int(self.multi_token_decode)} K={self.new_tokens}")


@functools.lru_cache(maxsize=None)
def _preset_defaults(name: str) -> dict[str, Any]:
    """The config keyword arguments `build_preset(name)` passes or leaves at their default.

    # NOTE: not the built config's attributes: those hold derived values (Llama's head_dim is
    # hidden_size // heads), and dropping an override equal to one would change its meaning.
    """
    import inspect

    import transformers

    from .presets import PRESETS

    preset = PRESETS[name]
    signature = inspect.signature(getattr(transformers, preset.config_class).__init__)
    defaults = {key: p.default for key, p in signature.parameters.items() if p.default is not inspect.Parameter.empty}
    return {**defaults, **preset.config}


def _structure_overrides(arch: Arch, heads: int, kv: int, head_dim: int, layers: int) -> dict[str, Any]:
    """Config keys for the attention shape: heads, key/value heads, head size (or hidden size), layers."""
    out: dict[str, Any] = {arch.heads: heads, arch.layers: layers}
    if arch.kv_heads:
        out[arch.kv_heads] = kv
    if arch.head_dim:
        out[arch.head_dim] = head_dim
    else:
        out.update({key: heads * head_dim for key in arch.hidden})
    return out


def _window_overrides(arch: Arch, window: int | None, layers: int, full_layers: int) -> dict[str, Any]:
    """Config keys for a sliding window of `window` tokens (None: the preset's own)."""
    if window is None or arch.sliding is None:
        return {}
    if arch.sliding == "qwen":  # layers from max_window_layers on slide
        return {"use_sliding_window": True, "sliding_window": window, "max_window_layers": min(full_layers, layers - 1)}
    return {"sliding_window": window}


def _rope_overrides(arch: Arch, scaled: bool) -> dict[str, Any]:
    if not scaled or arch.rope is None:
        return {}
    return {"rope_parameters": copy.deepcopy(_GEMMA3_ROPE_LINEAR if arch.rope == "per_layer_type" else _ROPE_LINEAR)}


_MISSING = object()


def _without_defaults(arch: Arch, overrides: dict[str, Any]) -> dict[str, Any]:
    """Drop the overrides equal to the preset's own value (a shorter reproduction)."""
    defaults = _preset_defaults(arch.name)
    return {key: value for key, value in overrides.items() if defaults.get(key, _MISSING) != value}


def config_overrides(arch: Arch):
    """A strategy of `build_preset` overrides for `arch`; every first choice is the preset's own,
    so a shrunk example keeps only the overrides that matter."""
    from hypothesis import strategies as st

    @st.composite
    def draw_overrides(draw) -> dict[str, Any]:
        # some configs check hidden_size % heads even with their own head_dim (Gemma-2): keep it a divisor
        heads = draw(st.sampled_from((4, 2, 1, 8) if arch.head_dim else (4, 2, 1, 8, 6)))
        group = draw(st.sampled_from((2, 1, 4, 3)))  # query heads per key/value head, always one draw:
        kv = heads // group if arch.kv_heads and heads % group == 0 else heads  # a shorter draw would shrink first
        head_dim = draw(st.sampled_from((8, 4, 16)))
        layers = draw(st.sampled_from((2, 1, 3)))
        out = _structure_overrides(arch, heads, kv, head_dim, layers)
        out["vocab_size"] = draw(st.sampled_from((128, 64, 97, 256)))
        if arch.sliding:
            window = draw(st.none() | st.integers(2, 8))
            out.update(_window_overrides(arch, window, layers, draw(st.integers(0, 2))))
        out.update(_rope_overrides(arch, draw(st.booleans())))
        tie = draw(st.sampled_from((None, True, False)))
        if tie is not None:
            out["tie_word_embeddings"] = tie
        for key, choices in (("pad_token_id", ("keep", 0, None)), ("eos_token_id", ("keep", None, 5)),
                             ("bos_token_id", ("keep", None))):
            value = draw(st.sampled_from(choices))
            if value != "keep":
                out[key] = value
        return _without_defaults(arch, out)

    return draw_overrides()


def examples(backends: Sequence[str] = ("dynamo",), archs: Sequence[str] = DEFAULT_ARCHS,
             modes: Sequence[str] = MODES):
    """The strategy of `Example`s: a backend, an architecture not declared failing on it, its
    config overrides, a prompt, another shape, a cache and the generation settings."""
    from hypothesis import strategies as st

    @st.composite
    def draw_example(draw) -> Example:
        backend = draw(st.sampled_from(list(backends)))
        allowed = [a for a in archs if not _known_failure(a, backend, modes)]
        if not allowed:
            raise ValueError(f"every architecture of {list(archs)} is a declared failure on {backend}")
        arch = ARCHS[draw(st.sampled_from(allowed))]
        overrides = draw(config_overrides(arch))
        batch, prompt_len = draw(st.integers(1, 3)), draw(st.integers(1, 12))
        padding = draw(st.integers(0, prompt_len - 1)) if batch > 1 else 0
        other_batch, other_len = draw(st.integers(1, 3)), draw(st.integers(1, 12))
        if (other_batch, other_len) == (batch, prompt_len):
            other_len = prompt_len % 12 + 1
        static = not arch.seq2seq and draw(st.booleans())
        new_tokens = draw(st.integers(1, 6))
        mtd = draw(st.booleans()) != static  # a static cache's main path (first choice) is multi-token decode
        max_cache_len = draw(st.integers(max(16, prompt_len + max(new_tokens, 3) + 1), 64)) if static else None
        return Example(arch.name, backend, overrides, draw(st.integers(0, 3)), batch, prompt_len, padding,
                       other_batch, other_len, "static" if static else "dynamic", max_cache_len, mtd, new_tokens,
                       tuple(modes))

    return draw_example()


# -- outcomes -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Failure:
    """What went wrong at one stage: an exception (`error`) or numbers that differ (`mismatch`)."""

    stage: str
    kind: str  # "error" | "mismatch"
    message: str
    signature: str  # an error's first line, numbers and symbols blanked; what differs, and on which architecture
    error_type: str = ""

    @property
    def category(self) -> str:
        return f"{self.stage} {self.kind}"

    def key(self) -> tuple[str, str, str]:
        """What tells distinct failures apart (each is shrunk on its own)."""
        return self.stage, self.kind, self.signature


def signature(text: str) -> str:
    """`text`'s first line with what varies between examples blanked: model class names, symbols
    (`s42`), numbers; so one cause met at other sizes or on other models is one failure."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    line = re.sub(r"\b[A-Z]\w*(?:ForCausalLM|ForConditionalGeneration|LMHeadModel|Model)\b", "<model>", line)
    line = re.sub(r"\bs\d+\b", "s?", line)
    return re.sub(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", "N", line)[:200]


@dataclasses.dataclass
class Outcome:
    """Every failure and refusal of one example, and how long it took."""

    failures: list[Failure] = dataclasses.field(default_factory=list)
    refusals: list[Failure] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    invalid: str | None = None  # eager PyTorch itself rejects the example: not a case

    @property
    def status(self) -> str:
        if self.invalid:
            return "invalid"
        return "failed" if self.failures else ("refused" if self.refusals else "passed")


class _Abort(Exception):
    """Ends one part of an example after a stage failed (the failure is already recorded)."""


class InvalidExample(Exception):
    """Eager PyTorch cannot run the example (the drawn config is not a model): no verdict."""


def _first_lines(error: BaseException, count: int = 3) -> str:
    from .errors import summarize

    lines = [line for line in f"{type(error).__name__}: {error}".splitlines() if line.strip()]
    root = summarize(error)
    text = "\n".join(lines[:count])
    return text if root.split(":")[0] in text else f"{text}\n(cause) {root}"


def _is_refusal(stage: str, error: BaseException) -> bool:
    """The library declining a request it cannot meet: an `ExportError` raised while exporting
    whose remedy offers an alternative rather than asking for a bug report."""
    from .errors import ExportError, ValidationError

    if stage not in _REFUSING_STAGES or not isinstance(error, ExportError) or isinstance(error, ValidationError):
        return False
    remedy = (error.remedy or "").lower()
    return bool(remedy) and not any(marker in remedy for marker in _BUG_REMEDIES)


class _Checks:
    """Collects the failures and refusals of one example's stages."""

    def __init__(self, example: Example, outcome: Outcome):
        self.example, self.outcome = example, outcome

    def attempt(self, stage: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)`; an exception is recorded (refusal or failure) and ends the part."""
        try:
            return fn(*args, **kwargs)
        except (InvalidExample, _Abort):
            raise
        except Exception as error:  # noqa: BLE001 - every exception is a verdict on the library
            text = _first_lines(error)
            entry = Failure(stage, "error", text, signature(text), type(error).__name__)
            (self.outcome.refusals if _is_refusal(stage, error) else self.outcome.failures).append(entry)
        raise _Abort(stage)

    def mismatch(self, stage: str, message: str, what: str) -> None:
        """Record numbers that differ from eager: `what` differs (it and the architecture tell this
        failure apart from others)."""
        self.outcome.failures.append(Failure(stage, "mismatch", message, f"{self.example.arch}: {what}"))

    def report(self, stage: str, report: Any, component: str = "") -> None:
        """Record the first failing case of a validation report (none when it passed)."""
        prefix = f"{component}: " if component else ""
        for case in report.cases:
            label = re.sub(r"\d+", "N", case.label)
            if case.error:  # the artifact raised in its runtime: an error, told apart by its message
                text = f"{prefix}{case.label} {_shapes(case.input_shapes)}: {case.error.splitlines()[0][:300]}"
                self.outcome.failures.append(Failure(stage, "error", text, f"{prefix}{label}: {signature(case.error)}"))
                return
            for output in case.outputs:
                if not output.passed:
                    detail = output.error or (f"max abs {output.max_abs:.3g} > atol {report.atol:g} "
                                              f"+ rtol {report.rtol:g}")
                    self.mismatch(stage, f"{prefix}{case.label} {output.name} {output.shape}: {detail}",
                                  f"{prefix}{label} {re.sub(r'[0-9]+', 'N', output.name)}")
                    return

    def run_part(self, part: Callable[..., None], *args: Any) -> None:
        """Run one part; a failed stage ends it, the next part still runs."""
        try:
            part(self, *args)
        except _Abort as stopped:
            self.outcome.notes.append(f"{part.__name__.strip('_')} stopped at {stopped}")


# -- the checks ---------------------------------------------------------------------------------


def build_example(example: Example) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The eager model and the sample inputs of `example` (`InvalidExample` if eager cannot run them)."""
    from .presets import build_preset

    try:
        model, _ = build_preset(example.arch, example.seed, **example.overrides)
    except Exception as error:  # noqa: BLE001 - a config the model class (or its validators) refuses
        raise InvalidExample(f"the config is not valid: {_first_lines(error, 1)}") from error
    return model, sample_inputs(example, model)


def sample_inputs(example: Example, model: torch.nn.Module, other: bool = False) -> dict[str, torch.Tensor]:
    """The prompt of `example` (`other`: at its other shape, `other_batch` x `other_len`), with
    three decoder tokens for an encoder-decoder model."""
    batch, length = (example.other_batch, example.other_len) if other else (example.batch, example.prompt_len)
    inputs = example.prompt(batch, length, example.padding, vocab_size=model.config.vocab_size,
                            pad_id=model.config.pad_token_id or 0)
    if ARCHS[example.arch].seq2seq:
        start = model.config.decoder_start_token_id or 0
        inputs["decoder_input_ids"] = torch.tensor([[start, 5, 9]]).repeat(batch, 1)
    return inputs


def _export_config(backend: str) -> Any:
    from .auto import AutoExportConfig

    return AutoExportConfig.from_dict({"export_format": backend, "dynamic": True})


def _shapes(shapes: dict[str, list[int]]) -> str:
    """Input shapes, the cache's first tensor standing for all of them."""
    cache = [name for name in shapes if "cache" in name or "past_key_values" in name]
    kept = {name: shape for name, shape in shapes.items() if name not in cache[1:]}
    more = f" (+{len(cache) - 1} cache)" if cache[1:] else ""
    return ", ".join(f"{name} {shape}" for name, shape in kept.items()) + more


def _close(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> str | None:
    """None when `got` matches `want` (max|diff| <= atol + rtol * max|want|), else what differs."""
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {list(got.shape)} but eager gives {list(want.shape)}"
    got, want = got.double(), want.double()
    if not torch.equal(torch.isfinite(got), torch.isfinite(want)):
        return "non-finite values differ from eager"
    finite = torch.isfinite(want)
    diff = float((got - want).abs()[finite].max()) if finite.any() else 0.0
    scale = float(want[finite].abs().max()) if finite.any() else 0.0
    return None if diff <= atol + rtol * scale else f"max abs {diff:.3g} (max |eager| {scale:.3g})"


def _logits_at_other_shape(artifact: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    from .record import record_of
    from .runner import runner_for

    record = record_of(artifact)
    outputs = runner_for(artifact, record).run(record.artifact_inputs(inputs))
    return torch.as_tensor(outputs[record.output_names.index("logits")])


def _check_other_shape(checks: _Checks, example: Example, model: torch.nn.Module, artifact: Any) -> None:
    """Run the artifact at the drawn other shape and compare its logits (padding left out) with eager."""
    from .validation import DEFAULT_TOLERANCE

    inputs = sample_inputs(example, model, other=True)
    try:
        with torch.no_grad():
            want = model(**inputs).logits
    except Exception as error:  # noqa: BLE001 - eager itself rejects the shape: nothing to compare
        checks.outcome.notes.append(f"other-shape: eager rejects it ({_first_lines(error, 1)})")
        return
    got = checks.attempt("other-shape", _logits_at_other_shape, artifact, inputs)
    if not ARCHS[example.arch].seq2seq:  # decoder logits are laid out along the prompt
        keep = inputs["attention_mask"].bool()
        if tuple(got.shape[:2]) == tuple(keep.shape):
            got, want = got[keep], want[keep]
    atol, rtol = DEFAULT_TOLERANCE.get(example.backend, (1e-4, 1e-4))
    problem = _close(got, want, atol, rtol)
    if problem:
        shapes = {name: list(value.shape) for name, value in inputs.items()}
        checks.mismatch("other-shape", f"logits at {shapes}: {problem}", "logits")


def _check_export(checks: _Checks, example: Example, model: torch.nn.Module, inputs: dict[str, Any]) -> None:
    """One graph: export, `validate` (sample + resized shapes), then the fuzzer's own other shape."""
    from .auto import AutoHfExporter
    from .validation import validate

    config = _export_config(example.backend)
    exporter = AutoHfExporter.from_config(config)
    artifact = checks.attempt("export", exporter.export, model, inputs, config=config)
    report = checks.attempt("validate", validate, artifact, model, inputs, steps=VALIDATE_STEPS)
    checks.report("validate", report)
    if report.note:
        checks.outcome.notes.append(f"validate: {report.note}")
    _check_other_shape(checks, example, model, artifact)


@dataclasses.dataclass
class EagerGeneration:
    """`model.generate` on the first sequence: the reference of the runner and the decode loop."""

    prompt: torch.Tensor  # [1, n]
    attention_mask: torch.Tensor
    tokens: list[int]
    logits: list[torch.Tensor]  # per step, the raw logits `[vocab]` (before the processors)


def _generate(model: torch.nn.Module, inputs: dict[str, Any], example: Example) -> Any:
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=example.new_tokens, min_new_tokens=example.new_tokens,
                              do_sample=False, generation_config=example.generation_config(), output_logits=True,
                              return_dict_in_generate=True)


def eager_generation(model: torch.nn.Module, example: Example, inputs: dict[str, Any]) -> EagerGeneration:
    """Greedy `generate()` on the whole batch (it must run: else `InvalidExample`), then on the
    first sequence alone, which is the reference."""
    prompt = {k: v for k, v in inputs.items() if not k.startswith("decoder_")}
    first = {k: v[:1] for k, v in prompt.items()}
    try:
        _generate(model, prompt, example)
        out = _generate(model, first, example)
    except Exception as error:  # noqa: BLE001 - eager itself cannot generate: the example is no case
        raise InvalidExample(f"eager generate() fails: {_first_lines(error, 1)}") from error
    start = 1 if ARCHS[example.arch].seq2seq else first["input_ids"].shape[1]  # a decoder start token leads
    return EagerGeneration(first["input_ids"], first["attention_mask"], out.sequences[0, start:].tolist(),
                           [step[0].float() for step in out.logits])


def _tied(want: torch.Tensor, a: int, b: int, slack: float) -> bool:
    """Whether eager scores tokens `a` and `b` within `slack`: either is a correct argmax."""
    return abs(float(want[a]) - float(want[b])) <= slack


def compare_steps(got_tokens: list[int], got_logits: Sequence[torch.Tensor], want_tokens: list[int],
                  want_logits: Sequence[torch.Tensor]) -> tuple[str, str] | None:
    """None when every step's logits match `generate()`'s and the tokens agree (up to a near-tie
    of eager's own scores, after which the sequences may rightly part); else the first difference
    and what differs (`"steps"`, `"logits"`, `"token"`)."""
    for step, want in enumerate(want_logits):
        if step >= len(got_logits) or step >= len(got_tokens):
            return f"{min(len(got_logits), len(got_tokens))} steps, generate() made {len(want_logits)}", "steps"
        got = torch.as_tensor(got_logits[step]).reshape(-1).float()
        problem = _close(got, want, STEP_ATOL, STEP_RTOL)
        if problem:
            return (f"step {step} logits: {problem}; tokens {got_tokens[:step + 1]}, "
                    f"generate() {want_tokens[:step + 1]}", "first step logits" if step == 0 else "later step logits")
        if got_tokens[step] != want_tokens[step]:
            slack = 2 * float((got - want).abs().max()) + 1e-6
            if _tied(want, got_tokens[step], want_tokens[step], slack):
                return None
            return (f"step {step}: token {got_tokens[step]}, generate() chose {want_tokens[step]} with the same "
                    f"logits (tokens {got_tokens}, generate() {want_tokens})", "token")
    return None


def _check_runner(checks: _Checks, example: Example, directory: Path, eager: EagerGeneration) -> None:
    """`GenerationRunner` on the saved export: tokens and per-step logits equal `generate()`'s."""
    from .generation.runner import GenerationRunner

    runner = checks.attempt("runner", GenerationRunner.load, directory)
    extra = {"attention_mask": eager.attention_mask} if ARCHS[example.arch].seq2seq else {}
    result = checks.attempt("runner", runner.generate, eager.prompt, max_new_tokens=example.new_tokens,
                            min_new_tokens=example.new_tokens, output_logits=True, **extra)
    problem = compare_steps(result.tokens, result.logits, eager.tokens, eager.logits)
    if problem:
        checks.mismatch("runner", *problem)


_LOOP_INPUTS = ["input_ids", "attention_mask", "position_ids"]


def drive_decode_loop(runner: Any, prompt: list[int], tokens: list[int], max_cache_len: int) -> list[torch.Tensor]:
    """The docs' static-cache loop (`examples/decode_loop_*.py`) on a loaded `decode` component's
    runner: cache inputs zeroed (symbolic axes are the cache length), the whole prompt in one call
    with the boolean causal mask `[1, 1, q, max_cache_len]`, then one token per call. The tokens
    fed after the prompt are `tokens` (generate()'s), so each call compares with generate()'s step
    even past a near-tie. Returns each call's last-position logits, `len(tokens)` of them."""
    record = runner.record
    cache = {name: torch.zeros([d if isinstance(d, int) else max_cache_len for d in shape], dtype=getattr(torch, dtype))
             for name, shape, dtype in zip(record.input_names, record.input_shapes, record.input_dtypes)
             if name.startswith("cache.")}
    ids, past, logits = torch.tensor([prompt]), 0, []
    for step in range(len(tokens)):
        positions = torch.arange(past, past + ids.shape[1])
        mask = (torch.arange(max_cache_len)[None, :] <= positions[:, None])[None, None]
        out = runner.run_named({"input_ids": ids, "attention_mask": mask, "position_ids": positions[None], **cache})
        cache = {name: out[name] for name in cache}
        logits.append(torch.as_tensor(out["logits"])[0, -1].float())
        past += ids.shape[1]
        ids = torch.tensor([[tokens[step]]])
    return logits


def _check_decode_loop(checks: _Checks, example: Example, directory: Path, eager: EagerGeneration) -> None:
    """The static `decode` graph driven like the docs' loops: its interface, then every step's logits."""
    from .generation.package import GenerationExport

    export = checks.attempt("decode-loop", GenerationExport.load, directory)
    component = export.components.get("decode")
    names = [n for n in component.record.input_names if not n.startswith("cache.")] if component else []
    if names != _LOOP_INPUTS:
        checks.mismatch("decode-loop", f"the decode graph takes {names} besides its cache, not the documented "
                        f"{_LOOP_INPUTS}: the docs' loop cannot drive it", "interface")
        return
    runner = checks.attempt("decode-loop", component.runner)
    logits = checks.attempt("decode-loop", drive_decode_loop, runner, eager.prompt[0].tolist(), eager.tokens,
                            example.max_cache_len)
    greedy = [int(step.argmax()) for step in logits]
    problem = compare_steps(greedy, logits, [int(step.argmax()) for step in eager.logits], eager.logits)
    if problem:
        checks.mismatch("decode-loop", *problem)


def _check_generate(checks: _Checks, example: Example, model: torch.nn.Module, inputs: dict[str, Any],
                    eager: EagerGeneration) -> None:
    """Generation: decompose, export the components, validate them, then run the saved export."""
    from .auto import AutoHfExporter
    from .generation.package import save_generation_export
    from .utils import decompose_for_generation
    from .validation import validate_components

    prompt = {k: v for k, v in inputs.items() if not k.startswith("decoder_")}
    generation_config = example.generation_config()
    components = checks.attempt("decompose", decompose_for_generation, model, prompt,
                                generation_config=generation_config, multi_token_decode=example.multi_token_decode)
    config = _export_config(example.backend)
    exporter = AutoHfExporter.from_config(config)
    artifacts = checks.attempt("export-components", exporter.export_components, components, config)
    reports = checks.attempt("validate-components", validate_components, artifacts, components)
    for name, report in reports.items():
        checks.report("validate-components", report, name)
    if not example.runs_loop:
        checks.outcome.notes.append("runner: not run (a static cache of batch > 1; the runner drives one sequence)")
        return
    with tempfile.TemporaryDirectory(prefix="hfexport-fuzz-") as tmp:
        directory = checks.attempt("save", save_generation_export, exporter, artifacts, Path(tmp) / "export",
                                   model=model, generation_config=generation_config, export_config=config)
        checks.run_part(_check_runner, example, directory, eager)
        if example.cache == "static" and example.multi_token_decode:
            checks.run_part(_check_decode_loop, example, directory, eager)


def _check_eager(model: torch.nn.Module, inputs: dict[str, Any]) -> None:
    try:
        with torch.no_grad():
            model(**inputs)
    except Exception as error:  # noqa: BLE001 - eager itself rejects the inputs: the example is no case
        raise InvalidExample(f"eager forward fails: {_first_lines(error, 1)}") from error


def run_example(example: Example) -> Outcome:
    """Run every check of `example` (its `modes`); never raises for a library failure."""
    outcome = Outcome()
    checks = _Checks(example, outcome)
    start = time.perf_counter()
    try:  # eager first: an example eager PyTorch cannot run is no case, whatever the exports do
        model, inputs = build_example(example)
        _check_eager(model, inputs)
        eager = eager_generation(model, example, inputs) if "generate" in example.modes else None
        if "export" in example.modes:
            checks.run_part(_check_export, example, model, inputs)
        if eager is not None:
            checks.run_part(_check_generate, example, model, inputs, eager)
    except InvalidExample as error:
        outcome.invalid = str(error)
    outcome.seconds = time.perf_counter() - start
    return outcome


# -- reproductions ------------------------------------------------------------------------------


def _literal(tensor: torch.Tensor) -> str:
    return f"torch.tensor({tensor.tolist()})"


def _inputs_literal(inputs: dict[str, torch.Tensor]) -> str:
    return "{" + ", ".join(f"{name!r}: {_literal(value)}" for name, value in inputs.items()) + "}"


def _prelude(example: Example, model: torch.nn.Module) -> list[str]:
    overrides = "".join(f", {key}={value!r}" for key, value in example.overrides.items())
    inputs = sample_inputs(example, model)
    return [
        "import torch",
        "",
        "import hfexport",
        "from hfexport import AutoExportConfig, AutoHfExporter",
        "from hfexport.presets import build_preset",
        "",
        f"model, _ = build_preset({example.arch!r}, seed={example.seed}{overrides})",
        f"inputs = {_inputs_literal(inputs)}",
        f'config = AutoExportConfig.from_dict({{"export_format": "{example.backend}", "dynamic": True}})',
        "exporter = AutoHfExporter.from_config(config)",
    ]


def _snip_export(example: Example, model: torch.nn.Module) -> list[str]:
    return ["artifact = exporter.export(model, inputs, config=config)"]


def _snip_validate(example: Example, model: torch.nn.Module) -> list[str]:
    return [f"report = hfexport.validate(artifact, model, inputs, steps={VALIDATE_STEPS!r})",
            "print(report.to_table())", "assert report.passed"]


def _snip_other_shape(example: Example, model: torch.nn.Module) -> list[str]:
    from .validation import DEFAULT_TOLERANCE

    atol, rtol = DEFAULT_TOLERANCE.get(example.backend, (1e-4, 1e-4))
    keep = "" if ARCHS[example.arch].seq2seq else '[other["attention_mask"].bool()]'
    return [
        "from hfexport.runner import runner_for",
        "",
        f"other = {_inputs_literal(sample_inputs(example, model, other=True))}",
        "record = hfexport.record_of(artifact)",
        'got = torch.as_tensor(runner_for(artifact, record).run(record.artifact_inputs(other))'
        '[record.output_names.index("logits")])',
        "with torch.no_grad():",
        "    want = model(**other).logits",
        f"torch.testing.assert_close(got{keep}, want{keep}, atol={atol}, rtol={rtol})  # padding left out",
    ]


def _snip_decompose(example: Example, model: torch.nn.Module) -> list[str]:
    config = (f"GenerationConfig(cache_implementation='static', max_cache_len={example.max_cache_len})"
              if example.cache == "static" else "None  # the model's own: a dynamic cache")
    lines = ["from transformers import GenerationConfig", "from hfexport.utils import decompose_for_generation", "",
             f"generation_config = {config}"]
    if ARCHS[example.arch].seq2seq:
        lines.append('inputs = {k: v for k, v in inputs.items() if not k.startswith("decoder_")}')
    return lines + ["components = decompose_for_generation(model, inputs, generation_config=generation_config, "
                    f"multi_token_decode={example.multi_token_decode})"]


def _snip_export_components(example: Example, model: torch.nn.Module) -> list[str]:
    return ["artifacts = exporter.export_components(components, config)"]


def _snip_validate_components(example: Example, model: torch.nn.Module) -> list[str]:
    return ["reports = hfexport.validate_components(artifacts, components)",
            "for report in reports.values():", "    print(report.to_table())",
            "assert all(report.passed for report in reports.values())"]


def _snip_save(example: Example, model: torch.nn.Module) -> list[str]:
    return ["import tempfile", "", 'directory = tempfile.mkdtemp() + "/export"',
            "hfexport.save_generation_export(exporter, artifacts, directory, model=model, "
            "generation_config=generation_config, export_config=config)"]


def _snip_eager_generate(example: Example, model: torch.nn.Module) -> list[str]:
    start = "1" if ARCHS[example.arch].seq2seq else "prompt.shape[1]"
    return [
        'prompt, mask = inputs["input_ids"][:1], inputs["attention_mask"][:1]  # the runner drives one sequence',
        "with torch.no_grad():",
        f"    out = model.generate(input_ids=prompt, attention_mask=mask, max_new_tokens={example.new_tokens}, "
        f"min_new_tokens={example.new_tokens}, do_sample=False, generation_config=generation_config, "
        "output_logits=True, return_dict_in_generate=True)",
        f"want_tokens = out.sequences[0, {start}:].tolist()",
    ]


def _snip_runner(example: Example, model: torch.nn.Module) -> list[str]:
    mask = ", attention_mask=mask" if ARCHS[example.arch].seq2seq else ""
    return [
        f"result = hfexport.GenerationRunner.load(directory).generate(prompt, max_new_tokens={example.new_tokens}, "
        f"min_new_tokens={example.new_tokens}, output_logits=True{mask})",
        'print("runner:", result.tokens, "generate():", want_tokens)',
        "for step, (got, want) in enumerate(zip(result.logits, out.logits)):",
        f"    torch.testing.assert_close(got, want, atol={STEP_ATOL}, rtol={STEP_RTOL}, msg=f'step {{step}}')",
        "assert result.tokens == want_tokens",
    ]


def _snip_decode_loop(example: Example, model: torch.nn.Module) -> list[str]:
    return [
        "from hfexport.fuzz import drive_decode_loop  # the docs' loop: prompt in one call, then one token per call",
        "",
        'decode = hfexport.GenerationExport.load(directory).components["decode"]',
        "print([i for i in decode.record.input_names if not i.startswith('cache.')])  # the docs' loop feeds "
        "input_ids, attention_mask, position_ids",
        "logits = drive_decode_loop(decode.runner(), prompt[0].tolist(), want_tokens, "
        f"max_cache_len={example.max_cache_len})",
        "for step, (got, want) in enumerate(zip(logits, out.logits)):",
        f"    torch.testing.assert_close(got, want[0], atol={STEP_ATOL}, rtol={STEP_RTOL}, msg=f'step {{step}}')",
    ]


_SNIPPETS: dict[str, list[Callable[[Example, torch.nn.Module], list[str]]]] = {
    "export": [_snip_export],
    "validate": [_snip_export, _snip_validate],
    "other-shape": [_snip_export, _snip_other_shape],
    "decompose": [_snip_decompose],
    "export-components": [_snip_decompose, _snip_export_components],
    "validate-components": [_snip_decompose, _snip_export_components, _snip_validate_components],
    "save": [_snip_decompose, _snip_export_components, _snip_save],
    "runner": [_snip_decompose, _snip_export_components, _snip_save, _snip_eager_generate, _snip_runner],
    "decode-loop": [_snip_decompose, _snip_export_components, _snip_save, _snip_eager_generate, _snip_decode_loop],
}


def reproduction(example: Example, stage: str) -> str:
    """A ready-to-paste Python script that builds `example`'s model and inputs and replays its
    calls up to `stage`, the failing one (its last line fails as the fuzzer saw)."""
    if stage not in _SNIPPETS:
        raise ValueError(f"unknown stage {stage!r}; one of {', '.join(_SNIPPETS)}")
    model, _ = build_example(example)
    lines = _prelude(example, model)
    for snippet in _SNIPPETS[stage]:
        lines += ["", *snippet(example, model)]
    return "\n".join(lines) + "\n"


def replay_command(example: Example) -> str:
    """The shell line that runs `example` alone again."""
    return f"python -m hfexport.fuzz --replay '{example.to_json()}'"


# -- the driver ---------------------------------------------------------------------------------


class FuzzFailure(Exception):
    """Raised to hypothesis for a new failure; one subclass per distinct failure (`Failure.key`),
    so hypothesis shrinks each on its own."""


_FAILURE_TYPES: dict[tuple[str, ...], type[FuzzFailure]] = {}


def _part(stage: str) -> str:
    """The mode whose part of an example runs `stage`."""
    return "export" if stage in EXPORT_STAGES else "generate"


def _failure_type(key: tuple[str, ...]) -> type[FuzzFailure]:
    if key not in _FAILURE_TYPES:
        name = re.sub(r"\W", "_", f"Fuzz_{key[0]}_{key[1]}_{len(_FAILURE_TYPES)}")
        _FAILURE_TYPES[key] = type(name, (FuzzFailure,), {})
    return _FAILURE_TYPES[key]


@dataclasses.dataclass
class Finding:
    """A distinct failure and its shrunk (minimal) example."""

    key: tuple[str, ...]
    example: Example
    failure: Failure
    found_at: int  # the example that first showed it (1-based)

    def markdown(self, seed: int) -> str:
        """A Markdown section: the failure, its first lines, the reproduction and the replay command."""
        kind = f" ({self.failure.error_type})" if self.failure.error_type else ""
        return "\n".join([
            f"### {self.failure.category}{kind}: {self.example.arch} on {self.example.backend}", "",
            f"Found by `hfexport fuzz --seed {seed}` at example {self.found_at}; shrunk to `{self.example.label()}`.",
            "", "```text", self.failure.message, "```", "", "```python", reproduction(self.example, self.failure.stage)
            + "```", "", f"Replay: `{replay_command(self.example)}`", "", ""])


@dataclasses.dataclass
class FuzzOptions:
    """What `fuzz` runs: see `add_arguments` for each option."""

    examples: int = 20
    backends: tuple[str, ...] = ("dynamo",)
    archs: tuple[str, ...] = DEFAULT_ARCHS
    modes: tuple[str, ...] = MODES
    seed: int = 0
    shrink: bool = True
    shrink_budget: int = 20  # examples run while shrinking, per round
    database: str | None = None
    report: str | None = None
    progress: bool = True


@dataclasses.dataclass
class FuzzSummary:
    """Counts over the examples run (shrinking runs apart) and the distinct failures found."""

    run: int = 0
    passed: int = 0
    refused: Counter = dataclasses.field(default_factory=Counter)
    failed: Counter = dataclasses.field(default_factory=Counter)  # by category (an example may have several)
    failed_examples: int = 0
    invalid: int = 0
    shrink_runs: int = 0
    findings: dict[tuple[str, ...], Finding] = dataclasses.field(default_factory=dict)
    seconds: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # per backend

    def count(self, example: Example, outcome: Outcome) -> None:
        """Add one example run (not while shrinking) to the counts."""
        self.run += 1
        if outcome.status == "invalid":
            self.invalid += 1
            return
        self.seconds.setdefault(example.backend, []).append(outcome.seconds)
        if outcome.failures:
            self.failed_examples += 1
            self.failed.update({failure.category for failure in outcome.failures})
        elif outcome.refusals:
            self.refused.update({refusal.stage for refusal in outcome.refusals})
        else:
            self.passed += 1

    def line(self) -> str:
        """`examples run, passed, refused, failed (by category)` in one line."""
        def by(counter: Counter) -> str:
            return f" ({', '.join(f'{k} {v}' for k, v in counter.most_common())})" if counter else ""

        timing = ", ".join(f"{b} {sum(s) / len(s):.1f} s" for b, s in self.seconds.items())
        return (f"hfexport fuzz: {self.run} examples run: {self.passed} passed, {sum(self.refused.values())} refused"
                f"{by(self.refused)}, {self.failed_examples} failed{by(self.failed)}, {self.invalid} invalid; "
                f"{len(self.findings)} distinct failure(s), {self.shrink_runs} shrinking run(s); "
                f"mean per example: {timing or '-'}")


class _Session:
    """The state of one `fuzz` run across its hypothesis rounds."""

    def __init__(self, options: FuzzOptions, out: Any = sys.stdout, err: Any = sys.stderr):
        self.options, self.out, self.err = options, out, err
        self.summary = FuzzSummary()
        self.latest: dict[tuple[str, ...], Finding] = {}  # new failures of this round, last (minimal) example
        self.outcomes: dict[str, Outcome] = {}  # by example, as JSON
        self.round_shrink_runs = 0
        self.shrinking = False

    def check(self, example: Example) -> None:
        """The hypothesis test: run `example`, count it, raise for a failure not found before."""
        if self.shrinking:  # only the parts that failed: shrinking runs many candidates
            example = example.only(self._shrinking_modes())
        outcome = self.outcomes.get(example.to_json())
        if outcome is None:  # hypothesis repeats examples (each round starts with the simplest one)
            if self.shrinking and self.round_shrink_runs >= self.options.shrink_budget:
                return  # out of shrinking budget: an unseen candidate passes, so shrinking ends
            if not self.shrinking and self.summary.run >= self.options.examples:
                return  # the budget is spent: hypothesis's remaining draws pass unrun
            outcome = run_example(example)
            self._remember(example, outcome)
            self._count(example, outcome)
        new = [f for f in outcome.failures if f.key() not in self.summary.findings]
        if not new:
            return
        key = new[0].key()
        found_at = self.latest[key].found_at if key in self.latest else self.summary.run
        self.latest[key] = Finding(key, example.only([_part(new[0].stage)]), new[0], found_at)
        self.shrinking = True  # hypothesis stops generating soon after a failure, then shrinks
        raise _failure_type(key)(f"{new[0].category}: {new[0].message}")

    def _remember(self, example: Example, outcome: Outcome) -> None:
        """Keep `outcome` for `example`, and each part's share of it for the example of that part
        alone (what shrinking and hypothesis's final replay ask for)."""
        self.outcomes[example.to_json()] = outcome
        for mode in example.modes if len(example.modes) > 1 else ():
            def mine(entries: list[Failure], mode: str = mode) -> list[Failure]:
                return [entry for entry in entries if _part(entry.stage) == mode]

            part = dataclasses.replace(outcome, failures=mine(outcome.failures), refusals=mine(outcome.refusals))
            self.outcomes.setdefault(example.only([mode]).to_json(), part)

    def _shrinking_modes(self) -> set[str]:
        return {finding.example.modes[0] for finding in self.latest.values()}

    def _count(self, example: Example, outcome: Outcome) -> None:
        if self.shrinking:
            self.summary.shrink_runs += 1
            self.round_shrink_runs += 1
        else:
            self.summary.count(example, outcome)
        self._progress(example, outcome)

    def _progress(self, example: Example, outcome: Outcome) -> None:
        if not self.options.progress:
            return
        where = f"shrink {self.summary.shrink_runs}" if self.shrinking else str(self.summary.run)
        worst = outcome.failures or outcome.refusals
        detail = f": {worst[0].category}: {worst[0].message.splitlines()[0][:160]}" if worst else (
            f": {outcome.invalid}" if outcome.invalid else "")
        print(f"[{where}] {example.label()}: {outcome.status} ({outcome.seconds:.1f} s){detail}",
              file=self.err, flush=True)

    def end_round(self) -> list[Finding]:
        """Keep this round's new failures (their shrunk examples); print and report them."""
        found = list(self.latest.values())
        for finding in found:
            self.summary.findings[finding.key] = finding
            self._print_finding(finding)
        self.latest, self.shrinking, self.round_shrink_runs = {}, False, 0
        return found

    def _print_finding(self, finding: Finding) -> None:
        failure = finding.failure
        print(f"\n=== failure: {failure.category} on {finding.example.arch} ({finding.example.backend})"
              f"{', ' + failure.error_type if failure.error_type else ''}", file=self.out)
        print(failure.message, file=self.out)
        shrunk = "shrunk to" if self.options.shrink else "example"
        print(f"--- reproduction ({shrunk}: {finding.example.label()})", file=self.out)
        print(reproduction(finding.example, failure.stage), file=self.out)
        print(f"--- or: {replay_command(finding.example)}\n", file=self.out, flush=True)
        if self.options.report:
            with open(self.options.report, "a", encoding="utf-8") as report:
                report.write(finding.markdown(self.options.seed))


def _settings(options: FuzzOptions, budget: int) -> Any:
    from hypothesis import HealthCheck, Phase, Verbosity, settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if options.shrink else [])
    return settings(max_examples=budget, deadline=None, phases=phases, verbosity=Verbosity.quiet,
                    database=DirectoryBasedExampleDatabase(options.database) if options.database else None,
                    suppress_health_check=list(HealthCheck), report_multiple_bugs=True, print_blob=False)


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


def _round(session: _Session, seed: int, budget: int) -> list[Finding]:
    """One hypothesis run of up to `budget` examples; it ends early, shrinking, at a new failure."""
    import hypothesis

    options = session.options

    @_settings(options, budget)
    @hypothesis.seed(seed)
    @hypothesis.given(examples(options.backends, options.archs, options.modes))
    def check(example: Example) -> None:
        session.check(example)

    try:
        check()
    except Exception as error:  # noqa: BLE001 - hypothesis re-raises the shrunk failures: they are the findings
        unexpected = [leaf for leaf in _leaves(error) if not isinstance(leaf, FuzzFailure)]
        if unexpected:
            raise unexpected[0]
    return session.end_round()


def fuzz(options: FuzzOptions, out: Any = sys.stdout, err: Any = sys.stderr) -> FuzzSummary:
    """Run `options.examples` examples (rounds of new seeds after each failure found) and return the summary."""
    _check_options(options)
    session = _Session(options, out, err)
    round_seed = options.seed
    empty_rounds = 0
    with _quiet():
        while session.summary.run < options.examples and empty_rounds < _EMPTY_ROUNDS:
            before = session.summary.run
            # room for the examples hypothesis repeats (not run again); those past the budget pass unrun
            _round(session, round_seed, 2 * (options.examples - before) + 10)
            # a round can end having drawn nothing new (only examples already run, seen after a
            # failure ended the previous round early); the next seeds draw others
            empty_rounds = empty_rounds + 1 if session.summary.run == before else 0
            round_seed += 1_000_003  # the next round draws new examples (a round ends at a new failure)
    return session.summary


#: Rounds in a row that may draw no new example before `fuzz` stops short of its budget.
_EMPTY_ROUNDS = 5


def _check_options(options: FuzzOptions) -> None:
    for name, given, allowed in (("backend", options.backends, BACKENDS), ("mode", options.modes, MODES),
                                 ("architecture", options.archs, tuple(ARCHS))):
        wrong = [g for g in given if g not in allowed]
        if wrong or not given:
            raise ValueError(f"unknown {name} {wrong or given}; choose from {', '.join(allowed)}")
    if options.examples < 1:
        raise ValueError(f"--examples must be at least 1, got {options.examples}")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Upstream deprecation and tracing warnings off: one line per example is the fuzzer's output."""
    import logging

    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    # hfexport's warnings too: the checks judge what they warn of
    loggers = [logging.getLogger(name) for name in ("torch", "hfexport")]
    previous = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
        for logger, old in zip(loggers, previous):
            logger.setLevel(old)


# -- the command --------------------------------------------------------------------------------


def _names(value: str | None, default: Sequence[str]) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else tuple(default)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m hfexport.fuzz` and `hfexport fuzz`."""
    parser.add_argument("--examples", type=int, default=20, help="examples to run, shrinking apart (default 20)")
    parser.add_argument("--backends", help=f"comma-separated (default: dynamo; any of {','.join(BACKENDS)})")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed: the same seed draws the same examples")
    parser.add_argument("--archs", help=f"comma-separated presets (default: {','.join(DEFAULT_ARCHS)})")
    parser.add_argument("--seq2seq", action="store_true", help="also draw the encoder-decoder T5")
    parser.add_argument("--modes", help="comma-separated: export (one graph), generate (components); default both")
    parser.add_argument("--no-shrink", action="store_true", help="report failures as found, unshrunk (faster)")
    parser.add_argument("--shrink-budget", type=int, default=20,
                        help="examples run while shrinking the failures of one round (default 20)")
    parser.add_argument("--database", help="a hypothesis example database folder (default: none)")
    parser.add_argument("--report", help="append each distinct failure, with its reproduction, to this Markdown file")
    parser.add_argument("--replay", metavar="JSON", help="run one example (as printed with a failure) and exit")
    parser.add_argument("--quiet", "-q", action="store_true", help="no per-example progress on stderr")


def options_from_args(args: argparse.Namespace) -> FuzzOptions:
    """`FuzzOptions` from the parsed command line (`add_arguments`)."""
    archs = _names(args.archs, DEFAULT_ARCHS) + (("t5",) if args.seq2seq and not args.archs else ())
    return FuzzOptions(examples=args.examples, backends=_names(args.backends, ("dynamo",)), archs=archs,
                       modes=_names(args.modes, MODES), seed=args.seed, shrink=not args.no_shrink,
                       shrink_budget=args.shrink_budget,
                       database=args.database, report=args.report, progress=not args.quiet)


def replay(text: str, out: Any = sys.stdout) -> int:
    """Run the one example `text` (an `Example` as JSON); print its outcome; 1 if it failed."""
    example = Example.from_json(text)
    with _quiet():
        outcome = run_example(example)
    print(f"{example.label()}: {outcome.status} ({outcome.seconds:.1f} s)", file=out)
    for entry in outcome.failures + outcome.refusals:
        print(f"  {entry.category}{' (refused)' if entry in outcome.refusals else ''}: {entry.message}", file=out)
    for note in outcome.notes:
        print(f"  note: {note}", file=out)
    for failure in outcome.failures[:1]:
        print(f"--- reproduction\n{reproduction(example, failure.stage)}", file=out)
    return 1 if outcome.failures else 0


def run(args: argparse.Namespace, out: Any = sys.stdout) -> int:
    """Run the command: 0 when no failure was found, 1 otherwise."""
    import importlib.util

    if args.replay:
        return replay(args.replay, out)
    if importlib.util.find_spec("hypothesis") is None:
        raise ImportError('hfexport fuzz draws its examples with hypothesis: pip install "hfexport[test]"')
    summary = fuzz(options_from_args(args), out)
    print(summary.line(), file=out)
    return 1 if summary.failed_examples else 0


def main(argv: list[str] | None = None) -> int:
    """`python -m hfexport.fuzz`: 0 no failure found, 1 failures found, 2 bad options."""
    parser = argparse.ArgumentParser(prog="python -m hfexport.fuzz",
                                     description="Differential fuzzer: tiny decoders exported dynamic vs eager.")
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except (ValueError, ImportError) as error:
        print(f"hfexport fuzz: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
