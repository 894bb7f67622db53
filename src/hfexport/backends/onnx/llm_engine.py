"""onnxruntime-genai's `og.Generator` driving `hfexport generate` and `chat` on an onnxruntime-genai
folder (`folder/engine.py`).

# NOTE: what the engine is given. `og.Config` reads `genai_config.json` from a folder, and the
# decoder by the name it gives, so the engine gets a private folder of its own: the
# `genai_config.json` written from the checked bytes (checked again by `check_genai_config`, and
# its decoder the `decode` component's file), and links to the private copies of `decode.onnx`
# and its external data that the component's load wrote from the checked bytes
# (`loaded.OnnxModelFiles`), so the weights are not copied again. `og.Config.add_model_data`
# (0.18) would hand the decoder from memory, but ONNX Runtime copies weights given from memory
# beside the bytes held (docs/trust.md), and the config still comes from a folder.
#
# The stop tokens are checked here, between two `generate_next_token` calls (a set lookup), on the
# one `og.Model` opened with `model.eos_token_id` set to none through `og.Config.overlay`: 0.18
# takes no end token in its search options, and one model per set of stop tokens (a chat's differ
# from a generation config's) would hold the weights once per set. Its `min_length` masks only the
# config's end tokens, so a minimum of new tokens before a stop token runs hfexport's loop (a model
# opened with the request's stop tokens gave `generate()`'s tokens, but at that price). The
# decoder's thread count is
# onnxruntime-genai's own unless `$HFEXPORT_ORT_SESSION_CONFIG` sets `intra_op_num_threads` or
# `inter_op_num_threads` (what the runner's own sessions take).
#
# A prompt ending with the config's `pad_token_id` runs hfexport's loop: og builds the attention
# mask and positions from the tokens, taking a sequence's trailing pad tokens for right padding
# (masked, position 0; `position_inputs.cpp`, read at 0.18), where `generate()` attends to them.
# The pad is the end token where the model names no pad (`genai._token`), so a prompt ending with
# the end token meets it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...folder.engine import EngineConversation, EngineRequest, LlmEngine
from ...folder.manifest import ListedFiles, parse_json

__all__ = ["GenaiEngine", "open_genai_engine"]

#: the session options of `$HFEXPORT_ORT_SESSION_CONFIG` onnxruntime-genai's config takes too
_THREAD_OPTIONS = ("intra_op_num_threads", "inter_op_num_threads")


def open_genai_engine(export: Any) -> GenaiEngine:
    """onnxruntime-genai on the `export`'s (a `GenerationExport`) private copy.

    Raises:
        RunnerUnavailable: the folder has no `genai_config.json` (why, from its manifest), is
            og's Whisper package, or onnxruntime-genai is not installed.
    """
    from ...folder.package import RunnerUnavailable
    from ...folder.manifest import runtime_package
    from .genai import GENAI_CONFIG, RUNNER, check_genai_config

    entry = runtime_package(export.manifest, RUNNER)
    if entry is None or not entry["ready"] or GENAI_CONFIG not in entry["files"]:
        raise RunnerUnavailable(f"the folder is the components: {(entry or {}).get('why') or 'no genai_config.json'}")
    if entry["settings"].get("model_type") == "whisper":
        raise RunnerUnavailable("the folder is onnxruntime-genai's Whisper package, which og.Generator runs from a "
                                "clip (docs/deploy/onnxruntime-genai.md); hfexport drives og's decoder-only Generator "
                                "only")
    try:
        import onnxruntime_genai as og
    except ImportError as error:
        raise RunnerUnavailable(f"onnxruntime-genai is not installed ({error}): pip install 'hfexport[genai]'",
                                missing=True) from error
    config_file = ListedFiles(export.directory, export.manifest, verify=export.verify).read(GENAI_CONFIG)
    content = parse_json(config_file.data, config_file.path)
    check_genai_config(content, set(export.manifest["files"]), config_file.path)
    decode = export.components["decode"]
    if content["model"]["decoder"]["filename"] != decode.artifact.path.name:
        raise RunnerUnavailable(f"{config_file.path} names the decoder {content['model']['decoder']['filename']!r}, "
                                f"not the decode component's {decode.artifact.path.name}")
    folder = tempfile.TemporaryDirectory(prefix="hfexport-genai-")
    for copy in decode.artifact.path.parent.iterdir():  # the model and its external data, checked as copied
        _link(copy, Path(folder.name) / copy.name)
    (Path(folder.name) / GENAI_CONFIG).write_bytes(config_file.data)
    return GenaiEngine(og, folder, decode.artifact, int(content["model"]["context_length"]),
                       int(content["model"]["pad_token_id"]))


class GenaiEngine(LlmEngine):
    """One `og.Model` on a private folder, stopping at no token of its own (see the module note)."""

    def __init__(self, og: Any, folder: tempfile.TemporaryDirectory, source: Any, context_length: int,
                 pad_token_id: int):
        from .session_options import session_config

        self.og = og
        self.name = f"onnxruntime-genai {og.__version__}"
        self.capacity = context_length
        self.pad_token_id = pad_token_id
        self._folder = folder  # removed with the engine
        self._source = source  # the component's private copies the folder links to, kept alive
        config = og.Config(folder.name)
        options = {k: v for k, v in session_config().items() if k in _THREAD_OPTIONS}
        config.overlay(json.dumps({"model": {"eos_token_id": [],
                                             **({"decoder": {"session_options": options}} if options else {})}}))
        self.model = og.Model(config)

    def refusal(self, request: EngineRequest, ids: list[int]) -> str | None:
        if request.min_new_tokens and request.eos:
            return ("onnxruntime-genai masks only its model's end tokens before min_length: a minimum of new tokens "
                    "(min_new_tokens) runs hfexport's loop")
        if ids and ids[-1] == self.pad_token_id:
            return (f"the prompt ends with the pad token ({self.pad_token_id}, the end token where the model has no "
                    "pad), which onnxruntime-genai takes for right padding and masks: hfexport's loop runs it")
        return None

    def conversation(self, *, keep: bool) -> GenaiConversation:
        return GenaiConversation(self, keep)


class GenaiConversation(EngineConversation):
    """One `og.Generator`: a chat's next turn cuts its sequence back (`rewind_to`) to the tokens
    it shares with the turn's, and appends the rest."""

    def __init__(self, engine: GenaiEngine, keep: bool):
        self.engine, self.keep = engine, keep
        self.fed: list[int] = []
        self.first_token_at: float | None = None
        self._generator = None

    def continuation(self, ids: list[int], request: EngineRequest) -> int | str:
        if self._generator is None:
            return 0
        shared = 0
        for held, new in zip(self.fed, ids):
            if held != new:
                break
            shared += 1
        return min(shared, len(ids) - 1) or "the conversation shares no tokens with the last one"

    def generate(self, ids: list[int], keep: int, request: EngineRequest,
                 on_token: Callable[[int], Any] | None) -> list[int]:
        import time

        import numpy as np

        og = self.engine.og
        if self._generator is None:
            params = og.GeneratorParams(self.engine.model)
            length = self.engine.capacity if self.keep else len(ids) + request.max_new_tokens
            params.set_search_options(max_length=length, do_sample=False)
            self._generator = og.Generator(self.engine.model, params)
        elif keep < self._generator.token_count():
            self._generator.rewind_to(keep)
        generator, eos = self._generator, frozenset(request.eos)
        self.fed = ids[:keep]
        generator.append_tokens(np.array([ids[keep:]], dtype=np.int32))
        tokens: list[int] = []
        self.first_token_at = None
        try:
            while len(tokens) < request.max_new_tokens and not generator.is_done():
                generator.generate_next_token()
                token = int(generator.get_next_tokens()[0])
                tokens.append(token)
                if self.first_token_at is None:
                    self.first_token_at = time.perf_counter()
                if on_token is not None:
                    on_token(token)
                if token in eos:
                    break
        finally:
            self.fed = ids + tokens[:-1]
        return tokens


def _link(source: Path, target: Path) -> None:
    """`target` as a hard link to the private copy `source` (a copy where the filesystem has no links)."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
