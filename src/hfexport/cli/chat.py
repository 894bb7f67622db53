"""`hfexport chat DIR`: a conversation with a generation export, one stdin line per user turn, each
answer written as it is generated (`generation.chat.ChatSession`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import ExportError
from .arguments import add_engine, add_no_verify

__all__ = ["NAME", "register", "run"]

NAME = "chat"

QUIT = ("/quit", "/exit")
RESET = "/reset"


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `hfexport chat` and its arguments to the command line's `subparsers`."""
    parser = subparsers.add_parser(NAME, help="talk with an export written by `export --generate`: each line on "
                                   "stdin is a user turn, answered as it is generated (/reset starts over; /quit or "
                                   "end of input ends)")
    parser.add_argument("export_dir",
                        help="the folder `hfexport export --generate -o DIR` wrote (with a chat template)")
    parser.add_argument("--system", help="a system message to start the conversation with")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="most tokens per answer (default 256)")
    add_engine(parser)
    add_no_verify(parser)
    parser.add_argument("--json", action="store_true",
                        help="print each answer as one JSON line (tokens, text, timings) instead of streaming it")
    return parser


def run(args) -> int:
    """Run `hfexport chat` with the parsed `args`: answer each line of stdin until /quit or its end."""
    from ..generation.chat import ChatSession
    from .generate import engine_refusal_as_usage, load_runner

    runner = load_runner(args)
    chat = ChatSession(runner, system=args.system)
    interactive = sys.stdin.isatty()
    engine = runner.engine.name if runner.engine is not None else "hfexport's loop" + (
        f" ({runner.engine_reason})" if runner.engine_reason else "")
    print(f"hfexport: chatting with {runner.export.manifest.get('model_class')} ({runner.export.format}, "
          f"{'static' if runner.static else 'dynamic'} cache, {engine}) from {args.export_dir}; {RESET} starts "
          f"over, {QUIT[0]} or end of input (Ctrl-D) ends", file=sys.stderr, flush=True)
    told = None
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line or line.strip() in QUIT:
            return 0
        message = line.rstrip("\n")
        if message.strip() == RESET:
            chat.reset()
            continue
        if not message.strip():
            continue
        try:
            with engine_refusal_as_usage():
                result = _answer(chat, message, args)
        except ExportError as error:  # this turn failed (a full static cache); the user may /reset
            print(f"hfexport: error: {str(error).replace(chr(10), ' ')}", file=sys.stderr, flush=True)
            continue
        if chat.reprefill_reason and chat.reprefill_reason != told:
            told = chat.reprefill_reason
            print(f"hfexport: this export prefills the whole conversation each turn: {told}", file=sys.stderr,
                  flush=True)
        if chat.cache_full:
            print(f"hfexport: the answer stopped where the export's static cache ends ({runner.max_cache_len} "
                  f"tokens); {RESET} starts a new conversation (or export with a larger --static-cache)",
                  file=sys.stderr, flush=True)
        if interactive:
            print(f"[{len(result.tokens)} tokens, {result.tokens_per_s:.1f} tokens/s, "
                  f"{chat.prefilled} prompt tokens fed]", file=sys.stderr, flush=True)


def _answer(chat, message: str, args):
    """One turn: printed as one JSON line (`--json`), or streamed as it comes."""
    from ..generation.chat import TextStream

    if args.json:
        result = chat.send(message, args.max_new_tokens)
        print(json.dumps({"format": chat.runner.export.format, "prefilled": chat.prefilled, **result.to_dict()}),
              flush=True)
    else:
        result = chat.send(message, args.max_new_tokens, streamer=TextStream(chat.tokenizer, _write))
        _write("\n")
    return result
