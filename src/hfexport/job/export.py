"""`export_to_folder`: the one export job every front end calls.

```
export_to_folder(model, config, out, JobOptions(loading=..., judging=..., generation=...))
  load      a preset (`tiny:llama`), a folder written by `save_pretrained`, a hub id, a GGUF file, or a
            model you built (`LoadingOptions`)
  task      what to export (`hfexport.generation.tasks`): asked for, inferred (`task="auto"`: a causal LM gets its
            runtime's LLM package), or left to `generate`/`static_cache` (`task=None`; `GenerationOptions`)
  export    one graph of the model, or its generation components (`generate=True`)
  validate  each artifact in its runtime against eager, at the sample shape and shapes that differ
            (`JudgingOptions`)
  save      a staged folder moved into place: artifacts, manifest, configs, report
```
The options are `JobOptions` (`job/options.py`), in groups that check their values when built.
The CLI (`hfexport export`), the coverage matrix's cases and the examples call it; they parse
and print, nothing more. A failed export or validation writes nothing.

```python
from hfexport import OnnxConfig
from hfexport.job import export_to_folder

result = export_to_folder("tiny:llama", OnnxConfig(dynamic=True), "out/tiny-llama")
result.reports["model"].passed, result.manifest["components"]["model"]["files"]   # True, ['model.onnx']
```
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..capture.record import record_of
from ..config import ExportConfig
from ..errors import DtypeRefusedError, ExportError, ValidationError
from ..folder.output_folder import claimed_folder, model_folder
from ..generation.accuracy import DEFAULT_TOKENS, default_min_agreement, quantized_criteria
from ..generation.components import package_task
from ..generation.tasks import GenerationFlags, graph_component, resolve_task
from ..loading import dtype_name, weight_bytes
from ..timing import Phases, fewer_collections, phase, recording
from .options import STATIC_CACHE_OR_CONFIG, GenerationOptions, JobOptions, JudgingOptions, LoadingOptions
from .runner_check import runner_check, skipped_entry

__all__ = ["export_to_folder", "JobOptions", "LoadingOptions", "JudgingOptions", "GenerationOptions",
           "ExportJobResult", "default_min_cosine", "default_min_cache_cosine", "default_min_agreement"]

logger = logging.getLogger("hfexport")


@dataclasses.dataclass
class ExportJobResult:
    """What `export_to_folder` made: the folder, each artifact with its validation report, the
    manifest written beside them and the report (`report.json`)."""

    directory: Path
    model: Any
    inputs: dict[str, Any]
    artifacts: dict[str, Any]
    components: dict[str, tuple[Any, dict[str, Any]]]
    reports: dict[str, Any]
    manifest: dict[str, Any]
    report: dict[str, Any]

    @property
    def passed(self) -> bool:
        """Whether every artifact was validated and matched eager."""
        return bool(self.reports) and all(report.passed for report in self.reports.values())

    def files(self, component: str = "model") -> list[Path]:
        """The files of one component as written (its main file first): `files("decode")[0]`."""
        return [self.directory / name for name in self.manifest["components"][component]["files"]]


def default_min_cosine(quantize: Any) -> float | None:
    """How close a quantized artifact's logits (every output but the cache) must stay to fp32
    eager, as cosine similarity: `generation.accuracy.quantized_criteria(quantize).min_cosine`
    (measured on a real LLM there); `None` (the fp32 tolerance) unquantized."""
    criteria = quantized_criteria(quantize)
    return criteria.min_cosine if criteria else None


def default_min_cache_cosine(quantize: Any) -> float | None:
    """The same for each cache tensor a generation component returns (looser: see
    `hfexport.validation`); `None` unquantized."""
    criteria = quantized_criteria(quantize)
    return criteria.min_cache_cosine if criteria else None


class _Silent:
    """The progress reporter used when the caller gives none."""

    total: int | None = None

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[None]:
        yield

    part = step

    def count(self, done: int, total: int | None, what: str) -> None:
        """How far the running step is: nothing to show."""


class _Timed:
    """A progress reporter that passes each step on to `inner` and keeps its seconds by label
    (`seconds`, the report's `job_seconds`: where an export's time went)."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.seconds: dict[str, float] = {}

    @property
    def total(self) -> int | None:
        return self.inner.total

    @total.setter
    def total(self, value: int | None) -> None:
        self.inner.total = value

    def step(self, label: str) -> contextlib.AbstractContextManager[None]:
        """The next step, `label`."""
        return self._timed(label, self.inner.step)

    def part(self, label: str) -> contextlib.AbstractContextManager[None]:
        """A part of the current step (shown as a step of its own by a reporter without `part`)."""
        return self._timed(label, getattr(self.inner, "part", self.inner.step))

    @contextlib.contextmanager
    def _timed(self, label: str, show: Any) -> Iterator[None]:
        start = time.perf_counter()
        try:
            with show(label):
                yield
        finally:
            self.seconds[label] = round(time.perf_counter() - start, 3)

    def count(self, done: int, total: int | None, what: str) -> None:
        """Pass how far the running step is (`count(2, 3, "shape")`) on to `inner`, when it shows counts."""
        if (count := getattr(self.inner, "count", None)) is not None:
            count(done, total, what)


def export_to_folder(model: Any, config: ExportConfig, out: str | os.PathLike, options: JobOptions | None = None, *,
                     llm_runner: bool | None = None, **changes: Any) -> ExportJobResult:
    """Load `model`, export it with `config`, validate every artifact against eager and write
    the export to `out`; return what was made.

    Args:
        model: `"tiny:<preset>"`, a folder written by `save_pretrained`, a hub id, a `.gguf` file
            (dequantized to float32, `loading.load_gguf`), a `loading.LoadedModel`, or `(model, inputs)`.
        config: the export config (its format picks the exporter).
        out: the folder to write: new or empty, or an earlier export with `overwrite=True`
            (`output_folder`: never the working, home or model folder, nor one holding other files).
        options: what to do besides the config (`JobOptions`); `changes` are its fields given as
            keywords (`export_to_folder(m, config, out, generation=GenerationOptions(generate=True))`),
            over `options`; an option of a group by its own name (`generate=True`) is deprecated
            (`DeprecationWarning`; removed in the next release).
        llm_runner: the config's `llm_runner` (`ExecutorchConfig.llm_runner`), given here;
            `False` is accepted by every format (the components, what the others export anyway).

    Returns:
        An `ExportJobResult`.

    Raises:
        ExportError: a step failed (the subclass names it; nothing was written).
        ValidationError: an artifact differs from eager; `error.reports` holds every report and
            nothing was written.
    """
    options = (options or JobOptions()).changed(changes, caller="export_to_folder")
    if llm_runner is not None:
        if "llm_runner" in {field.name for field in dataclasses.fields(config)}:
            config = config.replace(llm_runner=llm_runner)
        elif llm_runner:  # False asks for the components, which every other format exports anyway
            raise ValueError(f"llm_runner is not an option of {type(config).__name__} (format "
                             f"{config.export_format!r}); leave it unset")
    target = Path(out).resolve()
    # one writer from here to the final rename; the folder's rules checked before the slow part
    with claimed_folder(out, overwrite=options.overwrite, source=model_folder(model),
                        example=_example_output(target, model, config)), fewer_collections():
        return _export(model, config, target, options)


def _generation_request(config: ExportConfig, flags: GenerationFlags, generation_config: Any) -> tuple[bool, Any, bool]:
    """`(generate, generation_config, multi_token_decode)` the generation options `flags` ask for
    (`static_cache=N` implies the other two)."""
    generate, multi_token_decode = flags.generate, flags.multi_token_decode
    if flags.static_cache is not None:
        generation_config = _static_cache(flags.static_cache, generation_config)
        generate = multi_token_decode = True
    if not generate and (asked := config.generation_options()):
        raise ValueError(f"{', '.join(asked)} of {type(config).__name__} shape(s) a generation export: pass "
                         "generate=True (--generate) or static_cache=N (--static-cache N)")
    return generate, generation_config, multi_token_decode


def _chosen_task(package: Any, options: GenerationOptions, model: Any) -> tuple[GenerationFlags, dict[str, Any], str]:
    """The generation options the export runs with, the report's `task` entry and the task's name:
    the task `resolve_task` chose, its package as the format's runtime package makes it
    (`RuntimePackage.request`)."""
    choice = resolve_task(options.task, model, options.flags)
    flags, entry = choice.flags, choice.to_dict()
    if choice.exports == "package":
        flags, entry["cache"] = package.request(model, flags.static_cache)
    return flags, entry, choice.task


def _export(model: Any, config: ExportConfig, target: Path, options: JobOptions) -> ExportJobResult:
    """`export_to_folder`.s steps, in the folder it claimed."""
    from ..auto import AutoHfExporter

    loading, judging = options.loading, options.judging
    steps = _Timed(options.progress or _Silent())
    exporter = AutoHfExporter.from_config(config)
    choice = _choice(options.quantize)
    if choice is not None:  # an option the format cannot honour, or an unreadable prompt file, fails before loading
        choice.quantizer(config.export_format)
        if choice.calibration_data is not None:
            from ..quantization.calibration import read_prompts

            read_prompts(choice.calibration_data)
    steps.total = 5 if judging.validate else 4  # the checks on the written folder are parts of writing
    gguf = loading.gguf_file
    refuse_dtype(config, loading.dtype)  # before loading anything, when the dtype is named
    with steps.step(f"loading {_describe(model)}{f' ({gguf})' if gguf else ''}"):
        loaded = _load(model, loading.prompt, gguf, revision=loading.revision,
                       trust_remote_code=loading.trust_remote_code, dtype=loading.dtype)
    refuse_dtype(config, dtype_name(loaded.model))  # "auto", or a model given loaded: the dtype it has
    package = exporter.runtime_package(package_task(loaded.model))  # the runtime's package for what the model reads
    config = package.folder_config(config)
    flags, task, task_name = _chosen_task(package, options.generation, loaded.model)
    generate, generation_config, multi_token_decode = _generation_request(config, flags,
                                                                          options.generation.generation_config)
    config, quantization = _with_quantizer(config, options.quantize if choice is None else choice, loaded, generate)
    with steps.step("running generate() to find the components" if generate else "preparing inputs"):
        components, plan = _components(package, config, loaded, generate, generation_config, multi_token_decode,
                                       flags.static_cache, task_name)
        calibration = _captured_calibration(package, loaded, plan, config, quantization)
    if plan is not None:  # what the backend made of the request (its own program: a static cache)
        config, generation_config = plan.config, plan.generation_config
    exported: list[str] = []

    def exporting(name: str, module: Any):
        """Exporting the components is one step, each component a part of it."""
        exported.append(name)
        show = steps.step if len(exported) == 1 else steps.part
        return show(f"exporting {name} ({type(module).__name__}) to {config.export_format}")

    # the job validates every component itself, so the exporter does not validate once more
    artifacts = exporter.export_components(components, config.replace(validate=False) if config.validate else config,
                                           on_component=exporting, calibrate_on_captured=generate,
                                           calibration=calibration)
    timing = Phases()  # the report's `timing`: each component's phases, then the folder's
    for name, artifact in artifacts.items():
        timing.add(name, record_of(artifact).details.get("stage_seconds", {}))
    for name, details in (plan.record_details if plan is not None else {}).items():
        if name in artifacts:  # the component's record says what the plan decided, as the report does
            record_of(artifacts[name]).details.update(details)
    reports: dict[str, Any] = {}
    criteria = quantized_criteria(config.quantizer)
    min_cosine, min_cache_cosine, min_mean_cosine = judging.min_cosine, judging.min_cache_cosine, None
    gated = judging.validate and generate and criteria is not None  # the accuracy gate judges the export
    # ... over a real prompt's steps; then validation's default cosine floors only report (`validation`)
    advisory = (f"the accuracy gate judges the quantized logits over up to {judging.accuracy_tokens or DEFAULT_TOKENS} "
                "teacher-forced steps" if gated and min_cosine is None and min_cache_cosine is None else None)
    if criteria is not None:  # a floor given lowers the defaults it is above, never raises them
        given = min_cosine
        min_cosine = criteria.min_cosine if given is None else given
        if min_cache_cosine is None:
            min_cache_cosine = min(criteria.min_cache_cosine, min_cosine)
        min_mean_cosine = criteria.min_mean_cosine if given is None else min(criteria.min_mean_cosine, given)
    if judging.validate:
        with steps.step(f"validating in {config.export_format}'s runtime against eager"), recording(timing, "folder"):
            reports = _validated(artifacts, components, target, atol=judging.atol, rtol=judging.rtol,
                                 min_cosine=min_cosine, min_cache_cosine=min_cache_cosine, cosine_advisory=advisory,
                                 on_case=lambda name, done, total: steps.count(done, total, f"{name}: shape"))
    report = {**_report(loaded, config, artifacts, reports, generate, options.quantize), "task": task,
              **({"quantization": quantization} if quantization is not None else {}),
              "job_seconds": dict(steps.seconds), **(plan.report if plan is not None else {})}
    floor = None
    checks = []  # (label, timing phase, check): run on the staged folder, in order
    if gated:
        floor = judging.min_agreement if judging.min_agreement is not None else criteria.min_agreement
        checks.append(("comparing the quantized export's greedy tokens with fp32 eager", "gate",
                       _accuracy_gate(loaded, generation_config, target, judging.accuracy_tokens, floor,
                                      min_mean_cosine)))
    if generate and package.has_runner:
        if judging.validate:
            checks.append((f"running the folder in {config.export_format}'s own LLM runner", "validate",
                           _runner_check(package, loaded, generation_config, floor)))
        else:
            report.update(skipped_entry())

    with contextlib.ExitStack() as writing:
        writing.enter_context(steps.step(f"writing {target}"))

        def check(folder: Path) -> dict[str, Any]:
            """The checks' results (the accuracy gate's, the runtime runner's) and the timing, added to the
            written report."""
            writing.close()  # the folder is written (staged): its step ends, and each check is a part after it
            found: dict[str, Any] = {}
            for label, timed_as, run in checks:
                with steps.part(label), phase(timed_as):
                    found.update(run(folder))
            return {**found, "timing": timing.to_dict()}

        with recording(timing, "folder"), phase("serialise"):
            saved = _save(exporter, artifacts, target, loaded, config, generate, generation_config,
                          options.overwrite, report, plan, check=check)
    return ExportJobResult(target, loaded.model, loaded.inputs, artifacts, components, reports, saved.manifest,
                           saved.report)


def _example_output(target: Path, model: Any, config: ExportConfig) -> str:
    """A new folder's path to suggest when `target` is refused: `<target>/<model>-<format>`."""
    name = Path(str(model)).name.removesuffix(".gguf").replace("tiny:", "") if isinstance(model, (str, os.PathLike)) \
        else "model"
    return str(target / f"{name or 'model'}-{config.export_format}")


def _static_cache(length: int, generation_config: Any) -> Any:
    """The static cache of `length` tokens as a generation config (`GenerationOptions` checked the
    length; a generation config given with the cache a package asks for by default is refused here)."""
    if generation_config is not None:
        raise ValueError(STATIC_CACHE_OR_CONFIG)
    from transformers import GenerationConfig

    return GenerationConfig(cache_implementation="static", max_cache_len=length)


def _describe(model: Any) -> str:
    if isinstance(model, str):
        return model
    if isinstance(model, tuple):
        return type(model[0]).__name__
    return getattr(model, "source", type(model).__name__)


def refuse_dtype(config: ExportConfig, dtype: str) -> None:
    """Raise `DtypeRefusedError` when `config`'s format cannot run `dtype` (`ExportConfig.dtype_refusal`);
    `"auto"` is checked once the model is loaded."""
    if dtype != "auto" and (why := config.dtype_refusal(dtype)):
        raise DtypeRefusedError(f"--format {config.export_format} cannot export in {dtype}: {why}",
                                remedy=f"pass --dtype {' or --dtype '.join(config.dtypes())} (dtype=...)")


def _load(model: Any, prompt: str, gguf_file: str | None = None, *, revision: str | None = None,
          trust_remote_code: bool = False, dtype: str = "float32") -> Any:
    """`model` as a `LoadedModel` (a spec is loaded in `dtype`; a model built in Python is taken as it is,
    in its own dtype)."""
    from ..loading import LoadedModel, load_model

    if gguf_file is not None and not isinstance(model, (str, os.PathLike)):
        raise TypeError("gguf_file names a file in the folder or hub repo `model` names; pass that as `model`")
    if (revision is not None or trust_remote_code) and not isinstance(model, (str, os.PathLike)):
        raise TypeError("revision and trust_remote_code say how to load a model spec; `model` is already loaded")
    if isinstance(model, LoadedModel):
        return model
    if isinstance(model, (str, os.PathLike)):
        return load_model(os.fspath(model), prompt=prompt, gguf_file=gguf_file, revision=revision,
                          trust_remote_code=trust_remote_code, dtype=dtype)
    if isinstance(model, tuple) and len(model) == 2:
        return LoadedModel(model[0], dict(model[1]), type(model[0]).__name__,
                           tokenizer_missing="a model given with its inputs comes without one")
    raise TypeError(f"export_to_folder takes a model spec, a LoadedModel or (model, inputs); got {type(model).__name__}")


def _choice(quantize: Any) -> Any:
    """`quantize` as a `QuantizationChoice` (a scheme name is one), or `None` (none, or a quantizer object)."""
    from ..quantization import QuantizationChoice

    if isinstance(quantize, str):
        return QuantizationChoice(scheme=quantize)
    return quantize if isinstance(quantize, QuantizationChoice) else None


def _with_quantizer(config: ExportConfig, quantize: Any, loaded: Any, generate: bool) -> tuple[ExportConfig, Any]:
    """`(config, record)`: `config` with the quantizer `quantize` names, and the report's record of
    the choice (`None` for a quantizer object). A quantizer that runs on data is calibrated on the
    chosen prompts (`job.calibration.calibration_for`); any other keeps the sample inputs."""
    if quantize is None or not hasattr(quantize, "quantizer"):
        return (config if quantize is None else config.replace(quantizer=quantize)), None
    from .calibration import calibration_for

    fmt = config.export_format
    quantizer, record = quantize.quantizer(fmt), quantize.to_dict(fmt)
    if quantizer is not None and quantizer.needs_calibration:
        calibration, record["calibration"] = calibration_for(quantize, loaded, generate)
        quantizer = quantizer.with_calibration(calibration)
    elif quantizer is not None:
        quantizer = quantizer.with_calibration([loaded.inputs])
    return config.replace(quantizer=quantizer, **quantize.config_changes(fmt)), record


def _components(package: Any, config: ExportConfig, loaded: Any, generate: bool, generation_config: Any,
                multi_token_decode: bool, static_cache: int | None, task: str) -> tuple[dict[str, Any], Any]:
    """`({name: (module, kwargs)}, plan)`: the one graph `task` names (plan `None`,
    `tasks.graph_component`), or the generation components as the format's runtime package plans
    them (`RuntimePackage.plan`)."""
    if not generate:
        if generation_config is not None or multi_token_decode:
            raise ValueError("generation_config and multi_token_decode shape the generation components: "
                             "pass generate=True (--generate)")
        return {"model": graph_component(task, loaded.model, loaded.inputs)}, None
    plan = package.plan(loaded.model, _prompt(loaded.inputs), config, generation_config, multi_token_decode,
                        static_cache=static_cache)
    return package.components(loaded.model, plan), plan


def _prompt(inputs: dict[str, Any]) -> dict[str, Any]:
    """`inputs` as a prompt to `generate()`, which starts an encoder-decoder's decoder itself: the encoder's inputs."""
    return {k: v for k, v in inputs.items() if not k.startswith("decoder_")}


def _captured_calibration(package: Any, loaded: Any, plan: Any, config: ExportConfig,
                          quantization: dict[str, Any] | None) -> dict[str, list[dict[str, Any]]] | None:
    """`{component: [kwargs, ...]}` a generation export's quantizer calibrates each component on:
    its inputs captured on every calibration prompt (`generation.calibration`), the report's
    `quantization.calibration` saying how many per component; `None` where nothing calibrates on
    prompts (one graph, a quantizer object, a model without a tokenizer: the captured sample)."""
    if plan is None or not (quantization or {}).get("calibration") or loaded.tokenizer is None:
        return None
    from ..generation.calibration import captured_calibration

    prompts = [_prompt(sample) for sample in config.quantizer.calibration]
    captured = captured_calibration(lambda asked: package.components(loaded.model, asked), plan, prompts)
    quantization["calibration"]["samples_per_component"] = {name: len(s) for name, s in captured.items()}
    return captured


def _validated(artifacts: dict[str, Any], components: dict[str, Any], target: Path, **options: Any) -> dict[str, Any]:
    """Every artifact validated against its eager module; `ValidationError` (holding every report)
    when one differs."""
    from ..validation.driver import validate_components

    reports = validate_components(artifacts, components, **options)
    for name, report in reports.items():
        if not report.passed:
            failed = [o for case in report.cases for o in case.outputs if not o.passed and o.cosine is not None]
            worst = min(failed, key=lambda o: o.cosine) if report.min_cosine is not None and failed else None
            wrong = next((f"{case.label} case, {o.name}: {o.error}" for case in report.cases for o in case.outputs
                          if not o.passed and o.error), None)  # a shape, integer or non-finite mismatch
            distance = (f"cosine similarity {worst.cosine:.4f} for {worst.name}" if worst
                        else wrong or f"max abs difference {report.max_abs:.3g}")
            accept = ("their shapes, integer values or non-finite values differ, which no cosine floor accepts "
                      "(the floors were advisory)" if report.cosine_advisory else
                      "pass a larger tolerance (--tolerance; a quantized export: --min-cosine, --min-cache-cosine) "
                      "to accept the difference")
            error = ValidationError(
                f"the exported {name!r} differs from eager PyTorch ({distance}); nothing was written to {target}",
                model=record_of(artifacts[name]).model_class,
                remedy=f"look at the failing outputs in the report; {accept}; or validate=False (--no-validate) "
                "to write the artifacts anyway",
            )
            error.reports = reports
            raise error
    return reports


def _report(loaded: Any, config: ExportConfig, artifacts: dict[str, Any], reports: dict[str, Any], generate: bool,
            quantize: Any) -> dict[str, Any]:
    """What `report.json` says (files and sizes are added when the export is saved)."""

    seconds = {name: record_of(artifact).details.get("export_seconds", 0.0) for name, artifact in artifacts.items()}
    quantizer = config.quantizer
    return {
        "model": loaded.source,
        "model_class": type(loaded.model).__name__,
        "format": config.export_format,
        "dtype": dtype_name(loaded.model),
        "generate": bool(generate),
        "export_seconds": round(sum(seconds.values()), 3),
        "quantize": quantize if isinstance(quantize, str) else (quantizer.scheme if quantizer is not None else None),
        "weight_bytes": weight_bytes(loaded.model),
        # the share mapped from the checkpoint, not copied (`loading.mapped_share`); None: not from a folder
        "weights_mapped": None if loaded.weights_mapped is None else round(loaded.weights_mapped, 4),
        # a GGUF file's quantization, the weights dequantized (`loading.gguf_weights`); None: a checkpoint
        "weights_from": loaded.weights_from,
        # without a tokenizer the sample inputs come from the config, and the export has no text prompt nor chat
        "tokenizer": {"loaded": True} if loaded.tokenizer is not None
        else {"loaded": False, "why": getattr(loaded, "tokenizer_missing", None)},
        # the end token taken from the tokenizer where the model's configs name none (`loading.with_end_token`)
        **({"end_token": loaded.end_token} if getattr(loaded, "end_token", None) else {}),
        "components": {
            name: {"export_seconds": seconds[name], "record": record_of(artifact).summary(),
                   "validation": reports[name].to_dict() if name in reports else None}
            for name, artifact in artifacts.items()
        },
    }


def _accuracy_gate(loaded: Any, generation_config: Any, target: Path, tokens: int | None,
                   floor: float | None, min_cosine: float | None) -> Any:
    """The check a quantized generation export passes before it is written: its greedy tokens
    against fp32 eager (`generation.accuracy.greedy_agreement`), their agreement held to `floor`
    and their mean logits cosine to `min_cosine`."""
    from ..generation.accuracy import greedy_agreement

    def gate(folder: Path) -> dict[str, Any]:
        try:
            found = greedy_agreement(folder, loaded.model, loaded.inputs, generation_config=generation_config,
                                     new_tokens=tokens or DEFAULT_TOKENS, min_agreement=floor,
                                     min_mean_cosine=min_cosine,
                                     verify=False,  # the folder it is writing, hashed a moment ago
                                     extractor=getattr(loaded.processor, "feature_extractor", None))  # speech: clips
        except ExportError:
            raise
        except Exception as error:  # noqa: BLE001 - the export failing to run is a refusal too, chained
            raise ValidationError(
                f"the quantized export could not be compared with fp32 eager generate(): hfexport's runner failed "
                f"on it ({type(error).__name__}: {error}); nothing was written to {target}",
                model=type(loaded.model).__name__,
                remedy="run `hfexport generate` on it written with --no-validate to see the failure, and report "
                "this; an export without --quantize is not gated") from error
        if not found.passed:
            error = ValidationError(
                f"the quantized export's greedy tokens agree with fp32 eager generate() on {found.agreement:.0%} of "
                f"{found.tokens} steps (floor {_floor(floor, '.0%')}; first difference at step "
                f"{found.first_difference}), their logits' cosine with eager's is {found.mean_cosine:.4f} on average "
                f"(floor {_floor(min_cosine, '.4g')}, lowest {found.min_cosine:.3f}); nothing was written to {target}",
                model=type(loaded.model).__name__,
                remedy="choose a milder scheme (int8 rather than int4, a smaller group size, int8-dynamic rather than "
                "int8-static), or lower the floors "
                "(--min-agreement / min_agreement=, --min-cosine / min_cosine=) to accept it")
            error.accuracy = found
            raise error
        return {"accuracy": found.to_dict()}

    return gate


def _runner_check(package: Any, loaded: Any, generation_config: Any, floor: float | None) -> Any:
    """The check that the packaged folder runs in its runtime's own LLM runner with eager's greedy
    tokens (`job.runner_check`; a quantized export against hfexport's runner, at `floor`)."""
    from ..folder.contents import merged_generation_config

    return runner_check(package, loaded.model, loaded.inputs, merged_generation_config(loaded.model, generation_config),
                        min_agreement=floor, processor=loaded.processor)


def _floor(value: float | None, spec: str) -> str:
    return "none" if value is None else format(value, spec)


def _save(exporter: Any, artifacts: dict[str, Any], target: Path, loaded: Any, config: ExportConfig, generate: bool,
          generation_config: Any, overwrite: bool, report: dict[str, Any], plan: Any, check: Any = None) -> Any:
    from ..folder.bundle import FolderContents, save_folder

    contents = FolderContents("generation" if generate else "model", model=loaded.model,
                              generation_config=generation_config, tokenizer=loaded.tokenizer,
                              processor=loaded.processor, export_config=config, report=report,
                              extra={"weights_from": loaded.weights_from} if loaded.weights_from else None, plan=plan)
    return save_folder(exporter, artifacts, target, contents, overwrite=overwrite, check=check)
