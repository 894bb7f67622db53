"""`hfexport generate DIR --prompt-ids 1,2,3` (or `--prompt TEXT`, or `--chat MESSAGE`): generate with
the components of a saved export; `--image-inputs FILE.npz` adds an image-text export's image arrays."""

from __future__ import annotations

import json

from ..errors import PrepareError


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


def run(args) -> int:
    """Run `hfexport generate` with the parsed `args`: generate from a saved export and print the tokens."""
    from ..generation.loop import GenerationRunner

    if args.system is not None and args.chat is None:
        raise ValueError("--system is the system message of a --chat turn; add --chat MESSAGE")
    runner = GenerationRunner.load(args.export_dir, verify=not args.no_verify)
    options = {"min_new_tokens": args.min_new_tokens, "do_sample": args.do_sample, "temperature": args.temperature,
               "top_k": args.top_k, "top_p": args.top_p, "repetition_penalty": args.repetition_penalty,
               "seed": args.seed}
    if args.chat is not None:
        from ..generation.chat import ChatSession

        limit = 256 if args.max_new_tokens is None else args.max_new_tokens
        result = ChatSession(runner, system=args.system).send(args.chat, limit, **options)
    else:
        limit = 16 if args.max_new_tokens is None else args.max_new_tokens
        result = runner.generate(_prompt_ids(args, runner), max_new_tokens=limit, **options, **_image_inputs(args))
    if args.json:
        print(json.dumps({"format": runner.export.format, **result.to_dict()}))
        return 0
    print(f"tokens: {','.join(str(t) for t in result.tokens)}")
    if result.text is not None:
        print(f"text:   {result.text}")
    print(f"{runner.export.format}: time to first token {result.time_to_first_token_s * 1000:.1f} ms, "
          f"{result.tokens_per_s:.1f} tokens/s over {max(len(result.tokens) - 1, 0)} decode steps")
    return 0
