"""The OpenVINO generation export as OpenVINO GenAI's `LLMPipeline` takes it: one stateful model.

```
out/tiny-llama/                      hfexport export DIR --format openvino --generate
  openvino_model.xml/.bin            the one `decode` component: prefill and decode
  openvino_tokenizer.xml/.bin        the tokenizer converted by openvino-tokenizers (when the model has one)
  openvino_detokenizer.xml/.bin
  config.json, generation_config.json, tokenizer files, manifest.json, ...
```
`openvino_genai.LLMPipeline(out, "CPU", INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32")`
and `GenerationRunner.load(out)` both run it.

# NOTE: the layout is the one OpenVINO's stateful LLMs have (what `optimum-intel` writes and the
# CPU plugin fuses into its KV-cache attention): inputs `input_ids`, `attention_mask` (the 2-D
# padding mask over cached + new tokens), `position_ids`, `beam_idx`; output `logits`; per cache
# leaf a variable `ReadValue -> Gather(beam_idx) -> Concat(new tokens) -> Assign`, whose reset
# value is the empty cache `[batch, heads, 0, head_dim]` (`stateful.py`). A step costs the tokens
# cached, not a `max_cache_len`, and the same graph prefills (any number of new tokens on any
# number cached: `multi_token_decode`), so there is no `prefill` component. The capture is
# planned for it (`plan_genai_generation`): multi-token decode on a dynamic cache that also
# prefills (`decompose_for_generation(decode_prefills=True)`, which gives the decode a 2-D
# `attention_mask` where `generate` left it out). A static-cache request is mapped onto it: the growing state is
# bounded at its `max_cache_len` (`OpenVINOConfig.max_cache_len`, recorded under the component's
# `state`): a static cache on OpenVINO only cost a whole-state write-back per step
# (`ReadValue -> ScatterUpdate -> Assign`, 12-25 ms a step on a 134 MB Llama at 256-2048 slots,
# `bench/RESULTS.md`). `stateful=False`, encoder-decoders, multimodal models and caches that are
# not plain key/value layers (Mamba's) keep the components they had.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

__all__ = ["GENAI_MODEL", "GENAI_PROPERTIES", "plan_genai_generation", "is_genai_layout", "convert_tokenizer_for_genai",
           "genai_folder_files", "run_llm_pipeline"]

logger = logging.getLogger("hfexport")

#: the file stem `LLMPipeline` reads the model from
GENAI_MODEL = "openvino_model"
#: what an `LLMPipeline` (or `compile_model`) is given to keep eager's fp32 numbers (an fp32 export's
#: recorded `properties`): without them the CPU plugin picks bf16 inference and an f16 KV cache on
#: processors that have bf16
GENAI_PROPERTIES = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
_TOKENIZER, _DETOKENIZER = "openvino_tokenizer", "openvino_detokenizer"


def plan_genai_generation(model: Any, inputs: dict[str, Any], config: Any, generation_config: Any,
                          multi_token_decode: bool) -> Any:
    """The capture of a decoder's generation for one stateful OpenVINO model (see the module
    note): multi-token decode that also prefills, a static cache request turned into
    `config.max_cache_len`. Other models and `stateful=False`: as asked."""
    from ...exporter import GenerationPlan
    from ...generation.decompose import is_text_decoder

    asked = GenerationPlan(inputs, generation_config, multi_token_decode, False, config)
    if not config.stateful or getattr(model.config, "is_encoder_decoder", False) or not is_text_decoder(model):
        return asked
    if generation_config is not None and getattr(generation_config, "cache_implementation", None) == "static":
        bound = int(generation_config.max_cache_len)
        if config.max_cache_len not in (None, bound):
            raise ValueError(f"a static cache of {bound} tokens and OpenVINOConfig.max_cache_len={config.max_cache_len} "
                             "disagree; pass one of them")
        generation_config = copy.deepcopy(generation_config)
        generation_config.cache_implementation = None
        generation_config.max_cache_len = None
        config = config.replace(max_cache_len=bound)
    return GenerationPlan(inputs, generation_config, True, True, config.replace(genai_layout=True))


def is_genai_layout(artifacts: dict[str, Any]) -> bool:
    """Whether a generation export's `artifacts` are the one stateful model `LLMPipeline` runs:
    a `decode` alone (it prefills), with its cache as a growing state."""
    from ...record import record_of

    if set(artifacts) != {"decode"}:
        return False
    state = record_of(artifacts["decode"]).details.get("state") or {}
    return state.get("layout") == "growing"


def convert_tokenizer_for_genai(tokenizer: Any, directory: Path) -> list[Path]:
    """Write `tokenizer` (a transformers tokenizer) as `openvino_tokenizer.xml/.bin` and
    `openvino_detokenizer.xml/.bin` in `directory`, converted by `openvino_tokenizers.convert_tokenizer`
    (the files `LLMPipeline` tokenizes and detokenizes with); return the files.

    Raises:
        ImportError: openvino-tokenizers is not installed (the message says which extra installs it).
    """
    from ..._versions import require_extra

    require_extra("openvino-genai", purpose="converting the tokenizer for OpenVINO GenAI")
    import openvino as ov
    from openvino_tokenizers import convert_tokenizer

    ov_tokenizer, ov_detokenizer = convert_tokenizer(tokenizer, with_detokenizer=True)
    written = []
    for model, stem in ((ov_tokenizer, _TOKENIZER), (ov_detokenizer, _DETOKENIZER)):
        ov.save_model(model, str(directory / f"{stem}.xml"))
        written += [directory / f"{stem}.xml", directory / f"{stem}.bin"]
    return written


def genai_folder_files(artifacts: dict[str, Any], directory: Path, tokenizer: Any) -> dict[str, Any]:
    """For a generation export in the `LLMPipeline` layout (`is_genai_layout`), write the
    converted tokenizer into `directory` (the staged folder) and return the manifest's
    `openvino_genai` entry: whether `LLMPipeline` can open the folder, its files, and why not."""
    from ...record import record_of

    if not is_genai_layout(artifacts):
        return {}
    # the precisions the export recorded (`OpenVINOConfig.inference_precision`, `kv_cache_precision`):
    # what `LLMPipeline(folder, "CPU", **properties)` is to be given to run as validated
    properties = record_of(artifacts["decode"]).details.get("compile_properties") or {}
    entry: dict[str, Any] = {"model": f"{GENAI_MODEL}.xml", "properties": dict(properties)}
    if tokenizer is None:
        return {"openvino_genai": {**entry, "llm_pipeline": False,
                                   "why": "no tokenizer was given: LLMPipeline needs openvino_tokenizer.xml"}}
    try:
        files = convert_tokenizer_for_genai(tokenizer, directory)
    except Exception as error:  # noqa: BLE001 - the export stands; the manifest and a warning say why LLMPipeline cannot open it
        why = f"openvino-tokenizers could not convert the tokenizer: {type(error).__name__}: {error}"
        logger.warning("the export folder is not an LLMPipeline folder: %s", why)
        return {"openvino_genai": {**entry, "llm_pipeline": False, "why": why}}
    return {"openvino_genai": {**entry, "llm_pipeline": True, "tokenizer": [f.name for f in files]}}


def run_llm_pipeline(folder: Path, request: Any) -> Any:
    """Greedy tokens of OpenVINO GenAI's `LLMPipeline` on the export `folder`, on CPU with the
    precisions the manifest records, for `request` (`llm_package.RunnerRequest`): token ids in
    (`TokenizedInputs`) and out, so the folder's converted tokenizer is not needed; it stops at
    the request's end tokens.

    Raises:
        RunnerUnavailable: the folder is not in `LLMPipeline`'s layout (the components), or
            openvino-genai is not installed.
    """
    from ...llm_package import RunnerTokens, RunnerUnavailable

    entry = json.loads((folder / "manifest.json").read_text()).get("openvino_genai")
    if entry is None:
        raise RunnerUnavailable("this model's folder is the components: not one stateful model in LLMPipeline's "
                                "layout (OpenVINOConfig(stateful=False), an encoder-decoder or multimodal model)")
    try:
        import numpy as np
        import openvino as ov
        import openvino_genai
    except ImportError as error:
        raise RunnerUnavailable(f"openvino-genai is not installed ({error}): pip install 'hfexport[openvino-genai]'",
                                missing=True) from error
    pipe = openvino_genai.LLMPipeline(str(folder), "CPU", **entry.get("properties", {}))
    config = pipe.get_generation_config()
    config.max_new_tokens, config.do_sample = request.max_new_tokens, False
    config.stop_token_ids = set(request.eos_token_ids)
    ids = np.array([request.prompt_ids], dtype=np.int64)
    out = pipe.generate(openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), config)
    return RunnerTokens(tuple(int(t) for t in out.tokens[0]), f"openvino-genai {openvino_genai.__version__}")
