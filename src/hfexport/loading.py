"""Turn what a user names on the CLI into a model and sample inputs.

`tiny:<preset>` builds a random model offline (`tiny:llama` with a tokenizer and chat template, an
image-text preset with its processor); a local folder written by `save_pretrained`
(or a hub id, when online) goes through `from_pretrained` with the class its config names; a
GGUF file (`model.gguf`, or a folder or hub repo and `gguf_file=`) goes through transformers' GGUF
support, dequantized to float32, with the tokenizer and chat template its metadata holds (`load_gguf`).

Every `from_pretrained` is given `revision` and `trust_remote_code` as the caller passed them;
`trust_remote_code` is always a bool, never `None`, which would make transformers ask on stdin.

Every model is loaded in the dtype asked (`DTYPES`: `"float32"` by default, `"auto"` the checkpoint's
own, as transformers' `dtype="auto"`), and its floating-point sample inputs are cast to it.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from pathlib import Path
from typing import Any

import torch

from .errors import OptionError, PrepareError
from .model_config import text_config
from .presets import build_preset, tiny_tokenizer

__all__ = ["DTYPES", "LoadedModel", "check_dtype", "load_model", "load_gguf", "gguf_weights", "mapped_share",
           "sample_inputs_for", "with_end_token", "dtype_name"]

#: The dtypes a model can be loaded in (`load_model(dtype=...)`, `--dtype`); `"auto"` is the checkpoint's.
DTYPES = ("auto", "float32", "float16", "bfloat16")


@dataclasses.dataclass
class LoadedModel:
    """A model ready to export: the module, sample inputs, where it came from, its tokenizer if any."""
    model: torch.nn.Module
    inputs: dict[str, Any]
    source: str
    tokenizer: Any = None
    #: the share of the weight bytes mapped from the checkpoint's files rather than copied into
    #: memory (`mapped_share`); None for a model not loaded from a folder
    weights_mapped: float | None = None
    #: where the weights came from when not a transformers checkpoint: a GGUF file's quantization
    #: (`gguf_weights`); the report and the manifest carry it
    weights_from: dict[str, Any] | None = None
    #: why `tokenizer` is None (`"no tokenizer files in the folder"`, or the error that stopped
    #: transformers building it); None when there is a tokenizer. The report carries it.
    tokenizer_missing: str | None = None
    #: an image-text model's processor (image processor, tokenizer, chat template) or a speech
    #: model's (feature extractor, tokenizer), saved with a generation export so that `hfexport
    #: generate --image` reads image files (`--audio` audio files); None without one
    processor: Any = None
    #: the end token given to the model's generation config from its tokenizer, where neither the
    #: model config nor the generation config named one (`with_end_token`); the report carries it
    end_token: dict[str, Any] | None = None


def _first_input_name(model: torch.nn.Module) -> str:
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return params[0].name if params else "input_ids"


def sample_inputs_for(model: torch.nn.Module, tokenizer: Any = None, prompt: str = "Hello, world!") -> dict[str, Any]:
    """Small sample inputs for `model`, derived from its config and forward signature."""
    from . import presets

    config = model.config
    first = _first_input_name(model)
    if first == "input_ids":
        if tokenizer is not None:
            inputs = dict(tokenizer(prompt, return_tensors="pt"))
        else:
            inputs = presets.text_inputs(config)
        if getattr(config, "is_encoder_decoder", False):
            start = getattr(config, "decoder_start_token_id", None) or 0
            inputs["decoder_input_ids"] = torch.tensor([[start]], dtype=torch.long).repeat(1, 3)
        # an encoder's segment ids where no tokenizer says which inputs the model takes; a generative
        # model's sample is what generate() feeds (GPT-2 takes token_type_ids but its tokenizer gives
        # none, and a decode graph reading them is no runtime LLM runner's: onnxruntime-genai feeds none)
        generates = callable(getattr(model, "can_generate", None)) and model.can_generate()
        if (tokenizer is None and not generates and "token_type_ids" in inspect.signature(model.forward).parameters
                and "token_type_ids" not in inputs):
            inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
        return inputs
    if first == "pixel_values":
        return presets.image_inputs(config)
    if first == "input_features":
        return presets.whisper_inputs(config)
    if first == "input_values":
        return presets.audio_inputs(config)
    raise PrepareError(
        f"cannot make sample inputs for a model whose forward starts with {first!r}",
        model=type(model).__name__,
        remedy="export from Python with exporter.export(model, inputs) and your own inputs",
    )


def dtype_name(model: torch.nn.Module) -> str:
    """The dtype of `model`'s floating-point weights, as `DTYPES` names it (`"float16"`); `"float32"`
    for a model without any."""
    found = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return str(found).removeprefix("torch.")


def check_dtype(dtype: str) -> str:
    """`dtype` when `DTYPES` names it, else an `OptionError` (a `ValueError`) listing them."""
    if dtype not in DTYPES:
        raise OptionError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    return dtype


def _in_dtype(loaded: LoadedModel, dtype: str) -> LoadedModel:
    """`loaded` with its model in `dtype` (`"auto"`: the dtype its config names, float32 when it names
    none) and its floating-point sample inputs cast to the model's dtype."""
    if dtype == "auto":
        dtype = str(getattr(loaded.model.config, "dtype", None) or "float32").removeprefix("torch.")
    if dtype != dtype_name(loaded.model):
        loaded.model.to(getattr(torch, check_dtype(dtype)))
    target = getattr(torch, dtype_name(loaded.model))
    loaded.inputs = {name: value.to(target) if isinstance(value, torch.Tensor) and value.is_floating_point() else value
                     for name, value in loaded.inputs.items()}
    return loaded


def load_model(spec: str, *, prompt: str = "Hello, world!", gguf_file: str | None = None,
               revision: str | None = None, trust_remote_code: bool = False, dtype: str = "float32") -> LoadedModel:
    """Load `spec` (`tiny:<preset>`, a local folder, a hub id, or a `.gguf` file; a folder or a hub
    repo with `gguf_file` names a GGUF file in it) with sample inputs.

    Args:
        revision: the hub revision (branch, tag or commit) to load; passed to every `from_pretrained`.
        trust_remote_code: run the Python code a repository's config names (`auto_map`); off unless
            asked, and passed to every `from_pretrained`.
        dtype: the dtype of the weights, one of `DTYPES` (`"auto"`: the checkpoint's `dtype`, a
            GGUF file's float32, a preset's float32); floating-point sample inputs follow it.
    """
    from .model_spec import check_local, check_preset, hub_options

    check_dtype(dtype)
    if spec.startswith("tiny:"):
        check_preset(spec)
        model, inputs = build_preset(spec)
        processor = _tiny_processor(spec)
        tokenizer = getattr(processor, "tokenizer", None) or tiny_tokenizer(spec)
        return _in_dtype(LoadedModel(model, inputs, spec, tokenizer, processor=processor,
                                     tokenizer_missing=None if tokenizer else "a tiny: preset has no tokenizer"), dtype)
    hub = {"revision": revision, "trust_remote_code": bool(trust_remote_code)}
    local = check_local(spec, gguf_file=gguf_file)  # a missing path or a broken config.json fails here
    if gguf_file is not None or spec.lower().endswith(".gguf"):
        loaded = _in_dtype(load_gguf(spec, gguf_file, prompt=prompt, **hub), dtype)
        loaded.weights_from["dequantized_to"] = dtype_name(loaded.model)  # then cast, where asked
        return with_end_token(loaded)
    import transformers

    if not local:  # a hub repo: from the hub cache alone when the hub cannot be reached, else an error now
        hub.update(hub_options(spec, "config.json", revision))
    try:
        config = transformers.AutoConfig.from_pretrained(spec, **hub)
    except (OSError, ValueError) as error:
        if not trust_remote_code and "trust_remote_code" in str(error):
            raise PrepareError(
                f"{spec!r} needs its own Python code to load (its config names it in auto_map), and "
                "--trust-remote-code was not given", remedy="read the repository's code; if you trust it, pass "
                "--trust-remote-code (trust_remote_code=True), which runs the repository's code") from error
        hint = ("a folder written by save_pretrained holds config.json and the weights" if local else
                "check the hub id (ORG/NAME) and --revision; a gated or private repo needs `hf auth login`")
        raise PrepareError(f"cannot load {spec!r}: {str(error).splitlines()[0]}", remedy=hint) from error
    model_class = _model_class(spec, config, trust_remote_code)
    # transformers' own `dtype` ("auto": the checkpoint's), so that a weight kept in its dtype stays mapped
    model = model_class.from_pretrained(spec, dtype=dtype, **hub).eval()
    tokenizer, missing = _tokenizer(spec, **hub)
    mapped = mapped_share(model, spec) if os.path.isdir(spec) else None
    processor = _processor(spec, config, **hub)
    inputs = image_text_inputs(model, processor, prompt) or sample_inputs_for(model, tokenizer, prompt)
    return with_end_token(_in_dtype(LoadedModel(model, inputs, spec, tokenizer, mapped, tokenizer_missing=missing,
                                                processor=processor), dtype_name(model)))


def with_end_token(loaded: LoadedModel) -> LoadedModel:
    """`loaded` with its tokenizer's end token (`eos_token_id`) in the model's generation config,
    where neither the generation config nor the model config names one; `loaded.end_token` says so.

    # NOTE: a checkpoint whose `config.json` has no `eos_token_id` while its tokenizer names `</s>`
    # is common; the runtimes' LLM runners need an end token (onnxruntime-genai refuses
    # `eos_token_id: -1`, "must be in range"), and onnxruntime-genai's own model builder takes the
    # tokenizer's. Set on the generation config, it is the one end token of the whole export: eager
    # `generate` (validation, the runner check), the saved `generation_config.json`, the packages'
    # configs and `hfexport generate` all stop at it.
    """
    generation = getattr(loaded.model, "generation_config", None)
    config = getattr(loaded.model, "config", None)
    text = text_config(config)
    eos = getattr(loaded.tokenizer, "eos_token_id", None)
    if generation is None or eos is None or generation.eos_token_id is not None \
            or getattr(text, "eos_token_id", None) is not None:
        return loaded
    generation.eos_token_id = int(eos)
    loaded.end_token = {"eos_token_id": int(eos), "from": f"the tokenizer's eos_token {loaded.tokenizer.eos_token!r}: "
                        "neither the model config nor its generation config names an eos_token_id"}
    return loaded


#: the side of the random image an image-text model's sample prompt shows (its processor resizes it)
SAMPLE_IMAGE_SIZE = 64


def image_text_inputs(model: torch.nn.Module, processor: Any, prompt: str = "Hello, world!") -> dict[str, Any] | None:
    """Sample inputs of an image-text model (a forward taking `input_ids` and `pixel_values`): its
    processor's output on a random image and `prompt` (with the processor's chat template), so the
    export traces the image path (`--generate`: the image encoder among the components); None for
    another model. Without its processor, the preset's inputs for its architecture (LLaVA, Qwen2-VL).

    Raises:
        PrepareError: an image-text model without its processor, of an architecture with no preset:
            text-only inputs would export a model that never sees an image.
    """
    from . import presets

    parameters = inspect.signature(model.forward).parameters
    if not ("input_ids" in parameters and "pixel_values" in parameters and hasattr(model.config, "vision_config")):
        return None
    if processor is not None:
        import numpy as np
        from PIL import Image  # the processor was built, so its image processor's Pillow is there

        from .generation.image_input import prompt_text

        pixels = np.random.default_rng(1).integers(0, 256, (SAMPLE_IMAGE_SIZE, SAMPLE_IMAGE_SIZE, 3), dtype=np.uint8)
        made = processor(images=[Image.fromarray(pixels)], text=[prompt_text(processor, prompt)], return_tensors="pt")
        return {name: value for name, value in made.items() if name in parameters}
    by_type = {preset.config_class: preset.inputs for preset in presets.PRESETS.values()
               if preset.kind == "multimodal"}
    make = by_type.get(type(model.config).__name__)
    if make is None:
        raise PrepareError(
            f"{type(model).__name__} takes images, and no processor came with it to make a sample prompt with an "
            "image from", model=type(model).__name__,
            remedy="put the model's processor files (processor_config.json or preprocessor_config.json, the tokenizer) "
            "in its folder, or export from Python with exporter.export(model, inputs) and the processor's inputs")
    return make(model.config)


def _model_class(spec: str, config: Any, trust_remote_code: bool) -> Any:
    """The class that loads `config`'s checkpoint: the transformers class its `architectures` name,
    else (with `trust_remote_code`) the auto class its `auto_map` maps to the repository's code."""
    import transformers

    architectures = getattr(config, "architectures", None) or []
    model_class = next((getattr(transformers, a) for a in architectures if hasattr(transformers, a)), None)
    if model_class is not None:
        return model_class
    auto_map = getattr(config, "auto_map", None) or {}
    if trust_remote_code:
        auto = next((getattr(transformers, key) for key in auto_map
                     if key.startswith("AutoModel") and hasattr(transformers, key)), None)
        if auto is not None:
            return auto
    raise PrepareError(
        f"{spec!r} names no model class transformers knows (architectures={architectures})",
        remedy="save the model with save_pretrained so config.json records its class"
        + ("" if trust_remote_code or not auto_map else ", or pass --trust-remote-code to run the "
           "repository's code its auto_map names"),
    )


def load_gguf(path: str | os.PathLike, gguf_file: str | None = None, *, prompt: str = "Hello, world!",
              revision: str | None = None, trust_remote_code: bool = False) -> LoadedModel:
    """Load the GGUF file `path` (or `gguf_file` in the folder or hub repo `path`) through
    transformers' GGUF support: the weights dequantized to float32, the tokenizer and chat template
    built from the file's metadata, and what the file held in `weights_from` (`gguf_weights`).

    A hub repo (`path` is no local folder, `gguf_file` given) is loaded as transformers loads one:
    `from_pretrained(repo, gguf_file=..., revision=...)`; its file is fetched (or found in the hub
    cache) with `huggingface_hub.hf_hub_download` first, to read its header.

    # NOTE: transformers 5.24 marks a GGUF-loaded model as quantized (`hf_quantizer`,
    # `config.quantization_config`) although its weights are plain dequantized tensors, and then
    # refuses `save_pretrained`; the config saved with an export would also name a GGUF file the
    # export does not hold. Both marks are dropped: the model is an ordinary float32 model.

    Raises:
        ImportError: `gguf` or `accelerate` is not installed (the message names the pip line).
        PrepareError: no such file, or transformers cannot load it (its own error, named).
    """
    from ._versions import require_extra

    hub = {"revision": revision, "trust_remote_code": bool(trust_remote_code)}
    if gguf_file is not None and not Path(path).is_dir():
        if Path(path).exists() or str(path).lower().endswith(".gguf") or str(path).startswith(("/", ".", "~")):
            raise PrepareError(f"--gguf-file names a file in a folder or hub repo, and {str(path)!r} is not a folder "
                               "(nor a hub repo id, ORG/NAME)",
                               remedy=f"pass the folder or hub repo (ORG/NAME) that holds {gguf_file}, or the .gguf "
                               "file's path alone")
        require_extra("gguf", purpose="loading a GGUF file")
        from .model_spec import hub_options

        folder, name = str(path), gguf_file
        offline = hub_options(folder, name, revision)  # from the hub cache alone where the hub cannot be reached
        hub.update(offline)
        source, file = f"{folder}/{name}", _hub_gguf(folder, name, revision, **offline)
    else:
        file = Path(path) / gguf_file if gguf_file is not None else Path(path)
        if not file.is_file():
            raise PrepareError(f"there is no GGUF file at {str(file)!r}", remedy="check the path (a .gguf file, or a "
                               "folder or hub repo and --gguf-file NAME)")
        require_extra("gguf", purpose="loading a GGUF file")
        source, folder, name = str(file), str(file.parent), file.name
    weights = gguf_weights(file)
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(folder, gguf_file=name, **hub)
        model_class = _class_of(config)
        model = model_class.from_pretrained(folder, gguf_file=name, dtype=torch.float32, **hub).eval()
    except (ValueError, KeyError, NotImplementedError) as error:
        raise PrepareError(
            f"transformers {transformers.__version__} cannot load {name} (architecture "
            f"{weights['architecture']!r}, {weights['quantization']}): {type(error).__name__}: {error}",
            remedy=f"transformers reads GGUF files of the architectures {', '.join(_gguf_architectures())}; "
            "export the model's transformers checkpoint (a folder with config.json) instead") from error
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer, missing = _tokenizer(folder, gguf_file=name, **hub)
    return LoadedModel(model, sample_inputs_for(model, tokenizer, prompt), source, tokenizer,
                       weights_from={**weights, "dequantized_to": "float32"}, tokenizer_missing=missing)


def _hub_gguf(repo: str, name: str, revision: str | None, **options: Any) -> Path:
    """The local path of the GGUF file `name` of the hub repo `repo` (downloaded, or from the cache;
    `options`: `local_files_only`, `model_spec.hub_options`)."""
    import huggingface_hub

    try:
        return Path(huggingface_hub.hf_hub_download(repo, name, revision=revision, **options))
    except (OSError, ValueError) as error:  # huggingface_hub's errors subclass these
        raise PrepareError(f"cannot fetch {name} from the hub repo {repo!r}"
                           f"{f' at revision {revision!r}' if revision else ''}: {str(error).splitlines()[0]}",
                           remedy="check the repo id and file name (and --revision), and that the hub is "
                           "reachable; or pass a local .gguf file") from error


def gguf_weights(file: str | os.PathLike) -> dict[str, Any]:
    """What the GGUF `file` holds, read from its header with the `gguf` package: `format`
    ("gguf"), `file`, `architecture`, `quantization` (llama.cpp's file type: `"Q4_1"`) and
    `tensor_types` (how many tensors of each type: `{"Q4_1": 210, "F32": 61, "Q8_0": 1}`)."""
    import collections

    import gguf

    reader = gguf.GGUFReader(str(file))

    def field(key: str) -> Any:
        found = reader.fields.get(key)
        return found.contents() if found is not None else None

    types = collections.Counter(tensor.tensor_type.name for tensor in reader.tensors)
    file_type = field("general.file_type")
    try:
        quantization = gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_") if file_type is not None else None
    except ValueError:  # a file type this gguf release does not name
        quantization = None
    if quantization is None:  # no (known) file type: the most common type of the quantized tensors
        quantized = [name for name, _ in types.most_common() if name not in ("F32", "F16", "BF16")]
        quantization = quantized[0] if quantized else (types.most_common(1)[0][0] if types else "none")
    return {"format": "gguf", "file": Path(file).name, "architecture": field("general.architecture"),
            "quantization": quantization, "tensor_types": dict(types.most_common())}


def _class_of(config: Any) -> Any:
    """The model class of a GGUF-loaded `config`: the one it names, else the auto class of its kind
    (transformers' GGUF configs name none for decoder-only models)."""
    import transformers

    for name in getattr(config, "architectures", None) or []:
        if hasattr(transformers, name):
            return getattr(transformers, name)
    if getattr(config, "is_encoder_decoder", False):
        return transformers.AutoModelForSeq2SeqLM
    return transformers.AutoModelForCausalLM


def _gguf_architectures() -> list[str]:
    """The GGUF architectures transformers loads (read from transformers 5.24's GGUF module)."""
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:
        return ["(see transformers' GGUF documentation)"]
    return sorted(GGUF_SUPPORTED_ARCHITECTURES)


def weight_bytes(model: torch.nn.Module) -> int:
    """The bytes of `model`'s parameters and buffers in their own dtypes: what an fp32 export's file
    holds besides its program (the report's `weight_bytes`, against which it weighs the artifact)."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def mapped_share(model: torch.nn.Module, folder: str | os.PathLike) -> float | None:
    """The share of `model`'s weight bytes whose memory is mapped from the safetensors files in
    `folder` (1.0: none was copied); None where the process's mappings cannot be read (no
    `/proc/self/maps`: not Linux).

    # NOTE: why it matters: `from_pretrained` (transformers 5.24) builds the model on the meta
    # device and, where a tensor's dtype is the checkpoint's, points it into the file mapped by
    # safetensors instead of reading it. Such weights cost no memory of their own: the kernel reads
    # their pages when touched and drops them under pressure, so an export that never copies them
    # (torch.export traces with fake tensors; ONNX and OpenVINO convert without copying) holds a
    # model larger than its memory (`bench/large_model.py`). A weight cast to another dtype is a
    # copy; the report says how much was (`weights_mapped`).
    """
    if not os.path.exists("/proc/self/maps"):
        return None
    files = {os.path.realpath(f) for f in map(str, Path(folder).glob("*.safetensors"))}
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() in files:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    seen, total, mapped = set(), 0, 0
    for tensor in model.state_dict(keep_vars=True).values():  # what a checkpoint holds (no inv_freq)
        pointer, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
        if pointer in seen or size == 0:
            continue
        seen.add(pointer)
        total += size
        mapped += size if any(start <= pointer and pointer + size <= end for start, end in ranges) else 0
    return mapped / total if total else 0.0


def _tiny_processor(spec: str) -> Any:
    """An image-text or speech preset's processor (`presets.tiny_processor`: its tokenizer, and its
    image processor and chat template or its feature extractor), or None: for the other presets, and
    without Pillow (logged: the export is the same, only `hfexport generate --image` needs it)."""
    from .presets import tiny_processor

    try:
        return tiny_processor(spec)
    except ImportError as error:
        import logging

        logging.getLogger("hfexport").warning("%s's processor needs Pillow (%s); the export holds none, so "
                                              "`hfexport generate --image` cannot read image files with it", spec, error)
        return None


def _processor(spec: str, config: Any, **kwargs: Any) -> Any:
    """The processor saved with an image-text or speech model `spec` (a folder with a processor's
    files, or a hub repo of a model with a `vision_config` or mel bins), or None. One transformers
    cannot build (Pillow missing, files it cannot read) is logged as a warning saying what its absence
    costs: the export is the same, only `hfexport generate --image` (`--audio`) needs the processor."""
    import logging

    from .folder.tokenizer_files import has_processor, processor_class

    if not (has_processor(spec) if os.path.isdir(spec) else
            hasattr(config, "vision_config") or hasattr(config, "num_mel_bins")):
        return None
    try:
        processor = processor_class(spec, **kwargs).from_pretrained(spec, **kwargs)
    except Exception as error:  # noqa: BLE001 - ImportError (Pillow), OSError (no such files on the hub),
        # ValueError (a config transformers cannot read): the export needs no processor, so it is logged and skipped
        logging.getLogger("hfexport").warning(
            "transformers could not load the processor of %s (%s: %s); the export holds none, so `hfexport generate "
            "--image` cannot read image files with it (--image-inputs FILE.npz still works)", spec,
            type(error).__name__, str(error).splitlines()[0] if str(error) else "")
        return None
    # an image processor (`generate --image`) or a speech feature extractor (`generate --audio`)
    return processor if hasattr(processor, "image_processor") or hasattr(processor, "feature_extractor") else None


def _tokenizer(spec: str, **kwargs: Any) -> tuple[Any, str | None]:
    """`(tokenizer, None)`: the tokenizer saved with `spec` (`kwargs` go to `from_pretrained`: a GGUF
    file's name, the revision); or `(None, why)`: a folder without tokenizer files has none, and a
    tokenizer transformers fails to build is logged as a warning, with what its absence costs."""
    import logging

    import transformers

    if "gguf_file" not in kwargs and os.path.isdir(spec) and not any(
        os.path.exists(os.path.join(spec, name)) for name in ("tokenizer.json", "tokenizer_config.json")
    ):
        return None, "no tokenizer files in the folder"
    try:
        return transformers.AutoTokenizer.from_pretrained(spec, **kwargs), None
    except Exception as error:  # noqa: BLE001 - the `tokenizers` library raises plain Exception for a file it
        # cannot parse; an export needs no tokenizer, so any failure is logged, reported and costs only text I/O
        why = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        name = kwargs.get("gguf_file") or spec
        logging.getLogger("hfexport").warning(
            "transformers could not load the tokenizer of %s (%s); the export holds no tokenizer: the sample "
            "inputs are made from the config, not from --prompt's text, and the export takes no --chat (nor "
            "`hfexport chat`) and no --prompt text in `hfexport generate`, only --prompt-ids", name, why)
        return None, why
