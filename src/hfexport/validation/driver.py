"""`validate`: run an artifact in its runtime, compare with eager PyTorch, and report per output.

`validate(artifact, model, inputs)` checks the sample inputs and, when the artifact has dynamic
dimensions, a second set of inputs where every symbolic size moves (batch 1 -> 3, sequence 7 -> 9):
a dimension that was silently specialised then shows up as a failure, not a pass.

Where the export job's accuracy gate runs (`generation/accuracy.py`; a quantized generation export
with the default criteria), the job makes the cosine floors (`hfexport.validation.compare`)
advisory (`cosine_advisory=`, its reason): each output's cosine is still measured and reported,
one under its floor marked `below floor (advisory)`, but only a wrong shape, an integer output or
a non-finite value fails. On a real LLM one position's logits are a lottery under a
correct int4 quantization (SmolLM2's sample prompt: cosine 0.95 at its last position; per position
0.99 down to -0.23 over a chat prompt, eager PyTorch with the same round-to-nearest int4), so a
floor on them refuses correct exports at random; the gate's teacher-forced steps over a real prompt
average that out and still refuse a broken quantizer (bench/RESULTS.md).

How an output is compared: `hfexport.validation.compare`; the inputs of the resized cases:
`hfexport.validation.inputs`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from ..capture.interface import call_model
from ..capture.prepare import inference_mode, normalize_inputs
from ..capture.pytree import flatten_with_names, register_cache_pytree_nodes
from ..capture.record import record_of
from ..errors import ValidationError, summarize
from ..generation.front import unwrap
from ..resident import drop_clean_pages, weight_storages
from ..runner import runner_for
from ..timing import phase
from .compare import attended_positions, compare_output, default_tolerance, is_cache_output
from .inputs import RESIZERS, resize_inputs
from .report import CaseReport, ValidationReport

__all__ = ["validate", "validate_components"]


def _compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of `model`'s floating-point weights (float32 when it has none)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def _static_layers_sized_by_buffers(cache: Any) -> None:
    """Give each static layer of `cache` (eager's copy of a resized input) the length of its buffers.

    # NOTE: a resized cache keeps the sample's `max_cache_len` (a number of the layer, part of
    # the input's tree spec, so the program's copy must keep it), which eager reads when a model
    # builds its mask from a 2-D one (BLOOM): eager would refuse a resized cache the program
    # takes (the program reads the buffers' length, `models/static_cache.py`).
    """
    for layer in getattr(cache, "layers", None) or []:
        keys = getattr(layer, "keys", None)
        if isinstance(getattr(layer, "max_cache_len", None), int) and isinstance(keys, torch.Tensor) and keys.dim() >= 2:
            layer.max_cache_len = int(keys.shape[-2])
    for child in ("self_attention_cache", "cross_attention_cache"):
        if hasattr(cache, child):
            _static_layers_sized_by_buffers(getattr(cache, child))


def _shapes(inputs: dict[str, Any]) -> dict[str, list[int]]:
    return {name: list(leaf.shape) for name, leaf in flatten_with_names(inputs) if isinstance(leaf, torch.Tensor)}


def _run_case(label: str, runner, model, inputs, record, atol, rtol, min_cosine=None,
              min_cache_cosine=None, advisory=False) -> CaseReport:
    from ..generation.caches import full_length_caches

    try:  # the caches a model builds keep every token, as in the export (see `full_length_caches`)
        eager_inputs = copy.deepcopy(inputs)
        for value in eager_inputs.values():
            _static_layers_sized_by_buffers(value)
        with inference_mode(model), full_length_caches():
            eager = call_model(model, eager_inputs)
    except Exception as error:  # noqa: BLE001 - the check cannot be made: a failed case, never a pass
        if label == "sample":
            raise
        return CaseReport(label, _shapes(inputs), [], f"eager PyTorch rejects these inputs, so the artifact cannot "
                          f"be compared at this shape: {summarize(error, 200)}")
    expected = [(name, value) for name, value in flatten_with_names(eager) if value is not None]
    drop_clean_pages(spans=weight_storages(model))  # eager's and the runtime's weights resident one at a time
    try:
        got = runner.run(copy.deepcopy(record.artifact_inputs(inputs)))
    except Exception as error:  # noqa: BLE001 - a runtime failure is a validation result, reported
        return CaseReport(label, _shapes(inputs), [], summarize(error))
    finally:
        drop_clean_pages(paths=runner.mapped_files)
    if len(got) != len(expected):
        return CaseReport(label, _shapes(inputs), [],
                          f"artifact returned {len(got)} outputs, eager {len(expected)}")
    names = record.output_names if len(record.output_names) == len(expected) else [n for n, _ in expected]
    mask = inputs.get("attention_mask") if isinstance(inputs.get("attention_mask"), torch.Tensor) else None
    cache_floor = min_cosine if min_cosine is None or min_cache_cosine is None else min_cache_cosine
    outputs = [compare_output(name, g, w, atol, rtol, mask, cache_floor if is_cache_output(name) else min_cosine, advisory)
               for name, g, (_, w) in zip(names, got, expected)]
    attended = attended_positions(mask)
    padded = int((~attended[0]).sum()) if attended is not None else 0
    return CaseReport(label, _shapes(inputs), outputs, padded_positions=padded)


def validated(artifact: Any, model: torch.nn.Module, kwargs: dict[str, Any]) -> None:
    """An export's `config.validate`: `validate` the artifact against eager at the sample and other
    sizes; the report goes in its record (`validation`), a failure raises `ValidationError` with it."""
    from ..capture.prepare import model_name

    report = validate(artifact, model, kwargs)
    record = record_of(artifact)
    record.details["validation"] = report.to_dict()
    if not report.passed:
        raise ValidationError(f"the {record.format} artifact differs from eager PyTorch:\n{report.to_table()}",
                              model=model_name(model),
                              remedy="see the failing case above; export with validate=False to keep the "
                              "artifact anyway, and report the model with `hfexport env`")


def validate(
    artifact: Any,
    model: torch.nn.Module,
    inputs: Any,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    resized: bool | None = None,
    steps: tuple[int, ...] = (2,),
    smallest: bool | None = None,
    min_cosine: float | None = None,
    min_cache_cosine: float | None = None,
    cosine_advisory: str | None = None,
    on_case: Callable[[int, int], None] | None = None,
) -> ValidationReport:
    """Run `artifact` in its runtime on `inputs` and compare every output with `model(**inputs)`.

    Args:
        artifact: what an hfexport exporter returned (or a loaded `ExportedProgram`).
        model: the eager model it was exported from.
        inputs: the forward kwargs to compare on.
        atol, rtol: tolerance; defaults per format and the model's dtype (`default_tolerance`).
        resized: also run at other batch sizes and sequence lengths; default: when the artifact
            has dynamic dimensions.
        steps: how far each symbolic size moves for each resized case (`(2, 5)`: two more cases).
        smallest: also run with every batch and token count at 1 (`resize_inputs(smallest=True)`);
            default: with `resized`. Skipped, with a note, when the sample is already that small.
        min_cosine: judge float outputs by cosine similarity with eager instead of the tolerance
            (a quantized artifact: its error is the quantization's, not a conversion bug).
        min_cache_cosine: with `min_cosine`, the floor of the cache tensors (`cache.*`) instead
            (see `hfexport.validation.compare`); default: `min_cosine`.
        cosine_advisory: with `min_cosine`, why its floors are advisory: an output under its floor
            is marked (`OutputDiff.below_floor`, `ValidationReport.below_floor`) and does not fail
            (the export job's accuracy gate judges a quantized generation export instead).

    Returns:
        A `ValidationReport`; `report.passed` says whether every output of every case passed.
    """
    record = record_of(artifact)
    kwargs = normalize_inputs(inputs, model=model)
    register_cache_pytree_nodes(kwargs)
    default_atol, default_rtol = default_tolerance(record.format, _compute_dtype(model))
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    drop_clean_pages(spans=weight_storages(model))  # opening the runtime touches its weights, not eager's
    runner = runner_for(artifact, record)
    drop_clean_pages(paths=runner.mapped_files)
    if cosine_advisory and min_cosine is None:
        raise ValueError("cosine_advisory makes the cosine floors advisory: pass min_cosine too")
    floors = (min_cosine, min_cache_cosine, bool(cosine_advisory))
    if resized is None:
        resized = record.is_dynamic
    cases: list[CaseReport] = []
    planned = 1 + (len(steps) + (smallest is not False) if resized else 0)

    def add(case: CaseReport) -> None:
        cases.append(case)
        if on_case is not None:
            on_case(len(cases), max(planned, len(cases)))

    add(_run_case("sample", runner, model, kwargs, record, atol, rtol, *floors))
    note = ""
    for step in steps if resized else ():
        label = "resized" if len(steps) == 1 else f"resized+{step}"
        try:
            resizer = RESIZERS.get(type(unwrap(model)).__name__)
            other = resizer(kwargs, step) if resizer else resize_inputs(kwargs, record, step)
        except ValidationError as error:
            add(CaseReport(label, _shapes(kwargs), [], str(error)))
            continue
        if other is None:
            note = "no symbolic input dimension: only the sample shape was checked"
            break
        if _shapes(other) == _shapes(kwargs):
            add(CaseReport(label, _shapes(other), [], "resizing left every input at the sample's shape"))
            continue
        add(_run_case(label, runner, model, other, record, atol, rtol, *floors))
    if resized and smallest is not False and not note:
        note = _smallest_case(add, runner, model, kwargs, record, atol, rtol, floors) or note
    return ValidationReport(record.format, record.model_class, runner.runtime, runner.precision,
                            atol, rtol, cases, note, min_cosine, None if min_cosine is None else min_cache_cosine,
                            cosine_advisory or None)


def _smallest_case(add: Callable[[CaseReport], None], runner, model, kwargs, record, atol, rtol, floors) -> str:
    """Add the `smallest` case (every batch and token count at 1) with `add`; return a note
    when it does not apply (the sample is that small already, or the model's sizes are tied by
    value, see `RESIZERS`)."""
    resizer = RESIZERS.get(type(unwrap(model)).__name__)
    if resizer is not None:  # the report says which shapes were checked, and why not the generic ones
        what = (resizer.__doc__ or "").strip().splitlines()[0].rstrip(".")
        return f"sizes tied by value: resized by {resizer.__name__} ({what}); no smallest case"
    try:
        other = resize_inputs(kwargs, record, smallest=True)
    except ValidationError as error:
        add(CaseReport("smallest", _shapes(kwargs), [], str(error)))
        return ""
    if other is None or _shapes(other) == _shapes(kwargs):
        return ""  # the sample is already the smallest size: its own case checked it
    add(_run_case("smallest", runner, model, other, record, atol, rtol, *floors))
    return ""


def validate_components(artifacts: dict[str, Any], components: dict[str, tuple[torch.nn.Module, Any]],
                        on_case: Callable[[str, int, int], None] | None = None,
                        **options: Any) -> dict[str, ValidationReport]:
    """`validate` each artifact of `export_for_generation` against its eager submodule on the kwargs
    `decompose_for_generation` captured for it (`options`: `validate`'s keywords; `on_case(name,
    done, total)`: `validate`'s `on_case`, told which component).

    Returns:
        `{component name: report}`, in the artifacts' order.
    """
    def told(name: str) -> Callable[[int, int], None] | None:
        return None if on_case is None else lambda done, total: on_case(name, done, total)

    reports = {}
    for name, artifact in artifacts.items():
        with phase("validate", component=name):
            reports[name] = validate(artifact, *components[name], on_case=told(name), **options)
    return reports
