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
#
# NOTE: a model with a sliding window shorter than the sequences the state may hold (Gemma-2/3,
# Mistral, Phi-3's 2047) gets no `LLMPipeline` folder: the same stateful model, written as
# `decode.xml` with no converted tokenizer, which `hfexport generate` runs and `LLMPipeline` does not
# open; the manifest's `openvino_genai` says why (`window_refusal`). LLMPipeline 2026.4.1 runs its
# PagedAttention backend by default, which attends past the window of this graph (the window is in
# the mask the graph computes, which its SDPA-to-PagedAttention transformation does not read), so
# the folder would give wrong tokens once a sequence outgrows the window, and nothing would say so.
# Measured on the tiny Gemma-3 (window 4, prompts of 1 and 20 tokens): PA's greedy tokens differ
# from eager's from the first on; `ATTENTION_BACKEND="SDPA"` gave eager's, but a folder cannot
# choose the backend its user's pipeline runs.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

from ...model_config import text_config

__all__ = ["GENAI_MODEL", "GENAI_PROPERTIES", "RUNNER", "plan_genai_generation", "attention_window",
           "window_refusal", "llm_pipeline_refusal", "is_genai_layout", "convert_tokenizer_for_genai",
           "float32_logits", "genai_folder_files", "run_llm_pipeline"]

logger = logging.getLogger("hfexport")

#: the file stem `LLMPipeline` reads the model from
GENAI_MODEL = "openvino_model"
#: what an `LLMPipeline` (or `compile_model`) is given to keep eager's fp32 numbers (an fp32 export's
#: recorded `properties`): without them the CPU plugin picks bf16 inference and an f16 KV cache on
#: processors that have bf16
GENAI_PROPERTIES = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
_TOKENIZER, _DETOKENIZER = "openvino_tokenizer", "openvino_detokenizer"
#: the runner of the manifest's `runtime_package` entry (`manifest.RUNNERS`)
RUNNER = "LLMPipeline"
#: the decode record's entry saying why its folder is no `LLMPipeline` folder (`window_refusal`)
_REFUSED = "llm_pipeline_refused"
#: the OpenVINO GenAI whose PagedAttention was seen to attend past a sliding window (`window_refusal`)
_GENAI_SEEN = "2026.4.1"


def plan_genai_generation(model: Any, inputs: dict[str, Any], config: Any, generation_config: Any,
                          multi_token_decode: bool) -> Any:
    """The capture of a decoder's generation for one stateful OpenVINO model (see the module
    note): multi-token decode that also prefills, a static cache request turned into
    `config.max_cache_len`. Other models and `stateful=False`: as asked."""
    from ...folder.package import GenerationPlan
    from ...generation.components import is_text_decoder

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
    plan = GenerationPlan(inputs, generation_config, True, True, config.replace(genai_layout=True))
    why = window_refusal(model.config, config.max_cache_len)
    if why is not None:  # the decode's record carries it to the packaging (`genai_folder_files`)
        logger.warning("the export folder will not be an LLMPipeline folder (`hfexport generate` runs it): %s", why)
        plan.record_details.setdefault("decode", {})[_REFUSED] = why
    return plan


def float32_logits(model: Any) -> str | None:
    """Give `model` (an `openvino.Model`, changed in place) float32 `logits` where a 16-bit model
    computes them in its own dtype; return what was changed, or None.

    # NOTE: OpenVINO GenAI 2026.4.1's `LLMPipeline` reads the logits as float32 ("Tensor data with
    # element type f16, is not representable as pointer to f32"), as optimum-intel exports them: a
    # `--dtype float16` model's package failed in its runner. The logits are converted at the end,
    # which widens each value exactly; the rest of the graph keeps the model's dtype.
    """
    import openvino as ov
    from openvino.preprocess import PrePostProcessor

    port = next((output for output in model.outputs if "logits" in output.get_names()), None)
    if port is None or port.get_element_type() == ov.Type.f32:
        return None
    was = str(port.get_element_type())
    processor = PrePostProcessor(model)
    processor.output("logits").tensor().set_element_type(ov.Type.f32)
    processor.build()
    return f"logits {was} -> f32 (LLMPipeline reads float32 logits)"


def attention_window(config: Any) -> int | None:
    """The sliding window some layer of the text `config` attends, or None where every layer
    attends everything (no `sliding_window`, Qwen's `use_sliding_window=False`, `layer_types`
    without a sliding layer)."""
    text = text_config(config)
    window = getattr(text, "sliding_window", None)
    layer_types = getattr(text, "layer_types", None)
    if window is None or getattr(text, "use_sliding_window", None) is False:
        return None
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return int(window)


def window_refusal(config: Any, bound: int | None) -> str | None:
    """Why `LLMPipeline` must not run a model of `config` whose state holds up to `bound` tokens
    (None: up to its `max_position_embeddings`), or None: a window shorter than that (see the
    module note)."""
    window = attention_window(config)
    longest = bound or getattr(text_config(config), "max_position_embeddings", None)
    if window is None or (longest is not None and window >= longest):
        return None
    return (f"a sliding window of {window} tokens: OpenVINO GenAI {_GENAI_SEEN}'s LLMPipeline attends past it "
            "with its default PagedAttention backend (greedy tokens differ from eager's once a sequence is longer "
            "than the window; it takes the window only from the attention patterns its SDPA-to-PagedAttention "
            "transformation matches, openvinotoolkit/openvino.genai#3871); export with --static-cache N, N <= "
            f"{window}, for an LLMPipeline folder, or run these components with `hfexport generate`")


def llm_pipeline_refusal(artifacts: dict[str, Any]) -> str | None:
    """Why a generation export in the `LLMPipeline` layout is no `LLMPipeline` folder, by its
    plan (`window_refusal`), or None."""
    from ...capture.record import record_of

    return record_of(artifacts["decode"]).details.get(_REFUSED) if is_genai_layout(artifacts) else None


def is_genai_layout(artifacts: dict[str, Any]) -> bool:
    """Whether a generation export's `artifacts` are the one stateful model `LLMPipeline` runs:
    a `decode` alone (it prefills), with its cache as a growing state."""
    from ...capture.record import record_of

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


def genai_folder_files(artifacts: dict[str, Any], directory: Path, context: Any) -> dict[str, Any]:
    """For a generation export in the `LLMPipeline` layout (`is_genai_layout`), write the
    converted tokenizer into `directory` (the staged folder) and return the manifest's
    `runtime_package` entry: the files `LLMPipeline` reads, or why it cannot open the folder (a
    refused one, `llm_pipeline_refusal`, gets no tokenizer and keeps its `decode` name). A text
    export in another layout (`OpenVINOConfig(stateful=False)`, an encoder-decoder) says so;
    an image-text one is `vlm.vlm_folder_files`'."""
    from ...folder.manifest import runtime_package_entry
    from ...capture.record import record_of

    if "image_encoder" in artifacts:
        return {}
    if not is_genai_layout(artifacts):
        return runtime_package_entry(RUNNER, why=(
            "the folder holds the components, not one stateful model in LLMPipeline's layout "
            "(OpenVINOConfig(stateful=False), or an encoder-decoder model)"))
    if (refused := llm_pipeline_refusal(artifacts)) is not None:
        return runtime_package_entry(RUNNER, why=refused)
    # the precisions the export recorded (`OpenVINOConfig.inference_precision`, `kv_cache_precision`):
    # what `LLMPipeline(folder, "CPU", **properties)` is to be given to run as validated
    properties = record_of(artifacts["decode"]).details.get("compile_properties") or {}
    settings = {"model": f"{GENAI_MODEL}.xml", "properties": dict(properties)}
    if context.tokenizer is None:
        return runtime_package_entry(RUNNER, why="no tokenizer was given: LLMPipeline needs openvino_tokenizer.xml",
                                     settings=settings)
    try:
        files = convert_tokenizer_for_genai(context.tokenizer, directory)
    except Exception as error:  # noqa: BLE001 - the export stands; the manifest and a warning say why LLMPipeline cannot open it
        why = f"openvino-tokenizers could not convert the tokenizer: {type(error).__name__}: {error}"
        logger.warning("the export folder is not an LLMPipeline folder: %s", why)
        return runtime_package_entry(RUNNER, why=why, settings=settings)
    return runtime_package_entry(RUNNER, files=[*context.component_files.get("decode", []), *(f.name for f in files)],
                                 settings=settings)


def run_llm_pipeline(folder: Path, request: Any) -> Any:
    """Greedy tokens of OpenVINO GenAI's `LLMPipeline` on the export `folder`, on CPU with the
    precisions the manifest records, for `request` (`RunnerRequest`): token ids in
    (`TokenizedInputs`) and out, so the folder's converted tokenizer is not needed; it stops at
    the request's end tokens.

    Raises:
        RunnerUnavailable: the folder is not in `LLMPipeline`'s layout (the components), or
            openvino-genai is not installed.
    """
    from ...folder.package import RunnerTokens, RunnerUnavailable
    from ...folder.manifest import read_manifest, runtime_package

    entry = runtime_package(read_manifest(folder, verify=False), RUNNER)  # the folder this export just wrote
    if entry is None or "model" not in entry["settings"]:  # `window_refusal`: written as the components' decode
        raise RunnerUnavailable("this model's folder is the components: " + (
            (entry or {}).get("why") or "not one stateful model in LLMPipeline's layout (a multimodal model)"))
    try:
        import numpy as np
        import openvino as ov
        import openvino_genai
    except ImportError as error:
        raise RunnerUnavailable(f"openvino-genai is not installed ({error}): pip install 'hfexport[openvino-genai]'",
                                missing=True) from error
    pipe = openvino_genai.LLMPipeline(str(folder), "CPU", **entry["settings"].get("properties", {}))
    config = pipe.get_generation_config()
    config.max_new_tokens, config.do_sample = request.max_new_tokens, False
    config.stop_token_ids = set(request.eos_token_ids)
    ids = np.array([request.prompt_ids], dtype=np.int64)
    out = pipe.generate(openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), config)
    return RunnerTokens(tuple(int(t) for t in out.tokens[0]), f"openvino-genai {openvino_genai.__version__}")
