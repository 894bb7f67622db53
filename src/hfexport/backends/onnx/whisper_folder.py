"""What onnxruntime-genai's Whisper reads beside its two graphs (`whisper.py`): `genai_config.json`
(model type `whisper`, the graphs' names as its `%d` templates) and `audio_processor_config.json`
(its feature extractor, from the model's `WhisperFeatureExtractor`); the check of both when a folder
is opened, and og's `Generator` on the folder as the export job's runner check.

```
genai_config.json           {"model": {"type": "whisper", "encoder": {"filename": "og_encoder.onnx", ...},
                                       "decoder": {"filename": "og_decoder.onnx", ...}, ...}, "search": {...}}
audio_processor_config.json {"feature_extraction": {"sequence": [AudioDecoder, STFTNorm, LogMelSpectrum]}}
```

# NOTE: the layout is the one onnxruntime-genai 0.18.0's builder writes for Whisper
# (`onnxruntime_genai/models/builders/whisper.py`, `make_genai_config`: read, not imported or
# copied), with hfexport's graph names and the feature extractor's own settings. og reads the
# config's `encoder.inputs.audio_features`, `encoder.outputs.{encoder_hidden_states,
# cross_present_key_names, cross_present_value_names}`, `decoder.inputs.{input_ids, past_key_names,
# past_value_names, cross_past_key_names, cross_past_value_names}` and `decoder.outputs.{logits,
# present_key_names, present_value_names}` (src/config.cpp); the speech config's file name is its
# default, `audio_processor_config.json` (config.h `Speech::config_filename`), which this writer
# never changes. The processor's STFT takes a periodic Hann window of `n_fft` by default (stft_norm.hpp
# `hann_window`), transformers' `window_function(n_fft, "hann")`, so no window is written.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

from .whisper import OG_GRAPHS, OG_SAMPLING_RATE, og_extractor_refusal, og_whisper_refusal

__all__ = ["AUDIO_CONFIG", "OG_READS", "og_whisper_config", "audio_processor_config", "og_whisper_folder_files",
           "check_audio_processor_config", "check_og_files", "run_og_whisper"]

AUDIO_CONFIG = "audio_processor_config.json"
#: every file onnxruntime-genai 0.18 opens by name in a folder, besides the graphs its config names
#: (model.cpp, config.h; onnxruntime-extensions' tokenizer_jsconfig.hpp: the tokenizer's files,
#: its chat template and module config, read at 319f8d2c): each one in a folder must be listed
OG_READS = frozenset({"genai_config.json", AUDIO_CONFIG, "tokenizer.json", "tokenizer_config.json",
                      "chat_template.jinja", "chat_template.json", "tokenizer_module.json"})


def _template(names: list[str], layers: int, kind: str) -> str:
    """The `%d` template of the names of one cache tensor per layer (`output.cache.%d.keys` from
    `output.cache.0.keys`, ...), for `kind` (`keys`, `values`) of `layers` layers."""
    found = {int(m.group(2)): m for m in (re.fullmatch(rf"(.*\.)(\d+)(\.{kind})", n) for n in names) if m}
    if sorted(found) != list(range(layers)):
        raise ValueError(f"no {kind} per layer in {names}")
    prefixes = {m.group(1) for m in found.values()}
    if len(prefixes) != 1:
        raise ValueError(f"{kind} of several caches in {names}")
    return f"{prefixes.pop()}%d.{kind}"


def og_whisper_config(artifacts: dict[str, Any], files: dict[str, str], model_config: Any,
                      generation_config: Any) -> dict[str, Any]:
    """The `genai_config.json` of og's two graphs (`artifacts["og_encoder"]`, `["og_decoder"]`,
    `HfOnnxProgram`s written as `files[name]`), for the Whisper `model_config` and its merged
    `generation_config`."""
    from .genai import _token

    encoder, decoder = artifacts["og_encoder"].model.graph, artifacts["og_decoder"].model.graph
    layers = int(model_config.decoder_layers)
    encoder_out = [v.name for v in encoder.outputs]
    decoder_in = [v.name for v in decoder.inputs]
    self_in = [n for n in decoder_in if ".self_attention." in n]
    cross_in = [n for n in decoder_in if ".cross_attention." in n]
    present = [v.name for v in decoder.outputs if v.name != "logits"]
    heads = int(model_config.decoder_attention_heads)
    width = int(model_config.d_model)

    def session(name: str, graph_heads: int, graph_layers: int) -> dict[str, Any]:
        return {"session_options": {"log_id": "onnxruntime-genai", "provider_options": []}, "filename": files[name],
                "head_size": width // graph_heads, "hidden_size": width, "num_attention_heads": graph_heads,
                "num_hidden_layers": graph_layers, "num_key_value_heads": graph_heads}

    encoder_heads = int(model_config.encoder_attention_heads)
    model = {
        "bos_token_id": _token(generation_config, model_config, "bos_token_id"),
        "context_length": int(model_config.max_target_positions),
        "decoder": {**session("og_decoder", heads, layers),
                    "inputs": {"input_ids": "input_ids", "past_key_names": _template(self_in, layers, "keys"),
                               "past_value_names": _template(self_in, layers, "values"),
                               "cross_past_key_names": _template(cross_in, layers, "keys"),
                               "cross_past_value_names": _template(cross_in, layers, "values")},
                    "outputs": {"logits": "logits", "present_key_names": _template(present, layers, "keys"),
                                "present_value_names": _template(present, layers, "values")}},
        "encoder": {**session("og_encoder", encoder_heads, int(model_config.encoder_layers)),
                    "inputs": {"audio_features": "input_features"},
                    "outputs": {"encoder_hidden_states": "encoder_hidden_states",
                                "cross_present_key_names": _template(encoder_out, layers, "keys"),
                                "cross_present_value_names": _template(encoder_out, layers, "values")}},
        "eos_token_id": _token(generation_config, model_config, "eos_token_id"),
        "pad_token_id": _token(generation_config, model_config, "pad_token_id"),
        "type": "whisper",
        "vocab_size": int(model_config.vocab_size),
    }
    length = int(model_config.max_target_positions)
    search = {
        "diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
        "max_length": length, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
        "num_return_sequences": 1, "past_present_share_buffer": False, "repetition_penalty": 1.0,
        "temperature": 1.0, "top_k": 1, "top_p": 1.0,
    }
    return {"model": model, "search": search}


def audio_processor_config(extractor: Any) -> dict[str, Any]:
    """og's feature extractor doing what `extractor` (a `WhisperFeatureExtractor`) does (see the
    module note): decode to 16 kHz, STFT, Whisper's log-mel over `chunk_length` s."""
    n_fft, hop = int(extractor.n_fft), int(extractor.hop_length)
    return {"feature_extraction": {"sequence": [
        {"operation": {"name": "audio_decoder", "type": "AudioDecoder"}},
        {"operation": {"name": "STFT", "type": "STFTNorm",
                       "attrs": {"n_fft": n_fft, "frame_length": n_fft, "hop_length": hop}}},
        {"operation": {"name": "log_mel_spectrogram", "type": "LogMelSpectrum",
                       "attrs": {"chunk_size": int(extractor.chunk_length), "hop_length": hop, "n_fft": n_fft,
                                 "n_mel": int(extractor.feature_size)}}},
    ]}}


def og_whisper_folder_files(folder: Path, artifacts: dict[str, Any], context: Any) -> dict[str, Any]:
    """Write `genai_config.json` and `audio_processor_config.json` into the staged export `folder`
    where og can run its Whisper graphs, and return the manifest's `runtime_package` entry: the
    files og reads, or why it does not open the folder (`context`: a `FolderContext`)."""
    from ...folder.manifest import runtime_package_entry
    from .genai import GENAI_CONFIG, RUNNER, _token

    if context.model_config is None:
        return {}
    extractor = getattr(context.processor, "feature_extractor", None)
    why = ("saved without its export plan (no FolderContents.plan)" if context.plan is None else
           og_whisper_refusal(context.model_config, context.generation_config, context.plan.config))
    if why is None and set(OG_GRAPHS) - set(artifacts):
        why = "the export has no onnxruntime-genai Whisper graphs (og_encoder, og_decoder)"
    if why is None and extractor is None:
        why = ("no feature extractor was given: onnxruntime-genai computes the features by "
               "audio_processor_config.json, made from it; export from a folder where the processor was saved "
               "(processor.save_pretrained)")
    if why is None:
        why = og_extractor_refusal(context.model_config, extractor)
    if why is None and context.tokenizer is None:
        why = "no tokenizer was given: onnxruntime-genai's processor encodes the decoder prompt with tokenizer.json"
    if why is None and _token(context.generation_config, context.model_config, "eos_token_id") == -1:
        why = "the model names no end token, and onnxruntime-genai's config needs one: give eos_token_id"
    if why is not None:
        return runtime_package_entry(RUNNER, why=why)
    files = {name: context.component_files[name][0] for name in OG_GRAPHS}
    content = og_whisper_config(artifacts, files, context.model_config, context.generation_config)
    (folder / GENAI_CONFIG).write_text(json.dumps(content, indent=4))
    (folder / AUDIO_CONFIG).write_text(json.dumps(audio_processor_config(extractor), indent=4))
    graphs = [f for name in OG_GRAPHS for f in context.component_files[name]]
    return runtime_package_entry(RUNNER, files=[GENAI_CONFIG, AUDIO_CONFIG, *graphs],
                                 settings={"model_type": "whisper", **_prompt_settings(context)})


def _prompt_settings(context: Any) -> dict[str, Any]:
    """What the manifest tells og's user to prompt the decoder with: the text of `generate()`'s
    decoder prompt up to the language where it is detected (`decoder_prompt`), which og's
    processor encodes, and whether the language is to be detected (from og's first logits)."""
    from ...generation.decoder_prompt import DETECT_LANGUAGE, decoder_prompt

    prompt = decoder_prompt(context.generation_config, context.model_config)
    known = prompt.index(DETECT_LANGUAGE) if DETECT_LANGUAGE in prompt else len(prompt)
    text = "".join(context.tokenizer.convert_ids_to_tokens(prompt[:known]))
    return {"decoder_prompt": text, "detect_language": known < len(prompt)}


#: `audio_processor_config.json` as `audio_processor_config` writes it: these operations, in this
#: order, with these attributes, each an integer (og's decoder could otherwise be told other rates)
_AUDIO_OPERATIONS = (("audio_decoder", "AudioDecoder", ()),
                     ("STFT", "STFTNorm", ("n_fft", "frame_length", "hop_length")),
                     ("log_mel_spectrogram", "LogMelSpectrum", ("chunk_size", "hop_length", "n_fft", "n_mel")))
_REMEDY = "copy the export folder again, whole, from where it was written, or export again"


def check_og_files(manifest: dict[str, Any], listed: Any) -> None:
    """Refuse (`ExportFolderError`) an onnxruntime-genai folder where a file og opens by name
    (`OG_READS`) lies unlisted (og would read it unchecked), or whose `audio_processor_config.json`
    is not what hfexport writes (`check_audio_processor_config`)."""
    import os

    from ...errors import ExportFolderError
    from ...folder.manifest import parse_json

    for name in sorted(OG_READS):
        if name not in manifest["files"] and os.path.lexists(listed.folder / name):  # a link too, even dangling
            raise ExportFolderError(f"{listed.folder / name} is not a file manifest.json lists, and "
                                    "onnxruntime-genai opens it by that name: it is not a file this export wrote",
                                    remedy=_REMEDY)
    if AUDIO_CONFIG in manifest["files"]:
        config = listed.read(AUDIO_CONFIG)
        check_audio_processor_config(parse_json(config.data, config.path), config.path)


def check_audio_processor_config(content: Any, path: Path) -> None:
    """Refuse (`ExportFolderError`, naming `path`) an `audio_processor_config.json` that is not
    what `audio_processor_config` writes: its three operations, their integer attributes, nothing else."""
    from ...errors import ExportFolderError

    def refuse(what: str) -> None:
        raise ExportFolderError(f"{path} {what}; hfexport writes no such {AUDIO_CONFIG}", remedy=_REMEDY)

    root = content.get("feature_extraction") if isinstance(content, dict) and list(content) == [
        "feature_extraction"] else None
    sequence = root.get("sequence") if isinstance(root, dict) and list(root) == ["sequence"] else None
    if not isinstance(sequence, list) or len(sequence) != len(_AUDIO_OPERATIONS):
        refuse("is not a sequence of AudioDecoder, STFTNorm and LogMelSpectrum")
    for step, (name, kind, attrs) in zip(sequence, _AUDIO_OPERATIONS):
        operation = step.get("operation") if isinstance(step, dict) and list(step) == ["operation"] else None
        if not isinstance(operation, dict) or {k: v for k, v in operation.items() if k != "attrs"} != {
                "name": name, "type": kind}:
            refuse(f"has the operation {step!r} where {kind} was written")
        given = operation.get("attrs", {})
        if not isinstance(given, dict) or set(given) != set(attrs) or not all(
                type(v) is int and 0 < v <= 1 << 20 for v in given.values()):
            refuse(f"gives {kind} the attributes {given!r}, not the integers {', '.join(attrs) or 'none'}")


def run_og_whisper(folder: Path, request: Any) -> Any:
    """Greedy tokens of onnxruntime-genai's `Generator` on the Whisper export `folder`, for `request`
    (`RunnerRequest` holding `audio`: raw samples at 16 kHz): og's processor decodes the clip and
    computes its features itself; the decoder prompt is the folder's generation config's (the
    language, where it is to be detected, the highest of og's first logits over `lang_to_id`, as
    `generate()` picks it). The tokens come back with the features og computed.

    Raises:
        RunnerUnavailable: the folder is not og's Whisper folder, the request holds no audio, or
            onnxruntime-genai or soundfile is not installed.
    """
    from ...folder.manifest import read_manifest, runtime_package
    from ...folder.package import RunnerTokens, RunnerUnavailable
    from .genai import RUNNER

    entry = runtime_package(read_manifest(folder, verify=False), RUNNER)  # the folder this export just wrote
    if entry is None or not entry["ready"] or entry["settings"].get("model_type") != "whisper":
        raise RunnerUnavailable((entry or {}).get("why") or "not onnxruntime-genai's Whisper folder")
    if request.audio is None:
        raise RunnerUnavailable("onnxruntime-genai's Whisper transcribes audio, and the request holds a text prompt")
    try:
        import numpy as np
        import onnxruntime_genai as og
        import soundfile
    except ImportError as error:
        raise RunnerUnavailable(f"{error.name} is not installed ({error}): pip install 'hfexport[genai,audio]'",
                                missing=True) from error
    from ...generation.decoder_prompt import DETECT_LANGUAGE

    prompt, generation_config = _decoder_prompt(folder)
    model = og.Model(str(folder))
    clip = io.BytesIO()
    samples = np.asarray(request.audio, dtype=np.float32)
    soundfile.write(clip, samples, OG_SAMPLING_RATE, format="WAV", subtype="FLOAT")  # float: the samples as they are
    inputs = model.create_multimodal_processor()(entry["settings"]["decoder_prompt"],
                                                 audios=og.Audios.open_bytes(clip.getvalue()))
    features = inputs["audio_features"].as_numpy()
    known = prompt.index(DETECT_LANGUAGE) if DETECT_LANGUAGE in prompt else len(prompt)
    encoded = inputs["input_ids"].as_numpy().reshape(-1).tolist()
    if encoded != prompt[:known]:
        raise ValueError(f"onnxruntime-genai's tokenizer encodes the decoder prompt "
                         f"{entry['settings']['decoder_prompt']!r} as {encoded}, where generate() starts from {prompt}")
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + request.max_new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    if known < len(prompt):
        languages = sorted(generation_config.lang_to_id.values())
        logits = generator.get_logits().reshape(-1)
        prompt[known] = languages[int(np.argmax(logits[languages]))]
        generator.append_tokens(np.array([prompt[known:]], dtype=np.int32))
    tokens: list[int] = []
    while not generator.is_done() and len(tokens) < request.max_new_tokens:
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return RunnerTokens(tuple(tokens), f"onnxruntime-genai {og.__version__} (whisper)", features=features)


def _decoder_prompt(folder: Path) -> tuple[list[int], Any]:
    """The decoder prompt `generate()` starts from on the folder's configs (`decoder_prompt`), and
    the generation config."""
    from transformers import GenerationConfig, WhisperConfig

    from ...generation.decoder_prompt import decoder_prompt

    generation_config = GenerationConfig.from_pretrained(folder)
    return decoder_prompt(generation_config, WhisperConfig.from_pretrained(folder)), generation_config
