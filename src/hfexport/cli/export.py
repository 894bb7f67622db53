"""`hfexport export MODEL --format F -o DIR`: the export job (`hfexport.job.export_to_folder`), its
arguments parsed and its report printed.

Exit codes: 0 exported and validated; 1 the export failed; 2 the command line, the output folder or
the dtype was refused, before any export (argparse's usage errors, a `--task` its options or the
model contradict: `errors.TaskError`, quantization options the format cannot honour:
`quantize.UsageError`, `output_folder.check_output_folder`, `errors.DtypeRefusedError`); 3
validation failed (nothing written).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import ValidationError
from ..timing import summary_line
from .progress import Progress
from .verdict import component_line, failing_rows, header_line, verdict_line

__all__ = ["NAME", "register", "add_arguments", "run", "OUTPUT_REFUSED", "VALIDATION_FAILED"]

NAME = "export"
OUTPUT_REFUSED = 2
VALIDATION_FAILED = 3
#: the `--task` values a generation export (`--llm-runner`) may come with
_GENERATING_TASKS = ("auto", "text-generation-with-past", "automatic-speech-recognition", "generation-components")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `hfexport export` and its arguments to the command line's `subparsers`."""
    from ..extensions import format_names
    from ..quantization import CLI_SCHEMES

    parser = subparsers.add_parser(NAME, help="export a model, validate it against eager, write artifact + report",
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog=_epilog(format_names(), CLI_SCHEMES))
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `hfexport export`, in `--help`'s order: a flat table, one option a call."""
    from ..backends.executorch.config import DELEGATES
    from ..extensions import format_names
    from ..generation.tasks import TASKS
    from ..loading import DTYPES
    from ..quantization import CLI_SCHEMES
    from .quantize import add_arguments as add_quantization_arguments

    formats = format_names()
    schemes = list(dict.fromkeys(scheme for fmt in formats for scheme in CLI_SCHEMES.get(fmt, {})))
    parser.add_argument("model", help="a local folder, a hub id, a .gguf file (dequantized to float32; pip install "
                        "\"hfexport[gguf]\"), or a tiny random model tiny:NAME (`hfexport presets` lists them)")
    parser.add_argument("--gguf-file", metavar="NAME", help="the GGUF file to load in the folder or hub repo MODEL "
                        "names")
    parser.add_argument("--revision", metavar="REV", default=None,
                        help="the hub revision of MODEL to load: a branch, tag or commit (default: main)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="run the Python code MODEL's repository names in its config (auto_map); off by default")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, metavar="DTYPE",
                        help="%(choices)s: load, export and validate the model in this dtype (auto: the "
                        "checkpoint's own); a format refuses one its runtime cannot run (default: %(default)s)")
    parser.add_argument("--format", "-f", default="dynamo", choices=formats, metavar="FORMAT",
                        help="%(choices)s (default: %(default)s)")
    parser.add_argument("--output", "-o", required=True, help="output folder (must be new or empty, see --overwrite)")
    parser.add_argument("--task", default="auto", choices=["auto", *TASKS], metavar="TASK",
                        help="what to export: %(choices)s (default: auto: a causal LM gets its runtime's LLM package "
                        "(text-generation-with-past), a speech encoder-decoder its speech package (automatic-speech-recognition), "
                        "other models one graph (forward); --generate keeps its meaning). "
                        + "; ".join(f"{task.name}: {task.description}" for task in TASKS.values()))
    parser.add_argument("--static", action="store_true", help="export static shapes (default: dynamic=True)")
    parser.add_argument("--delegate", choices=DELEGATES, metavar="DELEGATE",
                        help="with --format executorch: the delegate, %(choices)s (default: xnnpack)")
    parser.add_argument("--backend", dest="delegate", choices=DELEGATES, help=argparse.SUPPRESS)  # its name before 0.2
    parser.add_argument("--stateless", action="store_true",
                        help="with --format openvino: keep the cache as inputs/outputs (default: OpenVINO variables)")
    parser.add_argument("--external-weights", action=argparse.BooleanOptionalAction, default=None,
                        help="with --format executorch or onnx: the weights in <name>.ptd beside <name>.pte, or "
                        "<name>.onnx.data beside <name>.onnx (default: when they exceed 64 MiB)")
    parser.add_argument("--max-sequence-length", type=int, metavar="N", default=None,
                        help="with --format executorch: the longest sequence the program takes; memory planning "
                        "sizes every intermediate for it (default: the config's position limit, "
                        "max_position_embeddings or T5's n_positions; with --generate, the LLM-runner "
                        "program's cache: default the model's positions up to 2048)")
    parser.add_argument("--max-batch-size", type=int, metavar="N", default=None,
                        help="with --format executorch: the largest batch the program takes (default 8)")
    parser.add_argument("--generate", action="store_true",
                        help="export the generation components (prefill, decode, encoder, ...) with a manifest")
    parser.add_argument("--static-cache", type=int, metavar="N", default=None,
                        help="the LLM package's cache length (--task auto or text-generation-with-past; default: "
                        "the model's positions up to 2048); with --generate --multi-token-decode (implied with "
                        "--format executorch): one decode graph over a static cache of N tokens")
    parser.add_argument("--llm-runner", action=argparse.BooleanOptionalAction, default=None,
                        help="with --format executorch --generate: one program for ExecuTorch's own LLM runner "
                        "(TextLLMRunner) and hfexport generate: the cache inside it (--static-cache N tokens, else "
                        "--max-sequence-length N, else the model's positions up to 2048), written by update_cache and "
                        "read by custom_sdpa; tokenizer.json beside it. Default: that program where the model allows "
                        "it, else the static-cache components (--static-cache N, with a warning) or the dynamic-cache "
                        "ones, the report saying why; --llm-runner: that program or an error; --no-llm-runner: the "
                        "components (the cache as method inputs, which TextLLMRunner cannot load)")
    parser.add_argument("--multi-token-decode", action="store_true",
                        help="with --generate: decode takes any number of new tokens (query axis kept dynamic)")
    parser.add_argument("--quantize", metavar="SCHEME", default=None, choices=schemes,
                        help="%(choices)s (which ones depend on --format, see below; static schemes calibrate on "
                        "the calibration prompts: --calibration-data, else built-in ones)")
    add_quantization_arguments(parser)
    parser.add_argument("--min-cosine", type=float, default=None,
                        help="with --quantize: pass if the logits' (each output's but the cache's) cosine "
                        "similarity with fp32 eager reaches this, and with --generate their mean over the "
                        "accuracy gate's steps (default 0.99 for int4 schemes, 0.995 otherwise; with --generate "
                        "the defaults are advisory, the gate decides: a value given binds validation)")
    parser.add_argument("--min-cache-cosine", type=float, default=None,
                        help="with --quantize: the same for each cache tensor (default 0.9 for int4 schemes, "
                        "0.95 otherwise, at most --min-cosine; advisory with --generate unless given)")
    parser.add_argument("--min-agreement", type=float, default=None,
                        help="with --generate --quantize: pass if the greedy tokens equal fp32 eager generate()'s "
                        "on this share of 64 teacher-forced steps (default 0.6 for int4 schemes, 0.7 otherwise)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier hfexport export in the output folder (only the files it wrote; a "
                        "folder holding other files is refused)")
    parser.add_argument("--no-validate", action="store_true", help="skip the comparison with eager")
    parser.add_argument("--tolerance", type=float, default=None, help="absolute tolerance (default per format)")
    parser.add_argument("--rtol", type=float, default=None, help="relative tolerance (default per format)")
    parser.add_argument("--prompt", default="Hello, world!", help="sample prompt when the model has a tokenizer")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")


def _epilog(formats: list[str], schemes: dict[str, dict]) -> str:
    """The `export --help` text after the options: the --quantize schemes each format takes."""
    from .quantize import epilog

    width = max(map(len, formats))
    lines = [f"  {fmt + ':':<{width + 1}} {', '.join(schemes.get(fmt, {})) or 'none'}" for fmt in formats]
    return ("--quantize schemes per --format:\n" + "\n".join(lines) + "\n\n" + epilog(formats)
            + "\n\n`hfexport presets` lists the tiny:NAME models.")


def _config_from_args(args) -> Any:
    from ..auto import AutoExportConfig

    data = {"export_format": args.format, "dynamic": not args.static}
    if args.delegate:
        if args.format != "executorch":
            raise ValueError(f"--delegate picks an ExecuTorch delegate; it does not apply to --format {args.format}")
        data["delegate"] = args.delegate
    if getattr(args, "stateless", False):
        if args.format != "openvino":
            raise ValueError(f"--stateless picks OpenVINO's plain (stateless) model; it does not apply to --format {args.format}")
        data["stateful"] = False
    if getattr(args, "external_weights", None) is not None:
        option = {"executorch": "external_weights", "onnx": "external_data"}.get(args.format)
        if option is None:
            raise ValueError("--external-weights puts the weights of an ExecuTorch program in a .ptd and of an ONNX "
                             f"graph in a .onnx.data; it does not apply to --format {args.format} (OpenVINO's are "
                             "always in their .bin)")
        data[option] = args.external_weights
    if getattr(args, "llm_runner", None) is not None:
        if args.format != "executorch":
            raise ValueError(f"--llm-runner / --no-llm-runner choose ExecuTorch's LLM-runner program; they do not "
                             f"apply to --format {args.format}")
        if not (args.generate or args.static_cache) and args.task not in _GENERATING_TASKS:
            raise ValueError("--llm-runner / --no-llm-runner shape a generation export: add --generate, or pass "
                             "--task auto or text-generation-with-past")
        data["llm_runner"] = args.llm_runner
    for name in ("max_sequence_length", "max_batch_size"):
        if getattr(args, name, None) is not None:
            if args.format != "executorch":
                raise ValueError(f"--{name.replace('_', '-')} bounds ExecuTorch's memory plan; it does not apply to "
                                 f"--format {args.format} (its dynamic dims have no upper bound)")
            data[name] = getattr(args, name)
    return AutoExportConfig.from_dict(data)


def _generation_options(args) -> Any:
    """The generation options of `args` (`GenerationOptions` refuses a `--task` they contradict), and
    the command line's own rules on them: those that contradict each other are refused."""
    from ..job.options import GenerationOptions

    generation = GenerationOptions(task=args.task, generate=args.generate, multi_token_decode=args.multi_token_decode,
                                   static_cache=args.static_cache)
    generate = args.generate or args.task == "generation-components"
    if args.multi_token_decode and not generate:
        raise ValueError("--multi-token-decode shapes the generation components; add --generate")
    if args.static_cache and generate and not args.multi_token_decode and args.format != "executorch":
        # ExecuTorch's static-cache program (the LLM runner's) takes any number of tokens per call by construction
        raise ValueError("--static-cache N makes one decode graph that also prefills; add --multi-token-decode")
    return generation


def run(args) -> int:
    """Run `hfexport export` with the parsed `args`; return the exit code."""
    from ..job.export import export_to_folder
    from ..job.options import JobOptions, JudgingOptions, LoadingOptions
    from .quantize import choice_from_args

    generation = _generation_options(args)
    choice = choice_from_args(args)
    config = _config_from_args(args)
    options = JobOptions(
        loading=LoadingOptions(prompt=args.prompt, gguf_file=args.gguf_file, revision=args.revision,
                               trust_remote_code=args.trust_remote_code, dtype=args.dtype),
        judging=JudgingOptions(validate=not args.no_validate, atol=args.tolerance, rtol=args.rtol,
                               min_cosine=args.min_cosine, min_cache_cosine=args.min_cache_cosine,
                               min_agreement=args.min_agreement),
        generation=generation, quantize=choice, overwrite=args.overwrite,
        progress=Progress(enabled=not args.quiet, heartbeat=not (args.verbose or args.debug)))
    verbose = args.verbose or args.debug
    try:
        result = export_to_folder(args.model, config, args.output, options)
    except ValidationError as error:
        if reports := getattr(error, "reports", {}):  # nothing was written: the failing rows are only here
            _print_validation(reports, verbose, failed_only=True)
            print(verdict_line(False))
        raise
    _print_summary(result.report, result.reports, result.directory, verbose)
    return 0


def _cache_words(cache: dict | None) -> str:
    """What the summary's task line says of an LLM package's cache (`RuntimePackage.request`)."""
    if cache is None:
        return ""
    return f"; cache {cache['tokens']} tokens ({cache['from']})" if cache["tokens"] else f"; cache: {cache['from']}"


def _print_validation(reports: dict, verbose: bool, *, failed_only: bool = False) -> None:
    """Validation as a person reads it: where it ran, a line per component, and (`verbose`) every
    output's row; after a failure (`failed_only`), the failing rows, or with `verbose` the failing
    components' whole tables. The verdict line comes after whatever else the summary says."""
    if verbose:
        for report in reports.values():
            if report.passed and failed_only:
                continue
            print(report.to_table())
    print(header_line(reports))
    for name, report in reports.items():
        print(component_line(name, report))
        if failed_only and not verbose:
            for row in failing_rows(report):
                print(f"  {row}")


def _print_summary(summary: dict, reports: dict, target: Path, verbose: bool = False) -> None:
    print(f"exported {summary['model_class']} ({summary['model']}) to {summary['format']}: {target}")
    if task := summary.get("task"):
        print(f"  task:           {task['name']}: {task['reason']}{_cache_words(task.get('cache'))}")
    print(f"  dtype:          {summary['dtype']}")
    if source := summary.get("weights_from"):
        print(f"  weights:        from {source['format'].upper()} {source['file']} ({source['quantization']}), "
              f"dequantized to {source['dequantized_to']}")
    if (llm := summary.get("llm_runner")) is not None:
        cache = llm.get("cache")
        print(f"  LLM runner:     {llm['program']} runs in ExecuTorch's TextLLMRunner and hfexport generate"
              + (f"; its cache holds {cache['tokens']} tokens ({cache['from']})" if cache else "")
              if llm.get("program") else f"  LLM runner:     not this export ({llm['why']}): {llm['run']}")
    print(f"  export time:    {summary['export_seconds']:.2f} s")
    if timing := summary.get("timing"):  # where the job's time went, each phase summed over the components
        print(f"  {summary_line(timing)}")
    ratio = summary["artifact_bytes"] / summary["weight_bytes"] if summary.get("weight_bytes") else float("nan")
    print(f"  artifact bytes: {summary['artifact_bytes']:,} ({ratio:.2f}x the model's "
          f"{summary['weight_bytes']:,} weight bytes{', quantized ' + summary['quantize'] if summary.get('quantize') else ''})")
    if (choice := summary.get("quantization")) is not None:
        _print_quantization(choice)
    for name, entry in summary["components"].items():
        details = entry["record"]
        print(f"  {name}: {', '.join(entry['files'])} ({entry['bytes']:,} bytes, {entry['export_seconds']:.2f} s)")
        if details.get("delegation"):
            d = details["delegation"]
            print(f"    delegation:  {d['delegated_nodes']} nodes in {d['delegates']} {d['delegate']} delegate(s), "
                  f"{d['portable_nodes']} on portable kernels")
        if details.get("quantization"):
            q = details["quantization"]
            counts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in q.items()
                               if k not in ("quantizer", "scheme", "stage", "note"))
            print(f"    quantized:   {q['quantizer']} {q['scheme']} on the {q['stage']} stage: {counts}")
        if details.get("patches"):
            print(f"    patches the export ran: {', '.join(details['patches'])}")
        if details.get("fx_fixes"):
            print(f"    FX fixes that changed the graph: {', '.join(details['fx_fixes'])}")
    if not reports:
        print("  validation:     skipped (--no-validate)")
    else:
        _print_validation(reports, verbose)
    if accuracy := summary.get("accuracy"):
        print(f"  accuracy:       greedy tokens equal fp32 eager generate()'s on {accuracy['agreement']:.0%} of "
              f"{accuracy['tokens']} steps (floor {accuracy['min_agreement']:.0%}); logits cosine "
              f"min {accuracy['min_cosine']:.4f}, mean {accuracy['mean_cosine']:.4f}"
              + (f" (floor {floor:.4g})" if (floor := accuracy.get("min_mean_cosine")) is not None else "")
              + (f"; over {clips} clips; its own transcripts' token error rate against eager's "
                 f"{accuracy['token_error_rate']:.0%}" if (clips := accuracy.get("clips")) else ""))
    if runner := summary.get("runner"):
        print(f"  runtime runner: {_runner_line(runner)}")
    if reports:
        print(verdict_line(all(report.passed for report in reports.values())))


def _runner_line(runner: dict) -> str:
    """The summary's line on the runner check (`job.runner_check`)."""
    if not runner["checked"]:
        return f"NOT CHECKED: {runner['why']}"
    agreed = (f"agree with {runner['against']} on {runner['agreement']:.0%} (floor {runner['min_agreement']:.0%})"
              if "agreement" in runner else f"equal {runner['against']}'s")
    if "features_max_abs_diff" in runner:  # a speech runner that made its own features: eager ran on them
        apart = runner["features_max_abs_diff"]
        agreed += " on the runner's own features " + ("(of another shape than the feature extractor's)" if apart is None
                                                      else f"(max abs {apart:.3g} from the feature extractor's)")
    return f"{runner['runner']}: its {runner['tokens']} greedy tokens {agreed} ({runner['seconds']:.1f} s)"


def _print_quantization(choice: dict) -> None:
    """The quantization choices as the report records them (`QuantizationChoice.to_dict`)."""
    given = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in choice.items()
                      if k not in ("scheme", "calibration") and v not in (None, False))
    print(f"  quantization:   {choice['scheme'] or 'none'}" + (f" ({given})" if given else ""))
    if calibration := choice.get("calibration"):
        print(f"  calibration:    {calibration['samples']} sample(s) from {calibration['source']}")
