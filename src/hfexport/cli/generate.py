"""`hfexport generate DIR --prompt-ids 1,2,3` (or `--prompt TEXT`, or `--chat MESSAGE`): generate with
the components of a saved export; `--image-inputs FILE.npz` adds an image-text export's image arrays,
`--image PATH --prompt TEXT` an image file read with the processor saved in the export; `--audio PATH`
(or `--audio-inputs FILE.npz`) transcribes a clip with a speech export, in place of a prompt, or asks an
audio-text export about it with `--prompt`."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from typing import Any

from .._versions import is_importable, pip_line
from ..errors import PrepareError
from .arguments import add_engine, add_no_verify
from .quantize import UsageError

NAME = "generate"

#: The remedy of an `--image` the export or this install cannot read.
_ARRAYS_INSTEAD = "or pass the processor's arrays with --image-inputs FILE.npz and the prompt's ids with --prompt-ids"
#: The remedy of an `--audio` the export or this install cannot read.
_AUDIO_ARRAYS_INSTEAD = "or pass the feature extractor's arrays (input_features) with --audio-inputs FILE.npz"


def _prompt_ids(args, runner) -> list[int]:
    if args.prompt_ids is not None:
        try:
            return [int(token) for token in args.prompt_ids.replace(" ", "").split(",") if token]
        except ValueError as error:
            raise PrepareError(f"--prompt-ids takes comma-separated integers, got {args.prompt_ids!r}",
                               remedy="write it like --prompt-ids 1,2,3") from error
    tokenizer = runner.export.tokenizer
    if tokenizer is None:
        raise PrepareError(f"{args.export_dir} holds no tokenizer, so --prompt text cannot be turned into ids",
                           remedy="pass --prompt-ids, or export a model folder that has a tokenizer")
    return tokenizer(args.prompt)["input_ids"]


def _image_inputs(args) -> dict:
    """The arrays of `--image-inputs FILE.npz` by name (none without the option)."""
    if args.image_inputs is None:
        return {}
    import numpy as np

    if args.chat is not None:
        raise PrepareError("--image-inputs goes with --prompt-ids or --prompt, not --chat",
                           remedy="pass the prompt holding the image tokens with --prompt-ids")
    with np.load(args.image_inputs) as arrays:
        return {name: arrays[name] for name in arrays.files}


def _check_image_options(args) -> None:
    """`--image` goes with `--prompt TEXT`, and needs Pillow (exit 2 otherwise, before any loading)."""
    if args.image is None:
        return
    if args.prompt is None:
        raise UsageError("--image goes with --prompt TEXT (the processor places the image tokens and applies "
                         "the chat template); with --prompt-ids or --chat, pass --image-inputs FILE.npz")
    if not is_importable("pillow"):
        raise UsageError(f"--image needs Pillow to read the image, which is not installed: {pip_line('vision')}; "
                         + _ARRAYS_INSTEAD)


def _check_audio_options(args) -> None:
    """`--audio` and `--audio-inputs` stand in for a prompt (one of the four is needed) or go with one
    (an audio-text LLM's question: `--prompt` with `--audio`, `--prompt-ids` with `--audio-inputs`),
    and `--audio` needs soundfile and scipy (exit 2 otherwise, before any loading)."""
    clip = "--audio" if args.audio is not None else "--audio-inputs" if args.audio_inputs is not None else None
    if clip is None:
        if args.prompt_ids is None and args.prompt is None and args.chat is None:
            raise UsageError("give the input: --prompt-ids 1,2,3, --prompt TEXT or --chat MESSAGE, or with a speech "
                             "export --audio FILE")
        return
    # an audio-text LLM's prompt: text the processor places the clip's tokens in, or ids already holding them
    allowed = "--prompt" if clip == "--audio" else "--prompt-ids"
    given = next((name for name, value in (("--chat", args.chat), ("--prompt", args.prompt),
                                           ("--prompt-ids", args.prompt_ids), ("--image", args.image),
                                           ("--image-inputs", args.image_inputs))
                  if value is not None and name != allowed), None)
    if given is not None:
        placed = ", the processor placing the audio tokens" if clip == "--audio" else " holding the audio tokens"
        raise UsageError(f"{clip} goes without {given}: drop {given} (a speech export's decoder prompt comes from "
                         f"the generation config saved in the export; an audio-text export takes {allowed} with "
                         f"{clip}{placed})")
    missing = [name for name in ("soundfile", "scipy") if not is_importable(name)]
    if clip == "--audio" and missing:
        raise UsageError(f"--audio needs {' and '.join(missing)} to read and resample the clip, which "
                         f"{'is' if len(missing) == 1 else 'are'} not installed: {pip_line('audio')}; "
                         + _AUDIO_ARRAYS_INSTEAD)


def _generate_from_audio(args, runner, limit: int, options: dict):
    """`runner.generate_from_audio` on `--audio` (and an audio-text LLM's `--prompt`), or `generate` on
    the arrays of `--audio-inputs` (and an audio-text LLM's `--prompt-ids`, or the arrays' `input_ids`);
    an export or a clip that cannot be read this way exits 2, saying why."""
    clip = "--audio" if args.audio is not None else "--audio-inputs"
    if not runner.takes_audio:
        raise UsageError(f"{clip} needs a speech export (an encoder taking input_features, as Whisper's, or an "
                         f"audio-text model's audio encoder); {args.export_dir} is not one: drop {clip} and give a "
                         "prompt")
    prompt = "--prompt" if args.prompt is not None else "--prompt-ids" if args.prompt_ids is not None else None
    if runner.is_speech and prompt is not None:
        raise UsageError(f"{clip} is the whole input of a speech encoder-decoder's export, so it goes without "
                         f"{prompt}: drop {prompt} (the decoder's prompt comes from the generation config saved in "
                         "the export)")
    if args.audio is not None and not runner.export.has_processor:
        raise UsageError(f"{args.export_dir} holds no feature extractor to read audio with: export again from a model "
                         f"folder that has its processor (preprocessor_config.json), {_AUDIO_ARRAYS_INSTEAD}")
    try:
        if args.audio_inputs is not None:
            arrays = _npz_arrays(args.audio_inputs)
            if runner.is_speech:
                return runner.generate([], max_new_tokens=limit, **options, **arrays)
            ids = _prompt_ids(args, runner) if args.prompt_ids is not None else arrays.pop("input_ids", None)
            if ids is None:
                raise UsageError(f"{args.audio_inputs} holds no input_ids: pass the prompt's ids, holding one audio "
                                 "token per row of the clip, with --prompt-ids, or save the processor's whole output")
            arrays.pop("attention_mask", None)
            return runner.generate(ids, max_new_tokens=limit, **options, **arrays)
        runner.processor()
        return runner.generate_from_audio(args.audio, max_new_tokens=limit, prompt=args.prompt, **options)
    except ImportError as error:  # soundfile or scipy, or what transformers needs for the feature extractor
        raise UsageError(f"cannot read {args.audio} with {args.export_dir}'s feature extractor: "
                         f"{str(error).strip().splitlines()[0]}") from error
    except PrepareError as error:  # refused before generating: the file, its length, the arrays, the positions
        raise UsageError(str(error).replace("\n", " ").removeprefix(f"[{PrepareError.step}] ")) from error


def _npz_arrays(path: str) -> dict:
    """The arrays of the `.npz` file `path` by name (exit 2 where it is no such file)."""
    import numpy as np

    try:
        with np.load(path) as arrays:
            return {name: arrays[name] for name in arrays.files}
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot read {path} as a numpy .npz file: {error}") from error


def _generate_from_image(args, runner, limit: int, options: dict):
    """`runner.generate_from_image` on `--image` and `--prompt`; an export that cannot read an image
    file (a text-only one, one without a processor, a processor this install cannot build) exits 2."""
    if runner.image_prefill is None:
        raise UsageError(f"--image needs an image-text export; {args.export_dir} is a text-only one: "
                         "drop --image")
    if not runner.export.has_processor:
        raise UsageError(f"{args.export_dir} holds no processor to read an image with: export again from a model "
                         f"folder that has its processor (processor_config.json), {_ARRAYS_INSTEAD}")
    try:
        runner.processor()
    except ImportError as error:
        raise UsageError(f"transformers cannot build the processor saved in {args.export_dir}: "
                         f"{str(error).strip().splitlines()[0]} Install what it names, {_ARRAYS_INSTEAD}") from error
    return runner.generate_from_image(args.image, args.prompt, max_new_tokens=limit, **options)


def load_runner(args):
    """`GenerationRunner.load` of `args.export_dir` as `--no-verify` and `--engine` ask (an
    `--engine runtime` the folder has no engine for exits 2, saying why)."""
    from ..generation.loop import GenerationRunner

    with engine_refusal_as_usage():
        return GenerationRunner.load(args.export_dir, verify=not args.no_verify, engine=args.engine)


@contextlib.contextmanager
def engine_refusal_as_usage() -> Iterator[None]:
    """`--engine runtime` refused (`engine.EngineRefused`) as a usage error: exit 2, before any work."""
    from ..folder.engine import EngineRefused

    try:
        yield
    except EngineRefused as error:
        raise UsageError(str(error).replace("\n", " ").removeprefix("[run] ")) from None


def ran_on(runner, result) -> str:
    """The format, and what generated `result` where the folder has a runtime's engine: the
    engine, or hfexport's loop and why (a folder without one says nothing more)."""
    from ..folder.engine import HFEXPORT

    if result.engine != HFEXPORT:
        return f"{runner.export.format} ({result.engine})"
    if runner.engine is not None:
        return f"{runner.export.format} (hfexport's loop: {result.engine_reason})"
    return runner.export.format


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `hfexport generate` and its arguments to the command line's `subparsers`."""
    parser = subparsers.add_parser(NAME, help="generate tokens with an export written by `export --generate`")
    parser.add_argument("export_dir", help="the folder `hfexport export --generate -o DIR` wrote")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", help="the prompt as token ids: 1,2,3")
    prompt.add_argument("--prompt", help="the prompt as text (needs a tokenizer saved with the export)")
    prompt.add_argument("--chat", metavar="MESSAGE",
                        help="one user message, templated with the chat template saved with the export; prints "
                        "the answer, stopping at the model's end-of-turn token")
    parser.add_argument("--system", help="with --chat: a system message before it")
    image = parser.add_mutually_exclusive_group()
    image.add_argument("--image", metavar="PATH",
                       help="with an image-text export and --prompt: an image file (Pillow: pip install "
                       "\"hfexport[vision]\"), read with the processor saved in the export; the prompt is "
                       "formatted with its chat template where it has one")
    image.add_argument("--image-inputs", metavar="FILE.npz",
                       help="with an image-text export: the processor's image arrays (pixel_values, and "
                       "image_grid_thw for Qwen2-VL) saved with numpy.savez; the prompt holds the image tokens")
    # speech (issue 52): the clip is the whole input, in place of a prompt (checked by _check_audio_options)
    prompt.required = False
    audio = parser.add_mutually_exclusive_group()
    audio.add_argument("--audio", metavar="PATH",
                       help="with a speech export (Whisper), in place of a prompt: a WAV or FLAC file (soundfile: pip "
                       "install \"hfexport[audio]\"), mixed to mono, resampled and turned into features by the "
                       "feature extractor saved in the export; prints the transcript. With an audio-text export "
                       "(Qwen2-Audio), the clip goes with --prompt TEXT (default: a transcription request), "
                       "formatted with the processor's chat template")
    audio.add_argument("--audio-inputs", metavar="FILE.npz",
                       help="with a speech export, in place of a prompt: the feature extractor's arrays "
                       "(input_features) saved with numpy.savez; with an audio-text export, the processor's "
                       "arrays (input_features, feature_attention_mask, and input_ids or --prompt-ids)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 16, 256 with --chat")
    parser.add_argument("--min-new-tokens", type=int, default=0)
    parser.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--repetition-penalty", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None, help="seed for --do-sample (reproducible tokens)")
    add_engine(parser)
    parser.add_argument("--json", action="store_true", help="print the result as JSON (token ids, text, timings)")
    parser.add_argument("--ids", action="store_true",
                        help="print the generated token ids after the text (printed anyway where the export "
                        "holds no tokenizer)")
    add_no_verify(parser)
    return parser


def run(args) -> int:
    """Run `hfexport generate` with the parsed `args`: generate from a saved export and print the text (the
    token ids with `--ids`, or where the export holds no tokenizer; everything with `--json`)."""
    if args.system is not None and args.chat is None:
        raise ValueError("--system is the system message of a --chat turn; add --chat MESSAGE")
    _check_image_options(args)
    _check_audio_options(args)
    runner = load_runner(args)
    if runner.is_speech and args.audio is None and args.audio_inputs is None:
        raise UsageError(f"{args.export_dir} is a speech export: its encoder takes audio features, not a prompt; "
                         "pass --audio FILE (or --audio-inputs FILE.npz) instead")
    options = {"min_new_tokens": args.min_new_tokens, "do_sample": args.do_sample, "temperature": args.temperature,
               "top_k": args.top_k, "top_p": args.top_p, "repetition_penalty": args.repetition_penalty,
               "seed": args.seed}
    with engine_refusal_as_usage():
        if args.chat is not None:
            from ..generation.chat import ChatSession

            limit = 256 if args.max_new_tokens is None else args.max_new_tokens
            result = ChatSession(runner, system=args.system).send(args.chat, limit, **options)
        elif args.image is not None:
            limit = 16 if args.max_new_tokens is None else args.max_new_tokens
            result = _generate_from_image(args, runner, limit, options)
        elif args.audio is not None or args.audio_inputs is not None:
            limit = 16 if args.max_new_tokens is None else args.max_new_tokens
            result = _generate_from_audio(args, runner, limit, options)
        else:
            limit = 16 if args.max_new_tokens is None else args.max_new_tokens
            result = runner.generate(_prompt_ids(args, runner), max_new_tokens=limit, **options, **_image_inputs(args))
    if args.json:
        print(json.dumps({"format": runner.export.format, **result.to_dict()}))
        return 0
    print("\n".join(result_lines(args, runner, result)))
    return 0


def result_lines(args, runner, result) -> list[str]:
    """What `generate` prints of `result` without `--json`: the text (or the ids), a hint where a
    `--prompt` ended at once on a chat model's end token, and what ran it how fast."""
    ids = ",".join(str(t) for t in result.tokens)
    if result.text is None:  # the ids are all there is
        lines = [f"tokens: {ids} ({args.export_dir} holds no tokenizer to turn them into text)"]
    else:
        lines = [f"text:   {result.text}"] + ([f"tokens: {ids}"] if args.ids else [])
    tokenizer = runner.export.tokenizer if result.text is not None else None
    # not after --image, --image-inputs or a clip: --chat takes none of them (`_check_image_options`)
    if (args.chat is None and args.image is None and args.image_inputs is None and args.audio is None
            and args.audio_inputs is None and result.stopped_at_eos
            and len(result.tokens) == 1 and getattr(tokenizer, "chat_template", None)):
        lines.append("note:   the model's first token was its end token: its tokenizer has a chat template, so it "
                     "likely expects a chat turn: ask with --chat MESSAGE")
    speed = (f"{result.tokens_per_s:.1f} tokens/s over {len(result.tokens) - 1} decode steps"
             if len(result.tokens) > 1 else "no decode steps")
    lines.append(f"{ran_on(runner, result)}: time to first token {result.time_to_first_token_s * 1000:.1f} ms, "
                 f"{speed}")
    return lines
