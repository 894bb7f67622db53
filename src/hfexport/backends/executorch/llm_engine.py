"""ExecuTorch's `TextLLMRunner` driving `hfexport generate` and `chat` on an LLM-runner program
(`folder/engine.py`).

# NOTE: what the runner is given, and how token ids go in and out. `TextLLMRunner(program,
# tokenizer, data)` (executorch 1.4.1's bindings) opens files by path, so it gets a private folder:
# the `.pte` written from the checked bytes the component's load holds, or the private copies of
# the `.pte` and its `.ptd` that load wrote (`artifact.PteBuffer`), linked. It takes text and hands
# back text pieces, so, as the export job's runner check does (`text_runner.py`), it is given a
# tokenizer whose token i is the one character `chr(FIRST_ID_CHAR + i)`: the ids go in exactly and each
# piece names its id. `GenerationConfig(warming=True)` keeps the runner from printing the pieces
# and its report on stdout; its log lines (stderr) are kept out of the terminal while it runs, and
# quoted when it fails.
#
# How it stops. The runner stops at the program's end tokens (`get_eos_ids`), and `stop()` ends
# its loop after the token being handed back, except for the first token of a call, which comes
# from the prefill before the loop starts (1.4.1 resets the stop flag at the loop's start). So:
# a stop token in the loop calls `stop()`; a stop token first in a call raises out of the
# callback, which leaves the runner's position after the prompt (the token is not fed, as after
# `stop()`); a call that ends at a program end token that is no stop token of the request goes on
# with another call fed that token. The runner has no `min_new_tokens` (no logits mask), so a
# request with one runs hfexport's loop, and no way to cut its cache back but `reset()`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ...folder.engine import EngineConversation, EngineRequest, LlmEngine
from ...folder.manifest import ListedFiles, parse_json

__all__ = ["TextLlmRunnerEngine", "open_text_llm_runner_engine"]

_BINDINGS: dict[str, Any] = {}


def runner_bindings() -> Any:
    """executorch's `_llm_runner` bindings, loaded in this process once (`text_runner.LOAD_RUNNER`:
    the llama:: kernels' library, then the bindings by path)."""
    from .text_runner import LOAD_RUNNER

    if "llm" not in _BINDINGS:
        namespace: dict[str, Any] = {}
        exec(LOAD_RUNNER, namespace)  # noqa: S102 - hfexport's own loader script, not a file's
        _BINDINGS["llm"] = namespace["llm"]
    return _BINDINGS["llm"]


def open_text_llm_runner_engine(export: Any) -> TextLlmRunnerEngine:
    """`TextLLMRunner` on a private copy of `export`'s (a `GenerationExport`) LLM-runner program.

    Raises:
        RunnerUnavailable: the folder holds the components, not the LLM-runner program, or
            executorch's LLM runner is not installed.
    """
    from ..._versions import installed_version, is_importable
    from ...folder.package import RunnerUnavailable
    from ...folder.manifest import runtime_package
    from .llm_export import TEXT_RUNNER
    from .text_runner import FIRST_ID_CHAR, id_tokenizer, vocab_size_of

    entry = runtime_package(export.manifest, TEXT_RUNNER)
    if entry is None or "program" not in entry["settings"]:
        raise RunnerUnavailable((entry or {}).get("why") or "the folder holds no LLM-runner program")
    if not is_importable("executorch"):
        raise RunnerUnavailable("executorch is not installed: pip install 'hfexport[executorch]'", missing=True)
    program = export.components["decode"].artifact  # `PteBuffer`: the checked bytes, private copies
    folder = tempfile.TemporaryDirectory(prefix="hfexport-et-runner-")
    root = Path(folder.name)
    if program.program_copy is not None:
        os.link(program.program_copy, root / "decode.pte")
        os.link(program.data_path, root / program.data_path.name)
        data = str(root / program.data_path.name)
    else:
        (root / "decode.pte").write_bytes(program.buffer)
        data = None
    config = ListedFiles(export.directory, export.manifest, verify=export.verify).read("config.json")
    vocab = vocab_size_of(parse_json(config.data, config.path))
    (root / "tokenizer.json").write_text(json.dumps(id_tokenizer(vocab), ensure_ascii=False), encoding="utf-8")
    error = None
    with _quiet() as said:
        try:
            runner = runner_bindings().TextLLMRunner(str(root / "decode.pte"), str(root / "tokenizer.json"), data)
        except RuntimeError as failure:
            error = failure
    if error is not None:
        raise _failed(error, said, root / "decode.pte")
    name = f"executorch TextLLMRunner {installed_version('executorch')}"
    return TextLlmRunnerEngine(runner, folder, program, name, int(export.manifest["max_cache_len"]), FIRST_ID_CHAR)


class _StopAtFirst(Exception):
    """Raised out of the runner's callback at a stop token that is a call's first (module note)."""


class TextLlmRunnerEngine(LlmEngine):
    """One `TextLLMRunner`: a sequence at a time (a new one resets the runner)."""

    def __init__(self, runner: Any, folder: Any, program: Any, name: str, capacity: int, first: int):
        self.runner, self.name, self.capacity = runner, name, capacity
        self._folder, self._program = folder, program  # the private folder, and the copies it links to
        self._first = first
        self._current: TextLlmRunnerConversation | None = None

    def refusal(self, request: EngineRequest, ids: list[int]) -> str | None:
        if request.min_new_tokens and request.eos:
            return ("ExecuTorch's TextLLMRunner has no minimum of new tokens (min_new_tokens): hfexport's loop masks "
                    "the end tokens")
        return None

    def conversation(self, *, keep: bool) -> TextLlmRunnerConversation:
        return TextLlmRunnerConversation(self)

    def text(self, ids: list[int]) -> str:
        """The text the runner's one-character-per-token tokenizer reads back as `ids` (module note)."""
        return "".join(chr(self._first + token) for token in ids)

    def call(self, ids: list[int], max_new_tokens: int, on_piece: Callable[[str], Any]) -> None:
        """`runner.generate` on `ids` after what it holds, greedy, quiet (module note)."""
        llm = runner_bindings()
        config = llm.GenerationConfig(echo=False, max_new_tokens=max_new_tokens, temperature=0.0, num_bos=0,
                                      num_eos=0, warming=True)
        error = None
        with _quiet() as said:
            try:
                self.runner.generate(self.text(ids), config, token_callback=on_piece)
            except RuntimeError as failure:
                error = failure
        if error is not None:
            raise _failed(error, said, Path(self._folder.name) / "decode.pte")


class TextLlmRunnerConversation(EngineConversation):
    """A sequence in the runner, whose position it keeps between calls (module note)."""

    def __init__(self, engine: TextLlmRunnerEngine):
        self.engine = engine
        self.fed: list[int] = []
        self.first_token_at: float | None = None

    def continuation(self, ids: list[int], request: EngineRequest) -> int | str:
        if not self.fed:
            return 0
        if self.engine._current is not self:
            return "another sequence ran on the runner since (or the last turn failed)"
        if len(ids) <= len(self.fed) or ids[:len(self.fed)] != self.fed:
            return "TextLLMRunner cannot cut its cache back to the tokens the conversation shares (only reset it)"
        return len(self.fed)

    def generate(self, ids: list[int], keep: int, request: EngineRequest,
                 on_token: Callable[[int], Any] | None) -> list[int]:
        import time

        engine = self.engine
        if keep == 0:
            engine.runner.reset()
            engine._current, self.fed = self, []
        stop, tokens = frozenset(request.eos), []
        feed = ids[keep:]
        self.fed = ids[:keep]
        engine._current = None  # until the calls below end as planned
        self.first_token_at = None
        while True:
            start = len(tokens)

            def on_piece(piece: str) -> None:
                for char in piece:
                    token = ord(char) - engine._first
                    tokens.append(token)
                    if self.first_token_at is None:
                        self.first_token_at = time.perf_counter()
                    if on_token is not None:
                        on_token(token)
                    if token in stop:
                        if len(tokens) == start + 1:
                            raise _StopAtFirst()
                        engine.runner.stop()

            try:
                engine.call(feed, request.max_new_tokens - start, on_piece)
            except _StopAtFirst:
                pass
            self.fed += feed + tokens[start:-1]
            if not tokens or tokens[-1] in stop or len(tokens) >= request.max_new_tokens:
                break
            feed = tokens[-1:]  # it stopped at a program end token the request does not stop at
        engine._current = self
        return tokens


@contextlib.contextmanager
def _quiet() -> Iterator[list[str]]:
    """What this process's C code writes to stdout and stderr (the runner's printing and log
    lines) sent to a scratch file while the runner runs, Python's `sys.stdout` and `sys.stderr`
    still writing where they did (a chat's streamed answer); what the C code wrote is in the
    yielded list afterwards."""
    said: list[str] = []
    libc = ctypes.CDLL(None)
    swapped: dict[str, Any] = {}
    with tempfile.TemporaryFile() as scratch:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        libc.fflush(None)
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        for name, fd in (("stdout", 1), ("stderr", 2)):
            stream = getattr(sys, name)
            if _fileno(stream) == fd:  # Python's own stream on the descriptor: keep it writing there
                swapped[name] = stream
                setattr(sys, name, open(saved[fd], "w", buffering=1, encoding=stream.encoding, errors=stream.errors,
                                        closefd=False))
            os.dup2(scratch.fileno(), fd)
        try:
            yield said
        finally:
            libc.fflush(None)
            for name, stream in swapped.items():
                getattr(sys, name).flush()
                setattr(sys, name, stream)
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            scratch.seek(0)
            said.append(scratch.read().decode("utf-8", "replace"))


def _fileno(stream: Any) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _failed(error: Exception, said: list[str], program: Path) -> Exception:
    from ...errors import RuntimeLoadError

    log = "".join(said).strip()[-1500:]
    return RuntimeLoadError(f"ExecuTorch's TextLLMRunner failed on the program {program.name}: {error}"
                            + (f" ({log})" if log else ""),
                            remedy="run it with --engine hfexport to see whether hfexport's loop runs the program")
