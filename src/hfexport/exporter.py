"""`HfExporter`: the export pipeline every backend shares.

```
export(model, inputs, config)
  1. prepare   normalise inputs, check attention, eval + no_grad, enter the format's patches
  2. capture   torch.export with the dynamic-shapes plan (capture/trace.py)
  3. check     every axis asked to be dynamic is still dynamic, then the format's FX fixes
  4. quantize  an FX-graph quantizer (PT2E, NNCF on FX), re-exported
  5. record    the artifact's `ExportRecord`, built once: names, shapes, dtypes of its interface
  6. convert   backend-specific (`_convert`), naming the artifact's inputs and outputs from the record
  7. quantize  a model-stage quantizer (ONNX Runtime, NNCF on the converted model)
  8. finish    backend-specific rewrite of the final artifact (`_finish`: OpenVINO's cache as state)
```
The backend's own artifact comes back with the record attached (`record_of`). The model is left
exactly as it was (training flags, patched attributes), also when a step raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch

from ._versions import require_extra, warn_on_drift
from .builtins import load_workarounds
from .capture.dynamic import size_oblivious_tracing
from .capture.prepare import check_attention, inference_mode, model_name, normalize_inputs
from .capture.record import ExportRecord, attach_record, record_from_program
from .capture.trace import Capture, capture, functionalized
from .config import ExportConfig
from .errors import ConversionError, ExportError, PrepareError, SerializationError, summarize
from .folder.manifest import FileBytes
from .folder.package import GenerationPlan, RuntimePackage, package_for
from .folder.storage import staged_files
from .quantization.steps import quantize_model, quantize_program
from .timing import Phases, fewer_collections, phase, recording
from .workarounds import applied_patches

__all__ = ["HfExporter", "GenerationPlan", "checked_config"]

logger = logging.getLogger("hfexport")


class HfExporter:
    """Base class of the exporters. A backend subclasses it and implements `_convert`.

    Class attributes a backend sets:
        format: its `export_format`.
        config_class: its `ExportConfig` subclass.
        extra: the `hfexport[extra]` that installs its packages (`None`: torch only).
        fix_order: the order of its built-in FX fixes, by name.
    """

    format: ClassVar[str] = ""
    config_class: ClassVar[type[ExportConfig]] = ExportConfig
    extra: ClassVar[str | None] = None
    fix_order: ClassVar[tuple[str, ...]] = ()
    #: leave `None` items out of output tuples (a runtime that cannot have a `None` output)
    drop_none_outputs: ClassVar[bool] = False
    #: trace a decoder's first two layers and stamp the second for the rest (`capture/stamp.py`;
    #: where a model's layers may differ, the whole model is traced, and the record says why)
    stamp_layers: ClassVar[bool] = True

    # -- public API ---------------------------------------------------------------------------

    def export(self, model: torch.nn.Module, inputs: Any, config: ExportConfig | None = None) -> Any:
        """Export `model` called with `inputs` and return the backend's artifact.

        Args:
            model: a `PreTrainedModel` (or any `nn.Module` taking keyword arguments).
            inputs: forward keyword arguments: a dict or a tokenizer/processor `BatchEncoding`.
            config: this exporter's config class; defaults to a static export.

        Returns:
            The backend's native artifact (`ExportedProgram`, `ONNXProgram`, ...).

        Raises:
            ImportError: a package the backend needs is missing (the message has the pip line).
            ExportError: a step failed; the subclass names the step (`CaptureError`, ...);
                `ValidationError` when `config.validate` and the artifact differs from eager.
        """
        config = checked_config(self, config)
        _check_environment(self)
        kwargs = normalize_inputs(inputs, model=model)
        if not isinstance(model, torch.nn.Module):
            raise PrepareError(f"expected a torch.nn.Module, got {type(model).__name__}",
                               remedy="load the model with transformers (AutoModel...from_pretrained)")
        check_attention(model)
        self._check_model(model, kwargs, config)
        load_workarounds(self.format)  # the format's built-in patches and FX fixes register (once)
        quantizer = config.quantizer
        if quantizer is not None:
            if not hasattr(quantizer, "check"):
                raise TypeError(f"quantizer= takes an hfexport ExportQuantizer, got {type(quantizer).__name__}")
            quantizer.check(self.format)  # before any tracing
        start = time.perf_counter()
        phases = Phases()
        from .generation.caches import full_length_caches
        from .generation.front import traced_sample

        with recording(phases, "model"), inference_mode(model), full_length_caches(), fewer_collections(), \
                applied_patches(self.format) as patches:
            sample = traced_sample(model, self._capture_sample(kwargs, config), config)
            bounds = self._dim_bounds(model, sample, config)
            with phase("trace"):
                captured = capture(model, sample, config, backend=self.format, fix_order=self.fix_order,
                                   bounds=bounds, drop_none_outputs=self.drop_none_outputs,
                                   functionalize=functools.partial(self._functionalize, config=config),
                                   stamp_layers=self.stamp_layers)
            sample = captured.sample  # the capture may have traced a batch of 2 (see `capture`)
            if getattr(bounds, "chosen", None):
                logger.info("%s: bounds for dynamic dims: %s", type(self).__name__, bounds.chosen)
            if quantizer is not None and quantizer.stage_for(self.format) == "fx":
                with phase("quantize"):
                    captured = self._quantize_program(captured, model, sample, config, bounds)
            record = _describe(captured, model, config, self.format)
            # Conversions re-trace the program (run_decompositions); without the same size-oblivious
            # setting a decomposition can silently fold a size-1 sample dim (measured: BERT's linear
            # decomposed to view([seq, hidden]), dropping the batch).
            with phase("convert"), size_oblivious_tracing(captured.size_oblivious):
                artifact = _converted(self, captured, record, model, sample, config)
            _check_conversion_kept_shapes(record, captured, model)
            if quantizer is not None and quantizer.stage_for(self.format) == "model":
                with phase("quantize"):
                    artifact = quantize_model(artifact, record, model, sample, config, self.format,
                                              self._artifact_inputs)
            with phase("optimise"):
                artifact = self._finish(artifact, record, sample, config)
        self._record(record, captured, artifact, config)
        if quantizer is not None:
            from .quantization.report import quantization_summary

            record.details["quantization"] = {**quantizer.to_dict(), "stage": quantizer.stage_for(self.format),
                                              **quantization_summary(self.format, artifact),
                                              **(quantizer.details() if hasattr(quantizer, "details") else {})}
        # the patches whose targets this export ran (of those swapped in, most serve other models)
        record.details["patches"] = [*patches.reached(), *captured.patches_reached]
        record.details["fx_fixes"] = captured.fixes_applied
        record.details["export_seconds"] = round(time.perf_counter() - start, 3)
        if getattr(bounds, "chosen", None):
            record.details["dim_bounds"] = dict(bounds.chosen)
        attach_record(artifact, record)
        if config.validate:
            from .validation.driver import validated

            with recording(phases, "model"), phase("validate"):
                validated(artifact, model, kwargs)
        record.details["stage_seconds"] = phases.to_dict().get("model", {})  # where the export's time went
        return artifact

    def export_for_generation(
        self,
        model: torch.nn.Module,
        inputs: Any,
        config: ExportConfig | None = None,
        generation_config: Any = None,
        multi_token_decode: bool = False,
    ) -> dict[str, Any]:
        """Export each generation component (`prefill`, `decode`, `encoder`, ...) on its own.

        The components come from `decompose_for_generation` (one `generate()` run with hooks);
        each is exported on its captured kwargs with `config`. They are independent graphs: the
        caller runs the encoder, feeds the cache back and drives the loop.

        Returns:
            `{component name: artifact}`.
        """
        from .generation.decompose import planned_components

        plan = self.plan_generation(model, normalize_inputs(inputs, model=model), config, generation_config,
                                    multi_token_decode)
        return self.export_components(planned_components(model, plan), plan.config)

    def plan_generation(self, model: torch.nn.Module, inputs: dict[str, Any], config: ExportConfig | None,
                        generation_config: Any = None, multi_token_decode: bool = False) -> GenerationPlan:
        """How this backend captures `model`'s generation components for `export_for_generation`:
        as asked (OpenVINO: its one stateful model where `genai_layout` asks for it). An export
        folder plans through its `RuntimePackage.plan`, which starts from this."""
        return GenerationPlan(inputs, generation_config, multi_token_decode, False, config)

    def export_components(self, components: dict[str, tuple[torch.nn.Module, dict[str, Any]]],
                          config: ExportConfig | None = None, *,
                          on_component: Callable[[str, torch.nn.Module], Any] | None = None,
                          calibrate_on_captured: bool = True,
                          calibration: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
        """Export the components `decompose_for_generation` returned, each on its captured kwargs
        under the exported interface's names (a static quantization scheme calibrated on them).

        Args:
            on_component: `on_component(name, module)` returns a context manager entered around
                each component's export (progress reporting).
            calibrate_on_captured: calibrate each component on its captured kwargs; `False` keeps
                the quantizer's own calibration data (components that take the model's forward
                kwargs: the whole model).
            calibration: `{component: [kwargs, ...]}` to calibrate the named components on instead
                (their inputs captured on many prompts, `generation.calibration.captured_calibration`).

        Returns:
            `{component name: artifact}`.
        """
        from .generation.components import interface_kwargs, note_initial_cache

        artifacts = {}
        for name, (module, kwargs) in components.items():
            with on_component(name, module) if on_component else contextlib.nullcontext():
                samples = (calibration or {}).get(name, [kwargs] if calibrate_on_captured else None)
                own = _for_component(config, samples) if samples is not None else config
                artifacts[name] = self.export(module, interface_kwargs(kwargs), config=own)
        note_initial_cache(components, artifacts)
        return artifacts

    # -- quantization -----------------------------------------------------------------------------

    def _quantize_program(self, captured: Capture, model, sample, config, bounds) -> Capture:
        """Step 4 (`quantization.steps.quantize_program`); a backend may narrow what its quantizer
        annotates around it (ExecuTorch)."""
        return quantize_program(captured, model, sample, config, bounds, self.format)

    def _artifact_inputs(self, artifact: Any, record: ExportRecord, leaves: list[torch.Tensor]) -> list[Any]:
        """`leaves` (in `record.input_names` order) as the converted artifact takes them, for a
        model-stage quantizer; the same here, where conversion kept the record's interface."""
        return leaves

    def save(self, artifact: Any, directory: str | os.PathLike, name: str = "model", *,
             overwrite: bool = False) -> list[Path]:
        """Write `artifact` into `directory` as `<name>.<suffix>` (and companions), atomically:
        the files appear only when complete. Returns the files."""
        directory = Path(directory)
        if not directory.is_dir():
            raise SerializationError(f"{directory} is not a directory", remedy="create it first")
        with staged_files(directory / name, overwrite=overwrite) as staging:
            written = self.write(artifact, staging, name)
        return [directory / file.name for file in written]

    def write(self, artifact: Any, directory: str | os.PathLike, name: str = "model") -> list[Path]:
        """Write `artifact` into `directory`, a folder the caller stages (`bundle.save_folder` writes
        every component into one staged folder); return the files written."""
        return self._write(artifact, Path(directory) / name)

    def runtime_package(self, task: str = "text-generation") -> RuntimePackage:
        """This exporter's export folder as its runtime's own package for `task`
        (`folder.package.package_for`; `generation.components.package_task(model)` says a model's):
        what `export_to_folder` plans, captures, writes and checks a generation export as."""
        return package_for(self, task)

    def load(self, files: list[str | os.PathLike | FileBytes]) -> Any:
        """Load an artifact that `save` wrote (its files, main file first), ready for this
        backend's runner: an `ExportedProgram`, an ONNX model's files, an `openvino.Model`, a
        `.pte` buffer. Each file is read once and the runtime is given those bytes or a private
        copy of them (files an export folder lists come as `manifest.FileBytes`, checked as they
        are read); a file the model names that is not among `files` (an ONNX model's external
        data, an OpenVINO `.bin`) is refused, naming it, never opened by its path."""
        return self._load([f if isinstance(f, FileBytes) else FileBytes.read(f) for f in files])

    # -- steps a backend customises --------------------------------------------------------------

    def _write(self, artifact: Any, stem: Path) -> list[Path]:
        """Write the artifact's files as `stem` + suffix (no staging: the caller stages)."""
        raise NotImplementedError

    def _load(self, files: list[FileBytes]) -> Any:
        raise NotImplementedError

    def _check_model(self, model: torch.nn.Module, inputs: dict[str, Any], config: ExportConfig) -> None:
        """Backend-specific refusals before tracing (e.g. a cache type a delegate cannot take)."""

    def _capture_sample(self, inputs: dict[str, Any], config: ExportConfig) -> dict[str, Any]:
        """The inputs to trace with (a backend may enlarge size-1 dims it cannot keep dynamic)."""
        return inputs

    def _functionalize(self, program: torch.export.ExportedProgram, size_oblivious: bool,
                       config: ExportConfig) -> torch.export.ExportedProgram:
        """How the capture states a program's in-place writes to its inputs (a static cache) in its
        signature: `capture.trace.functionalized`, a retrace with no decomposition. A backend whose
        conversion retraces the program with a table of its own anyway retraces it with that table
        here instead, once (ONNX: `backends/onnx/decomposition.py`)."""
        return functionalized(program, size_oblivious)

    def _dim_bounds(self, model: torch.nn.Module, inputs: dict[str, Any], config: ExportConfig):
        """`(leaf, axis, size) -> (min, max)` for `dynamic=True` dims, or None (unbounded). A callable
        with a `chosen` dict (bound -> why) has it logged and recorded in the report."""
        return None

    def _convert(self, captured: Capture, record: ExportRecord, model: torch.nn.Module, inputs: dict[str, Any],
                 config: ExportConfig) -> Any:
        """Step 6: the backend's artifact from the captured program; its inputs and outputs are
        named and shaped as `record` says."""
        raise NotImplementedError

    def _finish(self, artifact: Any, record: ExportRecord, sample: dict[str, Any], config: ExportConfig) -> Any:
        """Step 8: the artifact after quantization (`sample`: the kwargs it was traced on),
        rewritten once more if the backend needs to (the interface in `record` stays what the
        runner takes); this one returns it as is."""
        return artifact

    def _record(self, record: ExportRecord, captured: Capture, artifact: Any, config: ExportConfig) -> None:
        """Add what the backend knows about `artifact` to its record (delegation, precision, ...)."""


def checked_config(exporter: HfExporter, config: ExportConfig | None) -> ExportConfig:
    """`config`, or `exporter`'s default config for `None`; a `TypeError` for another format's config."""
    if config is None:
        return exporter.config_class()
    if not isinstance(config, exporter.config_class):
        raise TypeError(
            f"{type(exporter).__name__} takes a {exporter.config_class.__name__}, got {type(config).__name__}; "
            "use AutoHfExporter.from_config(config) to get the exporter that matches a config"
        )
    return config


def _check_environment(exporter: HfExporter) -> None:
    """Fail before any work when a package the exporter needs is missing; warn once on version drift."""
    owner = type(exporter).__name__
    if exporter.extra:
        require_extra(exporter.extra, purpose=owner)
    warn_on_drift(exporter.extra or "dynamo", owner=owner)


def _describe(captured: Capture, model: torch.nn.Module, config: ExportConfig, format: str) -> ExportRecord:
    """Step 5: the artifact's record, built once from the program it is converted from."""
    record = record_from_program(captured.program, format=format, model_class=model_name(model))
    record.details["size_oblivious"] = captured.size_oblivious
    record.details.update(captured.fixed_axes)
    if captured.layer_stamping:
        record.details["layer_stamping"] = captured.layer_stamping
    record.details["config"] = _config_summary(config)
    mutated = captured.program.graph_signature.user_inputs_to_mutate
    if mutated:  # written in place (a static cache): say which inputs, in the program's order
        record.details["input_mutations"] = len(mutated)
    return record


def _converted(exporter: HfExporter, captured: Capture, record: ExportRecord, model: torch.nn.Module,
               kwargs: dict[str, Any], config: ExportConfig) -> Any:
    """Step 6: the exporter's `_convert`, a failure translated into `ConversionError` (original chained)."""
    try:
        return exporter._convert(captured, record, model, kwargs, config)
    except (ExportError, ImportError):
        raise
    except Exception as error:  # noqa: BLE001 - translated, original chained
        raise ConversionError(
            f"converting to {exporter.format} failed: {summarize(error)}",
            model=model_name(model),
            remedy="rerun with --debug for the full trace; if the Dynamo export of the same model works, "
            "this is a conversion bug worth a patch (see `hfexport patches`)",
        ) from error


def _check_conversion_kept_shapes(record: ExportRecord, captured: Capture, model: torch.nn.Module) -> None:
    """Raise `ConversionError` when converting fixed a size the program kept symbolic.

    # NOTE: a converter can specialise a symbol of the program it converts, in the program's own
    # shape environment (ExecuTorch's edge verifier called len() on a split's first piece and
    # fixed the batch at its traced size: the program then took that batch only). The record is
    # built before the conversion, so its shapes are read again here: a dimension that was symbolic
    # and now is a number is a silent specialisation, refused like one at capture.
    """
    after = record_from_program(captured.program)
    lost = [f"{name}, axis {axis} (now {new})"
            for name, before, now in zip(record.input_names, record.input_shapes, after.input_shapes)
            for axis, (old, new) in enumerate(zip(before, now)) if isinstance(old, str) and isinstance(new, int)]
    if lost:
        raise ConversionError(
            f"converting to {record.format} fixed {len(lost)} dimension(s) the program kept dynamic: {'; '.join(lost)}",
            model=model_name(model),
            remedy="export with dynamic_shapes that leave those dimensions static, and report the model (a "
            "conversion step specialised them; see `hfexport patches` for the fixes that usually prevent it)",
        )


def _for_component(config: ExportConfig | None, samples: list[dict[str, Any]]) -> ExportConfig | None:
    """`config` for one generation component: a static quantization scheme is calibrated on the
    component's own captured inputs, `samples` (the caller's calibration data are forward kwargs of
    the whole model, which a decode step or an encoder does not take)."""
    quantizer = getattr(config, "quantizer", None)
    if quantizer is None or not quantizer.needs_calibration and quantizer.calibration is None:
        return config
    from .generation.components import interface_kwargs

    return dataclasses.replace(config, quantizer=quantizer.with_calibration([interface_kwargs(s) for s in samples]))


def _config_summary(config: ExportConfig) -> dict[str, Any]:
    try:
        return config.to_dict()
    except ValueError:
        return {"export_format": config.export_format, "dynamic": config.dynamic}
