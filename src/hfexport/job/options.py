"""What `export_to_folder` is asked besides the format's config: `JobOptions`, in groups that check themselves.

```
JobOptions(loading=LoadingOptions(...), judging=JudgingOptions(...), generation=GenerationOptions(...),
           quantize=..., overwrite=..., progress=...)
  loading     which model and how to load it: prompt, gguf_file, revision, trust_remote_code, dtype
  judging     how the export is held to eager: validate, atol, rtol, min_cosine, min_cache_cosine,
              min_agreement, accuracy_tokens
  generation  what to export: task, generate, generation_config, multi_token_decode, static_cache
```
Each group is a frozen dataclass that refuses a bad value when it is built (`errors.OptionError`,
a `ValueError`, or `TaskError` for a task its options contradict), with the remedy, before anything
is loaded or any folder claimed; the CLI exits 2 for either.

# NOTE: why the flat keywords still work. Until this release `JobOptions(atol=...)` and
# `export_to_folder(..., static_cache=N)` took every option by its own name. They still build the
# same groups, with a `DeprecationWarning` naming the group to use, and reading `options.atol`
# still gives `options.judging.atol`; all of that goes in the next release. `JobOptions.from_dict`
# takes the flat names without a warning: they are the keys of an `export-many` list
# (`batch.OPTIONS`), a file's format rather than a call.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

from ..errors import OptionError
from ..generation.tasks import GenerationFlags, check_task_options
from ..loading import check_dtype

__all__ = ["JobOptions", "LoadingOptions", "JudgingOptions", "GenerationOptions", "FLAT_NAMES"]


def _check_bool(owner: Any, *names: str) -> None:
    for name in names:
        value = getattr(owner, name)
        if not isinstance(value, bool):
            raise OptionError(f"{type(owner).__name__}.{name} is True or False: pass a bool; got {value!r}")


def _check_text(owner: Any, name: str, what: str) -> None:
    value = getattr(owner, name)
    if value is not None and (not isinstance(value, str) or not value):
        raise OptionError(f"{type(owner).__name__}.{name} is {what}: pass a non-empty str, or None; got {value!r}")


def _check_number(owner: Any, name: str, low: float, high: float, what: str) -> None:
    value = getattr(owner, name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low <= value <= high):
        bounds = f">= {low:g}" if math.isinf(high) else f"in [{low:g}, {high:g}]"
        raise OptionError(f"{type(owner).__name__}.{name} is {what}: pass a number {bounds}, or None for the "
                          f"default; got {value!r}")


@dataclasses.dataclass(frozen=True)
class LoadingOptions:
    """Which model `export_to_folder` loads, and how.

    Args:
        prompt: the sample prompt when the model comes with a tokenizer.
        gguf_file: the GGUF file to load in the folder or hub repo `model` names.
        revision: the hub revision (branch, tag or commit) of `model` to load.
        trust_remote_code: run the Python code `model`'s repository names in its config
            (`auto_map`); off unless asked, never implied.
        dtype: the dtype to load, export and validate the model in (`loading.DTYPES`: `"float32"`,
            `"float16"`, `"bfloat16"`, or `"auto"`, the checkpoint's own); validation's default
            tolerance follows it (`validation.default_tolerance`). A format whose runtime cannot run
            it refuses it (`ExportConfig.dtype_refusal`) with the dtypes it can; the report says it.
    """

    prompt: str = "Hello, world!"
    gguf_file: str | None = None
    revision: str | None = None
    trust_remote_code: bool = False
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str) or not self.prompt:
            raise OptionError(f"LoadingOptions.prompt is the sample text the tokenizer makes the inputs of: pass a "
                              f"non-empty str; got {self.prompt!r}")
        _check_text(self, "gguf_file", "the name of a .gguf file in the folder or hub repo `model` names")
        _check_text(self, "revision", "a hub branch, tag or commit")
        _check_bool(self, "trust_remote_code")
        check_dtype(self.dtype)


@dataclasses.dataclass(frozen=True)
class JudgingOptions:
    """How `export_to_folder` holds each artifact to eager before anything is written.

    Args:
        validate: run each artifact in its runtime against eager before anything is written, and
            a generation folder packaged for its runtime's own LLM runner in that runner
            (`job.runner_check`: greedy tokens equal to eager's).
        atol, rtol: validation tolerance (default per format).
        min_cosine: judge by cosine similarity instead: the floor of the logits (every output but
            the cache) in validation (default for a quantized export: `default_min_cosine`, 0.995
            int8, 0.99 int4); the cache's and the accuracy gate's floors are lowered to it where
            they are higher. A quantized generation export with neither floor given is judged by
            the accuracy gate (`min_agreement`), its validation floors advisory (reported, not
            refusing: one position's logits are a lottery under a correct int4 quantization of a
            real LLM, `validation`'s docstring); a floor given binds validation again.
        min_cache_cosine: with `min_cosine`, the floor of each cache tensor in validation
            (default for a quantized export: `default_min_cache_cosine`, 0.95 int8, 0.9 int4;
            else `min_cosine`).
        min_agreement: for a quantized generation export: the share of greedy tokens that must
            equal fp32 eager `generate`'s over `accuracy_tokens` steps (teacher-forced,
            `generation.accuracy`); default `default_min_agreement` (0.7 int8, 0.6 int4). The
            gate also holds the mean of the steps' logits cosines to the criteria's
            `min_mean_cosine` (0.9 int8, 0.75 int4; `min_cosine` where lower). The
            result is in the report (`accuracy`); under a floor nothing is written. The defaults
            are measured on a real LLM (`generation.accuracy.quantized_criteria`).
        accuracy_tokens: steps the accuracy gate compares (default 64, fewer when a static cache
            holds fewer after the prompt).
    """

    validate: bool = True
    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    min_cache_cosine: float | None = None
    min_agreement: float | None = None
    accuracy_tokens: int | None = None

    def __post_init__(self) -> None:
        _check_bool(self, "validate")
        for name in ("atol", "rtol"):
            _check_number(self, name, 0, math.inf, f"the {'absolute' if name == 'atol' else 'relative'} tolerance")
        for name in ("min_cosine", "min_cache_cosine"):
            _check_number(self, name, -1, 1, "a floor of cosine similarity (0.99: close)")
        _check_number(self, "min_agreement", 0, 1, "the share of greedy tokens that must agree (0.7: 70%)")
        tokens = self.accuracy_tokens
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
            raise OptionError(f"JudgingOptions.accuracy_tokens is the number of steps the accuracy gate compares: "
                              f"pass an int >= 1, or None for the default; got {tokens!r}")


#: What `GenerationOptions` says when given both ways of naming a cache (`job.export` says it too, of
#: a package's default static cache and a generation config).
STATIC_CACHE_OR_CONFIG = ("pass static_cache or generation_config, not both (static_cache=N is "
                          "GenerationConfig(cache_implementation='static', max_cache_len=N))")


@dataclasses.dataclass(frozen=True)
class GenerationOptions:
    """What `export_to_folder` exports: one graph, the generation components, or a runtime's LLM package.

    Args:
        task: what to export (`hfexport.generation.tasks.TASKS`): `"text-generation-with-past"` (the runtime's
            LLM package, `RuntimePackage.request`), `"generation-components"`, `"text-generation"`,
            `"feature-extraction"`, `"forward"`; `"auto"` infers it from the model
            (`tasks.infer_task`: a causal LM gets its runtime's LLM package) unless `generate` or
            `multi_token_decode` is given; `None` (default): the options below decide, as before
            tasks. The report's `task` says which and why. A task the options contradict is refused
            (`tasks.check_task_options`).
        generate: export the generation components (`decompose_for_generation`) instead of one
            graph; in an export folder each backend makes them its runtime's own LLM package where
            it can (`RuntimePackage.plan`, `RuntimePackage.write`).
        generation_config: for `generate`: e.g. a static cache
            (`GenerationConfig(cache_implementation="static", max_cache_len=N)`).
        multi_token_decode: for `generate`: `decode` takes any number of new tokens.
        static_cache: the static-cache export in one argument: one `decode` graph over a static
            cache of this many tokens that also prefills (`generate`, `multi_token_decode` and
            `GenerationConfig(cache_implementation="static", max_cache_len=static_cache)`); a
            backend may size its own program by it (ExecuTorch's LLM-runner program).
    """

    task: str | None = None
    generate: bool = False
    generation_config: Any = None
    multi_token_decode: bool = False
    static_cache: int | None = None

    def __post_init__(self) -> None:
        _check_bool(self, "generate", "multi_token_decode")
        check_task_options(self.task, self.flags)
        length = self.static_cache
        if length is not None and self.generation_config is not None:
            raise OptionError(STATIC_CACHE_OR_CONFIG)
        if length is not None and (not isinstance(length, int) or isinstance(length, bool) or length < 2):
            raise OptionError(f"static_cache is the cache length in tokens, an int >= 2; got {length!r}")

    @property
    def flags(self) -> GenerationFlags:
        """The options besides the task, as `tasks.resolve_task` takes them."""
        return GenerationFlags(self.generate, self.multi_token_decode, self.static_cache)


#: The groups of `JobOptions`, by field.
GROUPS = {"loading": LoadingOptions, "judging": JudgingOptions, "generation": GenerationOptions}
#: Every option's flat name (a keyword of `JobOptions` until this release) and the group it is in now.
FLAT_NAMES = {field.name: group for group, cls in GROUPS.items() for field in dataclasses.fields(cls)}


@dataclasses.dataclass(frozen=True, init=False)
class JobOptions:
    """What `export_to_folder` is asked to do besides the format's config.

    Args:
        loading: which model and how to load it (`LoadingOptions`).
        judging: how each artifact is held to eager (`JudgingOptions`).
        generation: what to export (`GenerationOptions`).
        quantize: a quantization scheme name (`"int8-dynamic"`), a `QuantizationChoice` (the
            scheme or optimum's weight format with group size, ratio, symmetry, embedding bits,
            AWQ, scale estimation and calibration prompts: `docs/quantization.md`), or an
            `ExportQuantizer`; `config.quantizer` is used when not given. A scheme or choice that
            runs on data calibrates on `QuantizationChoice.calibration_data` or the built-in
            prompts (`quantization.calibration`); the report's `quantization` says which.
        overwrite: replace an earlier hfexport export in `out`, only the files it wrote.
        progress: an object with `step(label)` (a context manager) and a `total` attribute, told
            each step as it runs (the CLI's progress display), `total` set before the first: loading,
            preparing, exporting, validating (unless `validate=False`), writing; and optionally
            `part(label)`, told each part of a step after its first (the second component exported,
            the checks run on the written folder; else they are steps), and `count(done, total,
            what)`, told how far a long step is (`count(2, 3, "model: shape")` while validating).
        **flat: deprecated: an option of a group by its own name (`atol=...`: `judging=JudgingOptions(atol=...)`),
            with a `DeprecationWarning`; removed in the next release.
    """

    loading: LoadingOptions = dataclasses.field(default_factory=LoadingOptions)
    judging: JudgingOptions = dataclasses.field(default_factory=JudgingOptions)
    generation: GenerationOptions = dataclasses.field(default_factory=GenerationOptions)
    quantize: Any = None
    overwrite: bool = False
    progress: Any = None

    def __init__(self, *, loading: LoadingOptions | None = None, judging: JudgingOptions | None = None,
                 generation: GenerationOptions | None = None, quantize: Any = None, overwrite: bool = False,
                 progress: Any = None, **flat: Any):
        groups = _grouped({"loading": loading, "judging": judging, "generation": generation}, flat)
        if flat:
            _warn_flat("JobOptions", flat, stacklevel=2)
        for name, value in {**groups, "quantize": quantize, "overwrite": overwrite, "progress": progress}.items():
            object.__setattr__(self, name, value)
        _check_bool(self, "overwrite")

    def __getattr__(self, name: str) -> Any:
        """`options.atol` and the other flat names of the release before: deprecated, read from the group."""
        group = FLAT_NAMES.get(name)
        if group is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        warnings.warn(f"JobOptions.{name} is deprecated and will be removed in the next release: read "
                      f"options.{group}.{name}", DeprecationWarning, stacklevel=2)
        return getattr(object.__getattribute__(self, group), name)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobOptions:
        """`JobOptions` from the flat names of its options (an `export-many` list entry's, `batch.OPTIONS`)
        and `quantize`, `overwrite`: each option goes to its group, without a warning."""
        flat = {name: value for name, value in data.items() if name in FLAT_NAMES}
        rest = {name: value for name, value in data.items() if name not in FLAT_NAMES}
        if unknown := sorted(set(rest) - {"quantize", "overwrite"}):
            raise OptionError(f"unknown export options {unknown}; the options are {', '.join(FLAT_NAMES)}, quantize, "
                              "overwrite")
        return cls(**_grouped({}, flat), **rest)

    def changed(self, changes: dict[str, Any], *, caller: str, stacklevel: int = 2) -> JobOptions:
        """These options with `changes`: its fields (`judging=JudgingOptions(...)`), or flat names
        (deprecated: warned of as `caller`'s, `stacklevel` as `warnings.warn`'s in the caller)."""
        flat = {name: value for name, value in changes.items() if name in FLAT_NAMES}
        fields = {name: value for name, value in changes.items() if name not in FLAT_NAMES}
        if flat:
            fields.update(_grouped({group: fields.get(group) or getattr(self, group) for group in GROUPS}, flat))
            _warn_flat(caller, flat, stacklevel=stacklevel + 1)
        return dataclasses.replace(self, **fields)


def _grouped(given: dict[str, Any], flat: dict[str, Any]) -> dict[str, Any]:
    """`{group: options}`: each group given (its defaults where `None`) with the flat options of it
    replaced; `TypeError` for a name no group has or a group of another type."""
    if unknown := sorted(set(flat) - set(FLAT_NAMES)):
        raise TypeError(f"unexpected keyword argument(s) {unknown}: the options are loading=, judging=, generation=, "
                        "quantize=, overwrite= and progress=")
    groups = {}
    for group, cls in GROUPS.items():
        options = given.get(group)
        if options is None:
            options = cls()
        elif not isinstance(options, cls):
            raise TypeError(f"{group} is a {cls.__name__}; got {type(options).__name__}")
        mine = {name: value for name, value in flat.items() if FLAT_NAMES[name] == group}
        groups[group] = dataclasses.replace(options, **mine) if mine else options
    return groups


def _warn_flat(caller: str, flat: dict[str, Any], *, stacklevel: int) -> None:
    """The `DeprecationWarning` of options given by their flat names, naming the group of each;
    `stacklevel` as `warnings.warn`'s in the caller."""
    by_group: dict[str, list[str]] = {}
    for name in flat:
        by_group.setdefault(FLAT_NAMES[name], []).append(name)
    asked = ", ".join(f"{name}=..." for names in by_group.values() for name in names)
    instead = ", ".join(f"{group}={GROUPS[group].__name__}({', '.join(f'{n}=...' for n in names)})"
                        for group, names in by_group.items())
    warnings.warn(f"{caller}({asked}) is deprecated and will be removed in the next release: pass {instead}",
                  DeprecationWarning, stacklevel=stacklevel + 1)
