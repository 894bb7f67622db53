"""`genai_config.json`: the ONNX generation folder as an onnxruntime-genai model folder.

```python
import onnxruntime_genai as og                      # pip install "hfexport[genai]"
model = og.Model("out/llama")                       # hfexport export ... --format onnx --generate --static-cache N
params = og.GeneratorParams(model)
params.set_search_options(max_length=64)
generator = og.Generator(model, params)
generator.append_tokens([[1, 2, 3]])
while not generator.is_done():
    generator.generate_next_token()
```

# NOTE: what onnxruntime-genai (0.18.0) needs from the folder, learnt from the config its model
# builder writes (`onnxruntime_genai/models/builder.py`, read, not imported or copied): one decoder
# graph taking `input_ids`, a 2-D `attention_mask` over past + new tokens, optionally
# `position_ids`, and per layer a past key/value it binds to the same buffer as the present one
# (`search.past_present_share_buffer`), `[batch, kv_heads, max_length, head_size]`; names are
# templates with `%d` for the layer, so hfexport's `input.cache.%d.keys` / `output.cache.%d.keys`
# are given as they are. That is the static-cache decode graph after the GroupQueryAttention
# rewrite (`gqa.py`): the config is written only for such a folder, and `genai_status` says why
# not otherwise. The tokenizer files are the ones `bundle.save_folder` writes when given a
# tokenizer (`tokenizer.json`, `tokenizer_config.json`); without them genai runs on token ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...model_config import text_config

__all__ = ["GENAI_CONFIG", "RUNNER", "genai_status", "genai_config", "genai_folder_files", "run_genai", "check_genai_config"]

GENAI_CONFIG = "genai_config.json"
#: the runner of the manifest's `runtime_package` entry (`manifest.RUNNERS`)
RUNNER = "onnxruntime-genai"

#: onnxruntime-genai 0.18.0's decoder-only model types (`model.type`); any other is given as "decoder".
_GENAI_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "olmo", "granite", "smollm3")
#: the model types onnxruntime-genai 0.18.0's multimodal processors serve (read from its library's
#: processor names): no LLaVA, no Qwen2-VL (Qwen2.5-VL's tower has window attention Qwen2-VL's lacks)
_GENAI_VISION_TYPES = ("phi3v", "phi4mm", "gemma3", "qwen2_5_vl", "qwen3_vl", "mistral3", "fara", "lfm2_vl")


def genai_status(artifacts: dict[str, Any], generation_config: Any) -> str | None:
    """Why the export `artifacts` cannot be an onnxruntime-genai folder, or None when it can."""
    from ...capture.record import record_of
    from .graph_interface import GRAPH_INTERFACE

    if "image_encoder" in artifacts:
        return ("onnxruntime-genai 0.18's multimodal pipeline (og.MultiModalProcessor) reads the vision layouts of "
                f"{', '.join(_GENAI_VISION_TYPES)} only, not this image-text model's; `hfexport generate --image` "
                "runs the folder")
    if "encoder" in artifacts:  # T5, Whisper: --static-cache makes no one-graph decoder of them
        return (f"onnxruntime-genai's folder made here is one decoder-only graph; this encoder-decoder export has "
                f"{sorted(artifacts)}, which `hfexport generate` runs")
    if set(artifacts) != {"decode"}:
        return (f"onnxruntime-genai runs one decoder graph; this export has {sorted(artifacts)} (export with "
                "--multi-token-decode --static-cache N)")
    record = record_of(artifacts["decode"])
    if not record.details.get(GRAPH_INTERFACE):
        gqa = record.details.get("ort_fusions", {}).get("group_query_attention", {})
        return f"the decode graph has no GroupQueryAttention: {gqa.get('kept', 'ONNX Runtime fusions off')}"
    if not getattr(generation_config, "max_cache_len", None):
        return "the export records no static cache length"
    return None


def genai_config(artifact: Any, config: Any, generation_config: Any) -> dict[str, Any]:
    """The `genai_config.json` of the GroupQueryAttention decode graph `artifact` (an
    `HfOnnxProgram`), for the model `config` and its merged `generation_config`."""
    graph = artifact.model.graph
    inputs = {v.name: v for v in graph.inputs}
    keys = sorted((v for v in graph.inputs if v.name.startswith("input.cache.") and v.name.endswith(".keys")),
                  key=lambda v: int(v.name.split(".")[2]))
    attention = next(n for n in graph if n.op_type == "GroupQueryAttention")
    text = text_config(config)
    length = int(generation_config.max_cache_len)
    names = {"input_ids": "input_ids", "attention_mask": "attention_mask"}
    if "position_ids" in inputs:
        names["position_ids"] = "position_ids"
    model_type = getattr(text, "model_type", "")
    decoder = {
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
        "filename": "decode.onnx",
        "head_size": int(keys[0].shape[3]),
        "hidden_size": int(getattr(text, "hidden_size", 0) or attention.attributes.get_int("num_heads") * keys[0].shape[3]),
        "inputs": {**names, "past_key_names": "input.cache.%d.keys", "past_value_names": "input.cache.%d.values"},
        "outputs": {"logits": "logits", "present_key_names": "output.cache.%d.keys",
                    "present_value_names": "output.cache.%d.values"},
        "num_attention_heads": attention.attributes.get_int("num_heads"),
        "num_hidden_layers": len(keys),
        "num_key_value_heads": int(keys[0].shape[1]),
    }
    model = {
        "bos_token_id": _token(generation_config, text, "bos_token_id"),
        "context_length": length,
        "decoder": decoder,
        "eos_token_id": _token(generation_config, text, "eos_token_id"),
        "pad_token_id": _token(generation_config, text, "pad_token_id"),
        "type": model_type if model_type in _GENAI_TYPES else "decoder",
        "vocab_size": int(graph.outputs[0].shape[-1]),
    }
    search = {
        "diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
        "max_length": length, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
        "num_return_sequences": 1, "past_present_share_buffer": True,
        "repetition_penalty": float(getattr(generation_config, "repetition_penalty", None) or 1.0),
        "temperature": 1.0, "top_k": 1, "top_p": 1.0,
    }
    return {"model": model, "search": search}


#: The keys `genai_config` writes, level by level (`None`: a value of plain numbers, strings and
#: lists of them). A folder's `genai_config.json` with any other key is refused before anything
#: reads it: onnxruntime-genai's configs can also name a custom-op library to load into the
#: process (`session_options.custom_ops_library`), execution providers, and more model files.
_SESSION_KEYS: dict[str, Any] = {
    "session_options": {"log_id": None, "provider_options": None}, "filename": None, "head_size": None,
    "hidden_size": None, "num_attention_heads": None, "num_hidden_layers": None, "num_key_value_heads": None,
}
_MODEL_KEYS = {"bos_token_id": None, "context_length": None, "eos_token_id": None, "pad_token_id": None, "type": None,
               "vocab_size": None}
_SEARCH_KEYS = {key: None for key in (
    "diversity_penalty", "do_sample", "early_stopping", "length_penalty", "max_length", "min_length",
    "no_repeat_ngram_size", "num_beams", "num_return_sequences", "past_present_share_buffer",
    "repetition_penalty", "temperature", "top_k", "top_p")}
_GENAI_KEYS: dict[str, Any] = {
    "model": {
        **_MODEL_KEYS,
        "decoder": {
            **_SESSION_KEYS,
            "inputs": {"input_ids": None, "attention_mask": None, "position_ids": None, "past_key_names": None,
                       "past_value_names": None},
            "outputs": {"logits": None, "present_key_names": None, "present_value_names": None},
        },
    },
    "search": _SEARCH_KEYS,
}
#: a Whisper's (`whisper_folder.og_whisper_config`): an encoder, the cross-attention cache's names
_WHISPER_KEYS: dict[str, Any] = {
    "model": {
        **_MODEL_KEYS,
        "decoder": {**_SESSION_KEYS,
                    "inputs": {key: None for key in ("input_ids", "past_key_names", "past_value_names",
                                                     "cross_past_key_names", "cross_past_value_names")},
                    "outputs": {"logits": None, "present_key_names": None, "present_value_names": None}},
        "encoder": {**_SESSION_KEYS, "inputs": {"audio_features": None},
                    "outputs": {key: None for key in ("encoder_hidden_states", "cross_present_key_names",
                                                      "cross_present_value_names")}},
    },
    "search": _SEARCH_KEYS,
}


def check_genai_config(content: Any, listed: set[str], path: Path) -> None:
    """Refuse (`ExportFolderError`, naming `path`) a `genai_config.json` holding anything
    `genai_config` does not write (`_GENAI_KEYS`; a Whisper's, `whisper_folder.og_whisper_config`:
    `_WHISPER_KEYS`), execution providers, or a decoder or encoder file that is not one of the
    folder's listed files (`listed`)."""
    from ...errors import ExportFolderError

    def refuse(what: str) -> None:
        raise ExportFolderError(f"{path} {what}; hfexport writes no such genai_config.json",
                                 remedy="copy the export folder again, whole, from where it was written, or export "
                                        "again")

    def walk(found: Any, keys: dict[str, Any], where: str) -> None:
        if not isinstance(found, dict):
            refuse(f"holds a {type(found).__name__} at {where or 'its top'}, not an object")
        for key, value in found.items():
            if key not in keys:
                refuse(f"has the key {where + key!r}")
            if keys[key] is not None:
                walk(value, keys[key], f"{where}{key}.")
            elif isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value)):
                refuse(f"has an object at {where + key!r}")

    model = content.get("model") if isinstance(content, dict) else None
    is_whisper = isinstance(model, dict) and model.get("type") == "whisper"
    walk(content, _WHISPER_KEYS if is_whisper else _GENAI_KEYS, "")
    for session in ("decoder", "encoder") if is_whisper else ("decoder",):
        options = content["model"].get(session, {})
        if options.get("session_options", {}).get("provider_options", []) != []:
            refuse(f"names execution providers (model.{session}.session_options.provider_options)")
        if options.get("filename") not in listed:
            refuse(f"names the {session} {options.get('filename')!r}, which manifest.json does not list")


def _token(generation_config: Any, config: Any, name: str) -> Any:
    """A special token id from the generation config, else the model config; eos may be a list.
    A missing pad falls back to eos (genai needs one), a missing bos or eos to -1."""
    value = getattr(generation_config, name, None)
    if value is None:
        value = getattr(config, name, None)
    if value is None and name == "pad_token_id":
        value = _token(generation_config, config, "eos_token_id")
        value = value[0] if isinstance(value, list) else value
    if value is None:
        return -1
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else int(value)


def genai_folder_files(folder: Path, artifacts: dict[str, Any], context: Any) -> dict[str, Any]:
    """Write `genai_config.json` into the export `folder` where `artifacts` can be an
    onnxruntime-genai model (`genai_status`); return the manifest's `runtime_package` entry,
    naming the files og reads or saying why there are none (`context`: an `exporter.FolderContext`)."""
    from ...folder.manifest import runtime_package_entry

    if context.model_config is None:
        return {}
    why = genai_status(artifacts, context.generation_config)
    if why is None and _token(context.generation_config, text_config(context.model_config), "eos_token_id") == -1:
        why = ("the model names no end token, and onnxruntime-genai's config needs one (it refuses eos_token_id -1): "
               "give eos_token_id in config.json or generation_config.json, or export from a folder whose tokenizer "
               "has an eos_token")
    if why is not None:
        return runtime_package_entry(RUNNER, why=why)
    content = genai_config(artifacts["decode"], context.model_config, context.generation_config)
    (folder / GENAI_CONFIG).write_text(json.dumps(content, indent=4))
    return runtime_package_entry(RUNNER, files=[GENAI_CONFIG, *context.component_files.get("decode", [])])


def run_genai(folder: Path, request: Any) -> Any:
    """Greedy tokens of onnxruntime-genai's `Generator` on the export `folder` (its
    `genai_config.json`), for `request` (`RunnerRequest`): token ids in and out, no
    tokenizer involved. It stops at the config's `eos_token_id`, as eager `generate` does.

    Raises:
        RunnerUnavailable: the folder has no `genai_config.json` (why, from its manifest), or
            onnxruntime-genai is not installed.
    """
    from ...folder.package import RunnerTokens, RunnerUnavailable
    from ...folder.manifest import read_manifest, runtime_package

    entry = runtime_package(read_manifest(folder, verify=False), RUNNER)  # the folder this export just wrote
    if entry is None or not entry["ready"]:
        raise RunnerUnavailable(f"this model's folder is the components: {(entry or {}).get('why') or 'no genai_config.json'}")
    try:
        import onnxruntime_genai as og
    except ImportError as error:
        raise RunnerUnavailable(f"onnxruntime-genai is not installed ({error}): pip install 'hfexport[genai]'",
                                missing=True) from error
    model = og.Model(str(folder))
    prompt = _unpadded(list(request.prompt_ids), json.loads((folder / GENAI_CONFIG).read_text())["model"])
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + request.max_new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens([prompt])
    tokens: list[int] = []
    while not generator.is_done() and len(tokens) < request.max_new_tokens:
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return RunnerTokens(tuple(tokens), f"onnxruntime-genai {og.__version__}",
                        prompt_ids=tuple(prompt) if len(prompt) < len(request.prompt_ids) else None)


def _unpadded(prompt: list[int], model: dict[str, Any]) -> list[int]:
    """`prompt` without its trailing pad tokens (at least one token kept): og takes them for right
    padding and masks them (`llm_engine.py`'s note), so the check runs og on the prompt it serves as
    `generate()` does, and eager on the same (`RunnerTokens.prompt_ids`)."""
    end = len(prompt)
    while end > 1 and prompt[end - 1] == model["pad_token_id"]:
        end -= 1
    return prompt[:end]
