"""A speech encoder-decoder's generation export as OpenVINO GenAI's `WhisperPipeline` takes it.

```
out/tiny-whisper/                           hfexport export tiny:whisper -f openvino (or --generate)
  openvino_encoder_model.xml/.bin           input_features -> last_hidden_state (the `encoder` component)
  openvino_decoder_model.xml/.bin           stateful: input_ids, encoder_hidden_states, beam_idx -> logits
  openvino_tokenizer.xml/.bin, openvino_detokenizer.xml/.bin
  preprocessor_config.json                  the feature extractor's settings (WhisperPipeline's own log-mel)
  config.json, generation_config.json, prefill.xml, decode.xml, ... (`hfexport generate`)
```
`openvino_genai.WhisperPipeline(out, "CPU", INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32")`.

# NOTE: what WhisperPipeline reads, from openvino.genai's source (src/cpp/src/whisper/: pipeline.cpp,
# pipeline_base.hpp, whisper.cpp, models/statefull_decoder.cpp, feature_extractor.cpp, config.cpp,
# generation_config.cpp; tokenizer/tokenizer_impl.cpp; read at master da1db864, whose whisper/ differs
# from the 2026.3 branch only in timestamps and word timings; run on 2026.4.1). On CPU it compiles
# `openvino_encoder_model.xml`, feeds `input_features` `[1, feature_size, nb_max_frames]` by name and
# reads `last_hidden_state`; it compiles `openvino_decoder_model.xml` (only the stateful layout: no
# `with_past` model is read any more), feeds `input_ids` `[batch, tokens]`, `encoder_hidden_states`
# (the same tensor on every step), `beam_idx`, and `cache_position` where the model has that input
# (ours does not: its positions are the state's length), reads `logits` `[batch, tokens, vocab]` at the
# last position, and resets the state after each 30 s chunk. It computes the log-mel features itself
# from raw 16 kHz samples, with the `feature_size`, `sampling_rate`, `hop_length`, `n_fft`,
# `chunk_length`, `n_samples` and `nb_max_frames` of `preprocessor_config.json` (Whisper's own
# extractor: reflect-padded STFT of a Hann window, a Slaney mel bank to 8 kHz, log10, clamped to the
# maximum - 8, (x + 4) / 4, the clip padded to `n_samples`), which are transformers'
# `WhisperFeatureExtractor`'s to float rounding. `config.json` gives `max_source_positions`;
# `generation_config.json` the token ids (`decoder_start_token_id`, `no_timestamps_token_id`,
# `task_to_id`, `lang_to_id`, `suppress_tokens`, `begin_suppress_tokens`, `eos_token_id`,
# `is_multilingual`), but never `language`, `task` nor `forced_decoder_ids`: its decoder prompt is
# the start token, then on a multilingual model the detected language and `<|transcribe|>`, then
# `<|notimestamps|>`. Where `generate()` would build another prompt from the same file, the folder
# gets no WhisperPipeline models (`whisper_refusal`). The tokenizer (`ov::genai::Tokenizer`) reads
# the two converted models and `tokenizer_config.json`, `special_tokens_map.json`,
# `processor_config.json`, `chat_template.json`, `config.json`, `generation_config.json` beside them
# (`WHISPER_READS`: every one there must be listed, `check_whisper_listed`).
#
# NOTE: the decoder recomputes the cross-attention keys and values from `encoder_hidden_states` on
# every call rather than keeping them as state: WhisperPipeline feeds that tensor on each step, and a
# graph that computed them only on an empty state would need a conditional. It costs two matmuls
# per layer over the encoder's positions per token. The models are added to the components
# `hfexport generate` runs (`encoder`, `prefill`, `decode`), as `vlm.py` adds VLMPipeline's: the
# encoder is shared (written once, under the name WhisperPipeline opens), the decoder's weights are
# written a third time.
"""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["RUNNER", "WHISPER_STEMS", "WHISPER_READS", "WhisperPipelineDecoder", "whisper_components",
           "whisper_refusal", "whisper_folder_files", "check_whisper_listed", "run_whisper_pipeline"]

logger = logging.getLogger("hfexport")

#: the runner of the manifest's `runtime_package` entry of a speech folder (`manifest.RUNNERS`)
RUNNER = "WhisperPipeline"
#: component -> the file stem `WhisperPipeline` opens
WHISPER_STEMS = {"encoder": "openvino_encoder_model", "whisper_decoder": "openvino_decoder_model"}
_TOKENIZER, _DETOKENIZER = "openvino_tokenizer", "openvino_detokenizer"
_PREPROCESSOR = "preprocessor_config.json"
#: what hfexport writes for `WhisperPipeline` (the manifest entry's `files`, never more)
WHISPER_FILES = frozenset({f"{stem}{suffix}" for stem in (*WHISPER_STEMS.values(), _TOKENIZER, _DETOKENIZER)
                           for suffix in (".xml", ".bin")} | {_PREPROCESSOR})
#: every file `WhisperPipeline` 2026.4.1 opens by name in its folder (see the module note)
WHISPER_READS = WHISPER_FILES | {"config.json", "generation_config.json", "tokenizer_config.json",
                                 "special_tokens_map.json", "processor_config.json", "chat_template.json"}
#: the OpenVINO GenAI whose WhisperPipeline this layout was read from and checked with
_GENAI_SEEN = "2026.4.1"
#: WhisperPipeline's defaults for the ids `generation_config.json` may leave out (whisper_generation_config.hpp)
_GENAI_DEFAULTS = {"decoder_start_token_id": 50258, "no_timestamps_token_id": 50363, "transcribe": 50359,
                   "translate": 50358}


class WhisperPipelineDecoder(torch.nn.Module):
    """Whisper's decoder and head as `WhisperPipeline` runs them: `input_ids` after the self-attention
    cache `past_key_values`, cross-attending `encoder_hidden_states` (its keys and values computed on
    each call, see the module note) -> `{"logits", "cache"}` (the self-attention cache, made state)."""

    def __init__(self, model: Any):
        super().__init__()
        self.decoder, self.proj_out = model.get_decoder(), model.get_output_embeddings()
        self.cache_config = _decoder_cache_config(model.config)

    def forward(self, input_ids, encoder_hidden_states, past_key_values):
        """The logits of every new token and the self-attention cache with them."""
        from transformers import DynamicCache, EncoderDecoderCache

        cache = EncoderDecoderCache(past_key_values, DynamicCache(config=self.cache_config))  # cross: empty, computed
        out = self.decoder(input_ids=input_ids, encoder_hidden_states=encoder_hidden_states, cache=cache,
                           use_cache=True)
        return {"logits": self.proj_out(out.last_hidden_state), "cache": cache.self_attention_cache}


def _decoder_cache_config(config: Any) -> Any:
    """`config` with the decoder's layer count as `num_hidden_layers` (what `DynamicCache(config=...)`
    allocates; Whisper's config maps it to the encoder's, as transformers 5.24's WhisperDecoder notes)."""
    config = copy.deepcopy(config)
    config.num_hidden_layers = config.decoder_layers
    return config


def whisper_components(model: Any, components: dict[str, Any]) -> dict[str, Any]:
    """The decoder `WhisperPipeline` needs besides `components` (a speech encoder-decoder's, from
    `decompose_for_generation`): `whisper_decoder` on 3 new tokens after the decoder prompt's cache
    (so the token and cache axes both stay symbolic), cross-attending the encoder's output on the
    sample's features."""
    from transformers import DynamicCache

    decoder = WhisperPipelineDecoder(model)
    prompt = components["prefill"][1]["decoder_input_ids"]
    cache = DynamicCache(config=decoder.cache_config)
    with torch.no_grad():
        hidden = model.get_encoder()(**components["encoder"][1]).last_hidden_state
        decoder(prompt, hidden, cache)
    vocab = model.config.vocab_size
    new = (torch.arange(3) * 7 + 3).remainder(vocab)[None].expand(prompt.shape[0], -1)
    return {"whisper_decoder": (decoder, {"input_ids": new, "encoder_hidden_states": hidden, "past_key_values": cache})}


def whisper_refusal(model_config: Any, generation_config: Any, config: Any,
                    feature_extractor: Any = None) -> str | None:
    """Why a speech model's generation folder (its `model_config`, the generation config it is saved
    with, the export's `config`, the feature extractor it carries, if known) gets no `WhisperPipeline`
    models, or None."""
    model_type = getattr(model_config, "model_type", None)
    if model_type != "whisper":
        return (f"WhisperPipeline runs Whisper models only; model_type {model_type!r} keeps the components, "
                "which `hfexport generate` runs")
    if not getattr(config, "stateful", False):
        return "OpenVINOConfig(stateful=False): WhisperPipeline's decoder keeps its cache as state"
    if not getattr(config, "dynamic", False) and getattr(config, "dynamic_shapes", None) is None:
        return ("a static export: WhisperPipeline feeds its decoder prompts and steps of other lengths; export with "
                "dynamic=True")
    if generation_config is not None and getattr(generation_config, "return_timestamps", False):
        return ("the generation config asks for timestamps (return_timestamps), which WhisperPipeline writes only "
                "when asked per call, and hfexport's runner does not write")
    why = _prompt_refusal(model_config, generation_config)
    if why is None and feature_extractor is not None:
        why = _feature_extractor_refusal(model_config, feature_extractor)
    return why


def _prompt_refusal(model_config: Any, generation_config: Any) -> str | None:
    """Why `WhisperPipeline` would start the decoder from another prompt than `generate()` does on the
    same generation config (see the module note), or None."""
    from ...errors import PrepareError
    from ...generation.decoder_prompt import DETECT_LANGUAGE, decoder_prompt

    if generation_config is None:
        return "no generation config: WhisperPipeline builds the decoder prompt from generation_config.json"
    try:
        eager = decoder_prompt(generation_config, model_config)
    except PrepareError as error:
        return f"the decoder prompt cannot be built from the generation config: {error}"

    def given(name: str) -> Any:
        value = getattr(generation_config, name, None)
        return _GENAI_DEFAULTS.get(name) if value is None else value

    pipeline = [given("decoder_start_token_id")]
    if getattr(generation_config, "is_multilingual", False):
        task_ids = getattr(generation_config, "task_to_id", None) or {}
        pipeline += [DETECT_LANGUAGE, task_ids.get("transcribe", _GENAI_DEFAULTS["transcribe"])]
    pipeline.append(given("no_timestamps_token_id"))
    if [int(t) for t in pipeline] != [int(t) for t in eager]:
        return (f"WhisperPipeline {_GENAI_SEEN} starts the decoder with {_shown(pipeline)} from generation_config.json "
                f"(it reads no language, task nor forced_decoder_ids from it), where generate() starts with "
                f"{_shown(eager)}: pass the language and task to WhisperPipeline.generate yourself, or run the folder "
                "with `hfexport generate`")
    return None


def _shown(prompt: list[int]) -> str:
    """A decoder prompt as a refusal shows it, the language to detect named."""
    from ...generation.decoder_prompt import DETECT_LANGUAGE

    return "[" + ", ".join("<detected language>" if t == DETECT_LANGUAGE else str(t) for t in prompt) + "]"


def _feature_extractor_refusal(model_config: Any, extractor: Any) -> str | None:
    """Why `WhisperPipeline`'s own log-mel features would not be `extractor`'s, or None."""
    name = type(extractor).__name__
    if name != "WhisperFeatureExtractor":
        return f"the feature extractor is a {name}; WhisperPipeline computes Whisper's log-mel features itself"
    if getattr(extractor, "dither", 0.0):
        return (f"the feature extractor dithers (dither={extractor.dither}); WhisperPipeline's features add no noise")
    frames = 2 * int(model_config.max_source_positions)
    if int(extractor.nb_max_frames) != frames or int(extractor.n_samples) != int(extractor.chunk_length) * int(
            extractor.sampling_rate):
        return (f"the feature extractor makes {extractor.nb_max_frames} frames of {extractor.n_samples} samples "
                f"where the encoder takes {frames} frames of chunk_length x sampling_rate samples")
    if int(extractor.sampling_rate) < 16000:
        return (f"a sampling rate of {extractor.sampling_rate} Hz: WhisperPipeline's mel bank reaches 8 kHz, "
                "past this rate's Nyquist frequency")
    return None


def whisper_folder_files(artifacts: dict[str, Any], directory: Path, context: Any,
                         refusal: str | None) -> dict[str, Any]:
    """For a speech generation export, write what `WhisperPipeline` reads besides the models (the
    converted tokenizer, the feature extractor's `preprocessor_config.json`) into `directory` (the
    staged folder) and return the manifest's `runtime_package` entry: the files it reads, or why it
    cannot open the folder."""
    from ...capture.record import record_of
    from ...folder.manifest import runtime_package_entry
    from .genai import convert_tokenizer_for_genai

    if refusal is not None or "whisper_decoder" not in artifacts:
        why = refusal or "the export has no whisper_decoder model"
        logger.warning("the export folder is not a WhisperPipeline folder: %s", why)
        return runtime_package_entry(RUNNER, why=why)
    properties = record_of(artifacts["whisper_decoder"]).details.get("compile_properties") or {}
    settings = {"models": {name: f"{stem}.xml" for name, stem in WHISPER_STEMS.items()},
                "properties": dict(properties)}
    extractor = getattr(context.processor, "feature_extractor", None)
    why = None
    if context.tokenizer is None:
        why = "no tokenizer was given: WhisperPipeline needs openvino_tokenizer.xml and openvino_detokenizer.xml"
    elif extractor is None:
        why = ("no feature extractor was given: WhisperPipeline computes the features by preprocessor_config.json; "
               "export from a folder where the processor was saved (processor.save_pretrained)")
    else:
        try:
            files = convert_tokenizer_for_genai(context.tokenizer, directory)
        except Exception as error:  # noqa: BLE001 - the export stands; the manifest and a warning say why
            why = f"openvino-tokenizers could not convert the tokenizer: {type(error).__name__}: {error}"
    if why is not None:
        logger.warning("the export folder is not a WhisperPipeline folder: %s", why)
        return runtime_package_entry(RUNNER, why=why, settings=settings)
    extractor.to_json_file(directory / _PREPROCESSOR)
    models = [f for name in WHISPER_STEMS for f in context.component_files.get(name, [])]
    return runtime_package_entry(RUNNER, files=[*models, *(f.name for f in files), _PREPROCESSOR], settings=settings)


def check_whisper_listed(manifest: dict[str, Any], listed: Any) -> None:
    """Refuse (`ExportFolderError`) a `WhisperPipeline` folder that names a file hfexport does not
    write for it, where a file `WhisperPipeline` opens by name lies in the folder unlisted (it would
    read it unchecked: `WHISPER_READS`), or whose converted tokenizer and detokenizer are not what
    their names say (each one's input read from its IR)."""
    from ...errors import ExportFolderError

    remedy = "copy the export folder again, whole, from where it was written, or export again"
    entry = manifest["runtime_package"]
    strange = sorted(set(entry["files"]) - WHISPER_FILES)
    models = entry["settings"].get("models", {})
    if strange or (entry["ready"] and models != {n: f"{s}.xml" for n, s in WHISPER_STEMS.items()}):
        raise ExportFolderError(f"{listed.folder / 'manifest.json'} names {strange or models} for WhisperPipeline; "
                                f"hfexport writes only {', '.join(sorted(WHISPER_FILES))} for it", remedy=remedy)
    for name in sorted(WHISPER_READS):
        if name not in manifest["files"] and os.path.lexists(listed.folder / name):  # a link too, even dangling
            raise ExportFolderError(f"{listed.folder / name} is not a file manifest.json lists, and WhisperPipeline "
                                    "opens it by that name: it is not a file this export wrote", remedy=remedy)
    # text in (a string tensor, or packed as u8 by older converters), token ids out; and back
    for stem, takes in ((_TOKENIZER, ("string", "u8")), (_DETOKENIZER, ("i64", "i32"))):
        xml = f"{stem}.xml"
        found = _parameter_types(listed.read(xml).data) if xml in manifest["files"] else None
        if found is not None and found[:1] not in [[t] for t in takes]:
            raise ExportFolderError(f"{listed.folder / xml} takes {found} where openvino-tokenizers' "
                                    f"{stem.removeprefix('openvino_')} takes {' or '.join(takes)}: it is not the file "
                                    "this export wrote", remedy=remedy)


def _parameter_types(ir: bytes) -> list[str]:
    """The element types of an OpenVINO IR's `Parameter` layers, read from its XML (no plugin, no
    extension loaded)."""
    import xml.etree.ElementTree as ElementTree

    try:
        root = ElementTree.fromstring(ir)
    except ElementTree.ParseError:
        return ["<not an OpenVINO IR>"]
    return [str(layer.find("data").get("element_type")) for layer in root.iter("layer")
            if layer.get("type") == "Parameter" and layer.find("data") is not None]


def run_whisper_pipeline(folder: Path, request: Any) -> Any:
    """Greedy tokens of OpenVINO GenAI's `WhisperPipeline` on the export `folder`, on CPU with the
    precisions the manifest records, for `request` (`RunnerRequest` holding `audio`: raw samples at
    the feature extractor's rate, which WhisperPipeline turns into features itself); the tokens are
    those its streamer is handed.

    Raises:
        RunnerUnavailable: the folder is not a `WhisperPipeline` folder, the request holds no audio,
            or openvino-genai is not installed.
    """
    from ...folder.manifest import read_manifest, runtime_package
    from ...folder.package import RunnerTokens, RunnerUnavailable

    entry = runtime_package(read_manifest(folder, verify=False), RUNNER)  # the folder this export just wrote
    if entry is None or not entry["ready"]:
        raise RunnerUnavailable("this model's folder is the components: " + (
            (entry or {}).get("why") or "not a speech model's WhisperPipeline folder"))
    if request.audio is None:
        raise RunnerUnavailable("WhisperPipeline transcribes audio, and the request holds a text prompt")
    try:
        import numpy as np
        import openvino_genai
    except ImportError as error:
        raise RunnerUnavailable(f"openvino-genai is not installed ({error}): pip install 'hfexport[openvino-genai]'",
                                missing=True) from error

    class Collected(openvino_genai.StreamerBase):
        """The token ids WhisperPipeline generates, as it streams them."""

        def __init__(self):
            super().__init__()
            self.tokens: list[int] = []

        def write(self, token):
            self.tokens += [token] if isinstance(token, int) else list(token)
            return openvino_genai.StreamingStatus.RUNNING

        def end(self):
            """Nothing to flush."""

    pipe = openvino_genai.WhisperPipeline(str(folder), "CPU", **entry["settings"].get("properties", {}))
    config = pipe.get_generation_config()
    config.max_new_tokens, config.do_sample = request.max_new_tokens, False
    if request.eos_token_ids:
        config.stop_token_ids = set(request.eos_token_ids)
    collected = Collected()
    pipe.generate(np.asarray(request.audio, dtype=np.float32), config, collected)
    return RunnerTokens(tuple(collected.tokens), f"openvino-genai {openvino_genai.__version__} WhisperPipeline")
