"""The checks of one example (`run_example`): its `export` part (one graph, validated, run at
another shape) and its `generate` part (components, the saved export through `GenerationRunner`,
the docs' static-cache decode loop), each compared with eager PyTorch."""

from __future__ import annotations

import dataclasses
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .example import ARCHS, Example, build_example, sample_inputs
from .outcomes import Failure, InvalidExample, Outcome, first_lines, signature

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


class _Abort(Exception):
    """Ends one part of an example after a stage failed (the failure is already recorded)."""


def _is_refusal(stage: str, error: BaseException) -> bool:
    """The library declining a request it cannot meet: an `ExportError` raised while exporting
    whose remedy offers an alternative rather than asking for a bug report."""
    from ..errors import ExportError, ValidationError

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
            text = first_lines(error)
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


def _export_config(backend: str) -> Any:
    from ..auto import AutoExportConfig

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
    from ..capture.record import record_of
    from ..runner import runner_for

    record = record_of(artifact)
    outputs = runner_for(artifact, record).run(record.artifact_inputs(inputs))
    return torch.as_tensor(outputs[record.output_names.index("logits")])


def _check_other_shape(checks: _Checks, example: Example, model: torch.nn.Module, artifact: Any) -> None:
    """Run the artifact at the drawn other shape and compare its logits (padding left out) with eager."""
    from ..validation.compare import DEFAULT_TOLERANCE

    inputs = sample_inputs(example, model, other=True)
    try:
        with torch.no_grad():
            want = model(**inputs).logits
    except Exception as error:  # noqa: BLE001 - eager itself rejects the shape: nothing to compare
        checks.outcome.notes.append(f"other-shape: eager rejects it ({first_lines(error, 1)})")
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
    from ..auto import AutoHfExporter
    from ..validation.driver import validate

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
        raise InvalidExample(f"eager generate() fails: {first_lines(error, 1)}") from error
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
    from ..generation.loop import GenerationRunner

    runner = checks.attempt("runner", GenerationRunner.load, directory, engine="hfexport")
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
    from ..folder.generation_export import GenerationExport

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
    from ..auto import AutoHfExporter
    from ..folder.bundle import FolderContents, save_folder
    from ..generation.decompose import decompose_for_generation
    from ..validation.driver import validate_components

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
        contents = FolderContents("generation", model=model, generation_config=generation_config, export_config=config)
        directory = checks.attempt("save", save_folder, exporter, artifacts, Path(tmp) / "export", contents).directory
        checks.run_part(_check_runner, example, directory, eager)
        if example.cache == "static" and example.multi_token_decode:
            checks.run_part(_check_decode_loop, example, directory, eager)


def _check_eager(model: torch.nn.Module, inputs: dict[str, Any]) -> None:
    try:
        with torch.no_grad():
            model(**inputs)
    except Exception as error:  # noqa: BLE001 - eager itself rejects the inputs: the example is no case
        raise InvalidExample(f"eager forward fails: {first_lines(error, 1)}") from error


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
