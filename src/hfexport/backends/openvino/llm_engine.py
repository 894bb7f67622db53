"""OpenVINO GenAI's `LLMPipeline` driving `hfexport generate` and `chat` on an `LLMPipeline` folder
(`folder/engine.py`).

# NOTE: what the pipeline is given. Its model is the `decode` component that the folder's load
# read from the checked bytes (`artifact.read_openvino`), serialized into a private folder that
# `LLMPipeline(folder, tokenizer, device, **properties)` reads: the folder's `openvino_model.xml/
# .bin` are not read a second time (a file swapped after the load's check is never run, nor
# refused half-way), and `LLMPipeline(model_xml, weights, ...)` from memory would want the bytes
# the load let go of. The tokenizer's four files, which nothing else reads, are read once here and
# given from memory (`Tokenizer(xml, weights, ...)`). Its properties are the precisions the export recorded (the
# manifest's `runtime_package.settings.properties`), `$HFEXPORT_OV_COMPILE_CONFIG` (as the runner's own
# compiles), and `ATTENTION_BACKEND="SDPA"`: the stateful model as the folder writes it, whose
# chat keeps its state between turns and cuts it back to the tokens it shares with the next turn
# (`pipeline_stateful.cpp`); the default PagedAttention backend rewrites the model into another.
# Token ids go in (`TokenizedInputs`) and come out through a `StreamerBase`, so the tokenizer is
# only what the constructor asks for.
#
# A chat is the pipeline's chat mode on token ids: each turn hands it the tokens after the whole
# conversation it holds (what it fed and the last answer's last token); a turn whose tokens do
# not start with that conversation (an answer whose text re-encodes to other tokens) starts a new
# chat, prefilling the conversation again.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...folder.engine import EngineConversation, EngineRequest, LlmEngine
from ...folder.manifest import ListedFiles

__all__ = ["LlmPipelineEngine", "open_llm_pipeline_engine"]


def open_llm_pipeline_engine(export: Any) -> LlmPipelineEngine:
    """`LLMPipeline` on the checked bytes of `export`'s (a `GenerationExport`) model and tokenizer.

    Raises:
        RunnerUnavailable: the folder is not an `LLMPipeline` folder (why, from its manifest), or
            openvino-genai is not installed.
    """
    from ...folder.package import RunnerUnavailable
    from ...folder.manifest import runtime_package
    from .genai import GENAI_MODEL, RUNNER
    from .runner import compile_properties

    entry = runtime_package(export.manifest, RUNNER)
    other = runtime_package(export.manifest)
    if entry is None and other is not None and other["runner"] != RUNNER:  # a VLMPipeline or WhisperPipeline folder
        raise RunnerUnavailable(f"the folder is {other['runner']}'s package (and the components), which hfexport's "
                                "loop runs: hfexport drives LLMPipeline alone as an engine")
    if entry is None or not entry["ready"]:
        raise RunnerUnavailable("the folder is the components: " + (
            (entry or {}).get("why") or "not one stateful model in LLMPipeline's layout (a multimodal model)"))
    try:
        import numpy as np
        import openvino as ov
        import openvino_genai
    except ImportError as error:
        raise RunnerUnavailable(f"openvino-genai is not installed ({error}): pip install 'hfexport[openvino-genai]'",
                                missing=True) from error
    listed = ListedFiles(export.directory, export.manifest, verify=export.verify)

    def model(xml: str) -> tuple[str, Any]:  # the IR's text and its weights, from the checked bytes
        weights = listed.read(xml.removesuffix(".xml") + ".bin").data
        return listed.read(xml).data.decode("utf-8"), ov.Tensor(np.frombuffer(weights, np.uint8), shared_memory=False)

    tokenizer = openvino_genai.Tokenizer(*model("openvino_tokenizer.xml"), *model("openvino_detokenizer.xml"))
    properties = {**entry["settings"].get("properties", {}), "ATTENTION_BACKEND": "SDPA", **compile_properties()}
    decode = export.components["decode"]
    with tempfile.TemporaryDirectory(prefix="hfexport-llm-pipeline-") as private:
        stem = Path(private) / GENAI_MODEL
        ov.serialize(decode.artifact, f"{stem}.xml", f"{stem}.bin")
        pipe = openvino_genai.LLMPipeline(private, tokenizer, "CPU", **properties)
    bound = (decode.record.details.get("state") or {}).get("max_cache_len")
    return LlmPipelineEngine(openvino_genai, pipe, bound)


class LlmPipelineEngine(LlmEngine):
    """One `LLMPipeline`: a sequence at a time (a new conversation ends the last one's chat)."""

    def __init__(self, genai: Any, pipe: Any, capacity: int | None):
        self.genai, self.pipe = genai, pipe
        self.name = f"openvino-genai {genai.__version__}"
        self.capacity = capacity
        self._current: LlmPipelineConversation | None = None

    def refusal(self, request: EngineRequest, ids: list[int]) -> str | None:
        return None

    def conversation(self, *, keep: bool) -> LlmPipelineConversation:
        return LlmPipelineConversation(self, keep)

    def config(self, request: EngineRequest) -> Any:
        """The pipeline's greedy `GenerationConfig` for `request`: its stop tokens exactly (the
        tokenizer's end token not added), `min_new_tokens` masking them."""
        config = self.genai.GenerationConfig()
        config.max_new_tokens, config.min_new_tokens = request.max_new_tokens, request.min_new_tokens
        config.do_sample = False
        if request.eos:
            config.eos_token_id = request.eos[0]  # set: the pipeline would add its tokenizer's end token otherwise
            config.stop_token_ids = set(request.eos)
        else:
            config.ignore_eos = True
        return config


class LlmPipelineConversation(EngineConversation):
    """A sequence in the pipeline: generated once, or the pipeline's chat on token ids (module note)."""

    def __init__(self, engine: LlmPipelineEngine, keep: bool):
        self.engine, self.keep = engine, keep
        self.fed: list[int] = []
        self.first_token_at: float | None = None
        self._held: list[int] | None = None  # the chat's conversation: what it fed and the last token

    def continuation(self, ids: list[int], request: EngineRequest) -> int | str:
        held = self._held
        if held is None:
            return 0
        if self.engine._current is not self:
            return "another sequence ran on the pipeline since (or the last turn failed)"
        if len(ids) <= len(held) or ids[:len(held)] != held:
            return ("LLMPipeline's chat on token ids goes on only after the whole conversation it holds (the last "
                    "answer's tokens re-encode to others)")
        return len(self.fed)

    def generate(self, ids: list[int], keep: int, request: EngineRequest,
                 on_token: Callable[[int], Any] | None) -> list[int]:
        import time

        import numpy as np
        import openvino as ov

        engine, genai = self.engine, self.engine.genai
        pipe = engine.pipe
        if keep == 0:
            pipe.finish_chat()  # the pipeline's state belongs to this sequence now
            if self.keep:
                pipe.start_chat()
            engine._current, self._held = self, [] if self.keep else None
        new = ids[len(self._held):] if keep else ids
        stream = None
        if on_token is not None:  # a streamer costs the pipeline a call into Python per token: only where asked

            class Stream(genai.StreamerBase):
                def write(self, token):
                    for value in [token] if isinstance(token, int) else token:
                        on_token(int(value))
                    return genai.StreamingStatus.RUNNING

                def end(self):
                    pass

            stream = Stream()
        array = np.array([new], dtype=np.int64)
        self.fed = ids[:keep]
        begun = time.perf_counter()
        try:
            out = pipe.generate(genai.TokenizedInputs(ov.Tensor(array), ov.Tensor(np.ones_like(array))),
                                engine.config(request), stream)
        except BaseException:
            engine._current, self._held = None, None  # the pipeline's chat is in an unknown state
            raise
        self.first_token_at = begun + out.perf_metrics.get_ttft().mean / 1000  # the pipeline's own clock, in ms
        tokens = [int(t) for t in out.tokens[0]]
        self.fed = ids + tokens[:-1]
        if self.keep:
            self._held = ids + tokens
        return tokens
