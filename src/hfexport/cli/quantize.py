"""`hfexport export`'s quantization words besides `--quantize`: optimum-intel's (`--weight-format
int4 --group-size 64 --ratio 0.8 --sym --awq --scale-estimation`), optimum-executorch's
(`--qembedding 8w`) and calibration prompts (`--calibration-data FILE --num-samples N`), parsed
into a `QuantizationChoice` and checked against `--format` before the model loads."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["UsageError", "add_arguments", "choice_from_args", "epilog"]


class UsageError(ValueError):
    """A command line asking for what its options cannot give together: exit code 2, as argparse's."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the quantization words to `export`'s parser, as one argument group."""
    from ..quantization.choice import EMBEDDING_WORDS, WEIGHT_FORMATS

    words = list(dict.fromkeys(word for table in WEIGHT_FORMATS.values() for word in table))
    group = parser.add_argument_group("quantization", "optimum's words for a --quantize scheme and its options; "
                                      "an option the format's quantizer cannot honour is an error (exit 2)")
    group.add_argument("--weight-format", choices=words, metavar="WORD",
                       help="%(choices)s: optimum's word for a weight scheme (which ones depend on --format, see "
                       "below); with --quantize, both must mean the same scheme")
    group.add_argument("--group-size", type=int, metavar="N",
                       help="weights per int4 scale: ONNX Runtime's MatMulNBits block_size (onnx int4/int8), "
                       "NNCF's group_size (openvino/dynamo int4), torchao's (executorch 8da4w)")
    group.add_argument("--ratio", type=float, metavar="R",
                       help="share of linear weights at int4, the rest int8 (openvino/dynamo int4, executorch 8da4w)")
    group.add_argument("--sym", action=argparse.BooleanOptionalAction, default=None,
                       help="symmetric weights (--no-sym or --asym: asymmetric; onnx, openvino and dynamo weight "
                       "schemes; default the quantizer's)")
    group.add_argument("--asym", dest="sym", action="store_false", help=argparse.SUPPRESS)
    group.add_argument("--qembedding", choices=list(EMBEDDING_WORDS), metavar="WORD",
                       help="%(choices)s: quantize the token embedding (executorch 8da4w; default none)")
    group.add_argument("--awq", action="store_true",
                       help="NNCF's AWQ on the calibration prompts (openvino int4)")
    group.add_argument("--scale-estimation", action="store_true",
                       help="NNCF's scale estimation on the calibration prompts (openvino int4)")
    group.add_argument("--calibration-data", metavar="FILE",
                       help="prompts for int8-static, --awq and --scale-estimation: a .txt (one a line) or .jsonl "
                       '({"text": ...} or {"prompt": ...} a line), tokenized with the model\'s tokenizer (default: '
                       "built-in prompts of chat, code, prose, lists and other languages)")
    group.add_argument("--num-samples", type=int, default=32, metavar="N",
                       help="the most calibration prompts used (default %(default)s)")


def choice_from_args(args: Any) -> Any:
    """The `QuantizationChoice` the command line asks for (`None`: no quantization word given),
    checked against `--format` and the prompt file read; `UsageError` when they do not fit."""
    from ..quantization import QuantizationChoice
    from ..quantization.calibration import read_prompts

    embedding = getattr(args, "qembedding", None)
    choice = QuantizationChoice(
        scheme=args.quantize, weight_format=args.weight_format, group_size=args.group_size, ratio=args.ratio,
        sym=args.sym, embedding_bits=None if embedding is None else _embedding_bits(embedding), awq=args.awq,
        scale_estimation=args.scale_estimation, calibration_data=args.calibration_data, num_samples=args.num_samples)
    if choice == QuantizationChoice(num_samples=args.num_samples) and embedding is None:
        if args.num_samples != 32:
            raise UsageError("--num-samples sets how many calibration prompts a quantization runs on; add --quantize "
                             "or --weight-format")
        return None
    try:
        if choice.quantizer(args.format) is None and embedding is not None:  # `--qembedding none` alone
            raise ValueError("--qembedding quantizes the embedding beside a weight scheme; add --weight-format 8da4w")
        if choice.calibration_data is not None:
            read_prompts(choice.calibration_data)
    except ValueError as error:
        raise UsageError(str(error)) from None
    return choice


def _embedding_bits(word: str) -> int | None:
    from ..quantization.choice import EMBEDDING_WORDS

    return EMBEDDING_WORDS[word]


def epilog(formats: list[str]) -> str:
    """The `export --help` lines that list the --weight-format words each format takes."""
    from ..quantization.choice import WEIGHT_FORMATS

    width = max(map(len, formats))
    lines = [f"  {fmt + ':':<{width + 1}} {', '.join(WEIGHT_FORMATS.get(fmt, {})) or 'none'}" for fmt in formats]
    return "--weight-format words per --format:\n" + "\n".join(lines)
