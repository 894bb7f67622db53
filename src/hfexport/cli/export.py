"""`hfexport export MODEL --format F -o DIR`: export, validate against eager, write artifact + report.

Exit codes: 0 exported and validated; 1 the export failed; 3 validation failed (nothing written).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..auto import AutoExportConfig, AutoHfExporter
from ..errors import ValidationError
from ..loading import load_model
from ..record import record_of
from ..validation import validate
from .output import check_target, staged_folder
from .progress import Progress

VALIDATION_FAILED = 3


def _config_from_args(args):
    data = {"export_format": args.format, "dynamic": not args.static}
    if args.format == "executorch" and args.backend:
        data["backend"] = args.backend
    return AutoExportConfig.from_dict(data)


def _sizes(files: list[Path]) -> int:
    return sum(f.stat().st_size for f in files if f.exists())


def run(args) -> int:
    target = Path(args.output).resolve()
    check_target(target, overwrite=args.overwrite)  # refuse before the slow part
    config = _config_from_args(args)
    exporter = AutoHfExporter.from_config(config)
    progress = Progress(4 if not args.no_validate else 3, enabled=not args.quiet)

    with progress.step(f"loading {args.model}"):
        loaded = load_model(args.model, prompt=args.prompt)
    with progress.step(f"exporting {type(loaded.model).__name__} to {args.format}"):
        start = time.perf_counter()
        artifact = exporter.export(loaded.model, loaded.inputs, config=config)
        export_seconds = time.perf_counter() - start
    record = record_of(artifact)
    report = None
    if not args.no_validate:
        with progress.step(f"validating in {args.format}'s runtime against eager"):
            report = validate(artifact, loaded.model, loaded.inputs, atol=args.tolerance, rtol=args.rtol)
        if not report.passed:
            print(report.to_table())
            raise ValidationError(
                f"the exported artifact differs from eager PyTorch (max abs difference {report.max_abs:.3g}); "
                f"nothing was written to {target}",
                model=record.model_class,
                remedy="look at the failing outputs above; pass --tolerance to accept a larger difference, "
                "or --no-validate to write the artifact anyway",
            )
    with progress.step(f"writing {target}"), staged_folder(target, overwrite=args.overwrite) as staging:
        files = exporter.save(artifact, staging)
        summary = {
            "model": args.model,
            "model_class": record.model_class,
            "format": args.format,
            "export_seconds": round(export_seconds, 3),
            "artifact_files": [f.name for f in files],
            "artifact_bytes": _sizes(files),
            "record": record.summary(),
            "validation": report.to_dict() if report else None,
        }
        (staging / "report.json").write_text(json.dumps(summary, indent=2, default=str))
        (staging / "export_config.json").write_text(config.to_json(indent=2))
        loaded.model.config.save_pretrained(staging)
        if loaded.tokenizer is not None:
            loaded.tokenizer.save_pretrained(staging)
    _print_summary(summary, report, target)
    return 0


def _print_summary(summary: dict, report, target: Path) -> None:
    print(f"exported {summary['model_class']} ({summary['model']}) to {summary['format']}: {target}")
    print(f"  export time:    {summary['export_seconds']:.2f} s")
    print(f"  artifact bytes: {summary['artifact_bytes']:,} ({', '.join(summary['artifact_files'])})")
    details = summary["record"]
    if details.get("delegation"):
        d = details["delegation"]
        print(f"  delegation:     {d['delegated_nodes']} nodes in {d['delegates']} {d['backend']} delegate(s), "
              f"{d['portable_nodes']} on portable kernels")
    if details.get("patches") or details.get("fx_fixes"):
        print(f"  workarounds:    {', '.join(details.get('patches', []) + details.get('fx_fixes', []))}")
    if report is None:
        print("  validation:     skipped (--no-validate)")
    else:
        print(report.to_table())
