"""The two quantization steps of the export pipeline (`HfExporter.export`, steps 4 and 7): a
quantizer run on the `torch.export` program (`stage_for(format) == "fx"`), then re-exported, or on
the converted model (`"model"`), each on its calibration samples as the program takes them."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..capture.dynamic import size_oblivious_tracing
from ..capture.interface import split_constants
from ..capture.prepare import model_name, normalize_inputs
from ..errors import QuantizationError, summarize
from ..generation.components import interface_kwargs
from ..workarounds import applied_patches

__all__ = ["calibration_samples", "quantize_program", "quantize_model"]


def calibration_samples(quantizer: Any, model: torch.nn.Module, sample: dict[str, Any],
                        keys: list[str]) -> list[dict[str, Any]]:
    """The quantizer's calibration samples (or the export's `sample`, for a quantizer that needs
    none) as the program takes them: its input names `keys`, each sample a copy."""
    samples = quantizer.calibration_samples() if quantizer.needs_calibration or quantizer.calibration is not None \
        else [sample]
    out = []
    for raw in samples:  # copies: calibration runs must not grow the capture sample's cache
        kwargs = interface_kwargs(normalize_inputs(copy.deepcopy(raw), model=model))
        missing = [k for k in keys if k not in kwargs]
        if missing:
            raise QuantizationError(f"a calibration sample lacks {missing}",
                                    model=model_name(model),
                                    remedy="give each sample the same inputs as the export (its keys: "
                                    f"{', '.join(keys)})")
        out.append({k: kwargs[k] for k in keys})
    return out


def quantize_program(captured: Any, model: torch.nn.Module, sample: dict[str, Any], config: Any, bounds: Any,
                     format: str) -> Any:
    """Step 4: `config.quantizer` on the captured program's module (the format's quantize-stage
    patches applied), re-exported at `sample` with the same dynamic plan, and checked to take the
    inputs the captured program takes (`_check_kept_shapes`); the `Capture` with it."""
    from ..capture.trace import reexport

    quantizer = config.quantizer
    keys = list(split_constants(sample)[0])  # the program's inputs: the traced kwargs
    samples = calibration_samples(quantizer, model, sample, keys)
    with _translated(quantizer, model, "the torch.export graph"):
        with size_oblivious_tracing(captured.size_oblivious), applied_patches(format, stage="quantize") as patches:
            quantized = quantizer.quantize_program(captured.program.module(), samples)
        program = reexport(quantized, {k: sample[k] for k in keys if k in sample}, config, bounds=bounds,
                           size_oblivious=captured.size_oblivious)
    _check_kept_shapes(captured.program, program, quantizer, model)
    return dataclasses.replace(captured, program=program, patches_reached=patches.reached())


def _check_kept_shapes(captured: Any, program: Any, quantizer: Any, model: torch.nn.Module) -> None:
    """Raise `QuantizationError` where the quantized program's inputs are shaped otherwise than the
    captured program's (a size fixed or freed, two axes no longer one size).

    # NOTE: the capture's guards (a size the model fixes or ties with a Python check) are in no
    # graph node; the re-export of `program.module()` keeps them only by tracing the module's
    # `_guards_fn`, which torch leaves out for some callers (`patch_torch_export_guards_fn`).
    # A guard lost so would give a program taking inputs the model refuses (Whisper's encoder on
    # any number of frames, which XNNPACK then failed to lower); this check refuses that instead.
    """
    from ..capture.dynamic import shape_differences
    from ..capture.record import record_from_program

    before, after = record_from_program(captured), record_from_program(program)
    differences = shape_differences(before.input_names, before.input_shapes, after.input_shapes)
    if differences:
        raise QuantizationError(
            f"{quantizer!r}: the quantized program takes other input shapes than the captured one: "
            f"{'; '.join(differences[:3])}", model=model_name(model),
            remedy="export with dynamic_shapes that fix or tie those axes as the model does, or without quantizer=, "
            "and report the model")


def quantize_model(artifact: Any, record: Any, model: torch.nn.Module, sample: dict[str, Any], config: Any,
                   format: str, artifact_inputs: Callable[[Any, Any, list[torch.Tensor]], list[Any]]) -> Any:
    """Step 7: `config.quantizer` on the converted `artifact`, calibrated on samples flattened in
    `record.input_names` order and put as the artifact takes them (`artifact_inputs`, the
    exporter's `_artifact_inputs`)."""
    import torch.utils._pytree as pytree

    quantizer = config.quantizer
    samples = [artifact_inputs(artifact, record,
                               [leaf for leaf in pytree.tree_leaves(s) if isinstance(leaf, torch.Tensor)])
               for s in calibration_samples(quantizer, model, sample, record.input_keys)]
    with _translated(quantizer, model, f"the {format} model"):
        return quantizer.quantize_model(artifact, samples)


@contextlib.contextmanager
def _translated(quantizer: Any, model: torch.nn.Module, what: str) -> Iterator[None]:
    """A quantizer's failure on `what` as a `QuantizationError` naming it (original chained)."""
    try:
        yield
    except (QuantizationError, ImportError):
        raise
    except Exception as error:  # noqa: BLE001 - translated with the quantizer named
        raise QuantizationError(f"{quantizer!r} failed on {what}: {summarize(error)}", model=model_name(model),
                                remedy="try another scheme, or export without quantizer= and report this") from error
