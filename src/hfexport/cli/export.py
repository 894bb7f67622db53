"""`hfexport export MODEL --format F -o DIR`: export, validate against eager, write artifact + report.

Exit codes: 0 exported and validated; 1 the export failed; 3 validation failed (nothing written).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..auto import AutoExportConfig, AutoHfExporter
from ..errors import ValidationError
from ..loading import load_model
from ..record import record_of
from ..validation import validate_components
from .output import check_target
from .progress import Progress

VALIDATION_FAILED = 3


def _config_from_args(args):
    data = {"export_format": args.format, "dynamic": not args.static}
    if args.format == "executorch" and args.backend:
        data["backend"] = args.backend
    return AutoExportConfig.from_dict(data)


def _generation_config(args):
    if not getattr(args, "static_cache", None):
        return None
    from transformers import GenerationConfig

    return GenerationConfig(cache_implementation="static", max_cache_len=args.static_cache)


def _components(args, loaded) -> dict[str, tuple]:
    """`{name: (module, kwargs)}`: the whole model, or its generation components (`--generate`)."""
    if not args.generate:
        return {"model": (loaded.model, loaded.inputs)}
    from ..generation.decompose import decompose_for_generation

    return decompose_for_generation(loaded.model, loaded.inputs, generation_config=_generation_config(args),
                                    multi_token_decode=args.multi_token_decode)


def _validate_all(artifacts: dict, components: dict, args, target: Path) -> dict:
    reports = validate_components(artifacts, components, atol=args.tolerance, rtol=args.rtol,
                                  min_cosine=_min_cosine(args))
    for name, report in reports.items():
        if not report.passed:
            print(report.to_table())
            raise ValidationError(
                f"the exported {name!r} differs from eager PyTorch (max abs difference {report.max_abs:.3g}); "
                f"nothing was written to {target}",
                model=record_of(artifacts[name]).model_class,
                remedy="look at the failing outputs above; pass --tolerance to accept a larger difference, "
                "or --no-validate to write the artifacts anyway",
            )
    return reports


def _min_cosine(args) -> float | None:
    if not getattr(args, "quantize", None):
        return None
    if args.min_cosine is not None:
        return args.min_cosine
    return 0.97 if args.quantize == "int4-weights" else 0.98


def _check_generation_args(args) -> None:
    if (args.static_cache or args.multi_token_decode) and not args.generate:
        raise ValueError("--static-cache and --multi-token-decode shape the generation components; add --generate")
    if args.static_cache and not args.multi_token_decode:
        raise ValueError("--static-cache N makes one decode graph that also prefills; add --multi-token-decode")


def run(args) -> int:
    from ..generation.package import save_generation_export

    _check_generation_args(args)
    target = Path(args.output).resolve()
    check_target(target, overwrite=args.overwrite)  # refuse before the slow part
    config = _config_from_args(args)
    exporter = AutoHfExporter.from_config(config)
    progress = Progress(5 if not args.no_validate else 4, enabled=not args.quiet)

    if args.quantize:
        from ..quantization import quantizer_for

        quantizer_for(args.format, args.quantize)  # an unknown scheme fails before loading anything
    with progress.step(f"loading {args.model}"):
        loaded = load_model(args.model, prompt=args.prompt)
    if args.quantize:
        from ..quantization import quantizer_for

        config.quantizer = quantizer_for(args.format, args.quantize, calibration=[loaded.inputs])
    with progress.step("running generate() to find the components" if args.generate else "preparing inputs"):
        components = _components(args, loaded)
    def exporting(name, module):
        return progress.step(f"exporting {name} ({type(module).__name__}) to {args.format}")

    if args.generate:  # what export_for_generation does, with progress
        artifacts = exporter.export_components(components, config, on_component=exporting)
    else:
        with exporting("model", loaded.model):
            artifacts = {"model": exporter.export(loaded.model, loaded.inputs, config=config)}
    seconds = {name: record_of(artifact).details["export_seconds"] for name, artifact in artifacts.items()}
    reports = {}
    if not args.no_validate:
        with progress.step(f"validating in {args.format}'s runtime against eager"):
            reports = _validate_all(artifacts, components, args, target)
    summary = {
        "model": args.model,
        "model_class": type(loaded.model).__name__,
        "format": args.format,
        "generate": bool(args.generate),
        "export_seconds": round(sum(seconds.values()), 3),
        "quantize": args.quantize,
        "weight_bytes": sum(t.numel() * t.element_size()
                            for t in [*loaded.model.parameters(), *loaded.model.buffers()]),
        "components": {
            name: {"export_seconds": seconds[name], "record": record_of(artifact).summary(),
                   "validation": reports[name].to_dict() if name in reports else None}
            for name, artifact in artifacts.items()
        },
    }
    with progress.step(f"writing {target}"):
        save_generation_export(exporter, artifacts, target, model=loaded.model,
                               generation_config=_generation_config(args) if args.generate else None,
                               tokenizer=loaded.tokenizer, export_config=config, overwrite=args.overwrite,
                               reports=summary, with_generation_config=bool(args.generate))
    manifest = json.loads((target / "manifest.json").read_text())
    for name, entry in manifest["components"].items():
        summary["components"][name].update(files=entry["files"], bytes=entry["bytes"])
    summary["artifact_bytes"] = sum(entry["bytes"] for entry in manifest["components"].values())
    _print_summary(summary, reports, target)
    return 0


def _print_summary(summary: dict, reports: dict, target: Path) -> None:
    print(f"exported {summary['model_class']} ({summary['model']}) to {summary['format']}: {target}")
    print(f"  export time:    {summary['export_seconds']:.2f} s")
    ratio = summary["artifact_bytes"] / summary["weight_bytes"] if summary.get("weight_bytes") else float("nan")
    print(f"  artifact bytes: {summary['artifact_bytes']:,} ({ratio:.2f}x the model's "
          f"{summary['weight_bytes']:,} weight bytes{', quantized ' + summary['quantize'] if summary.get('quantize') else ''})")
    for name, entry in summary["components"].items():
        details = entry["record"]
        print(f"  {name}: {', '.join(entry['files'])} ({entry['bytes']:,} bytes, {entry['export_seconds']:.2f} s)")
        if details.get("delegation"):
            d = details["delegation"]
            print(f"    delegation:  {d['delegated_nodes']} nodes in {d['delegates']} {d['backend']} delegate(s), "
                  f"{d['portable_nodes']} on portable kernels")
        if details.get("quantization"):
            q = details["quantization"]
            counts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in q.items()
                               if k not in ("quantizer", "scheme", "stage", "note"))
            print(f"    quantized:   {q['quantizer']} {q['scheme']} on the {q['stage']} stage: {counts}")
        if details.get("patches"):
            print(f"    patches active during export: {', '.join(details['patches'])}")
        if details.get("fx_fixes"):
            print(f"    FX fixes that changed the graph: {', '.join(details['fx_fixes'])}")
    if not reports:
        print("  validation:     skipped (--no-validate)")
    for report in reports.values():
        print(report.to_table())
