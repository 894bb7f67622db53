"""`bench/whisper_formats.py`, the speech bench's Whisper converters, on a tiny random Whisper built
offline: CTranslate2's `model.bin` written and read back gives the model's weights (q/k/v unfused,
the key bias dropped), and the ggml file holds every tensor under OpenAI's names with its values."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import whisper_formats  # noqa: E402


@pytest.fixture(scope="module")
def model():
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    config = WhisperConfig(vocab_size=300, num_mel_bins=8, d_model=16, encoder_layers=2, decoder_layers=1,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                           decoder_ffn_dim=32, max_source_positions=12, max_target_positions=10,
                           decoder_start_token_id=257, eos_token_id=256, pad_token_id=256, bos_token_id=257)
    return WhisperForConditionalGeneration(config).eval()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_ct2_round_trip(model, tmp_path, dtype):
    path = tmp_path / "model.bin"
    whisper_formats.write_ct2(model, path, dtype=dtype)
    variables, header = whisper_formats.read_ct2(path)
    assert header == {"spec": "WhisperSpec", "revision": 3}
    assert variables["decoder/layer_0/self_attention/linear_0/weight"].shape == (3 * 16, 16)  # q, k, v fused
    state = whisper_formats.ct2_state_dict(variables, model.config)
    want = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    assert sorted(state) == sorted(want)
    tolerance = 0 if dtype == "float32" else 2e-3
    for name, array in want.items():
        np.testing.assert_allclose(state[name], array, atol=tolerance, rtol=tolerance, err_msg=name)


def test_ct2_int8_dequantized(tmp_path):
    """An int8 weight with its per-row `_scale` (CTranslate2's int8 layout) reads back as int8 / scale."""
    weight = np.array([[127, -64], [10, 0]], np.int8)
    scale = np.array([127.0, 5.0], np.float32)
    path = tmp_path / "model.bin"
    with path.open("wb") as out:
        def string(value):
            out.write(struct.pack("<H", len(value) + 1) + value.encode() + b"\0")

        out.write(struct.pack("<I", 6))
        string("WhisperSpec")
        out.write(struct.pack("<II", 3, 2))
        for name, array, dtype_id in (("w/weight", weight, 1), ("w/weight_scale", scale, 0)):
            string(name)
            out.write(struct.pack("<B", array.ndim) + struct.pack(f"<{array.ndim}I", *array.shape))
            out.write(struct.pack("<BI", dtype_id, array.nbytes) + array.tobytes())
        out.write(struct.pack("<I", 0))
    variables, _ = whisper_formats.read_ct2(path)
    np.testing.assert_allclose(variables["w/weight"], [[1.0, -64 / 127], [2.0, 0.0]])
    assert "w/weight_scale" not in variables


def _read_ggml(path: Path) -> tuple[list[int], np.ndarray, list[bytes], dict[str, np.ndarray]]:
    data, pos = path.read_bytes(), 0

    def take(fmt):
        nonlocal pos
        values = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return values

    hparams = list(take("12i"))
    rows, cols = take("2i")
    filters = np.frombuffer(data, np.float32, rows * cols, pos).reshape(rows, cols)
    pos += 4 * rows * cols
    vocab = []
    for _ in range(take("i")[0]):
        (length,) = take("i")
        vocab.append(data[pos:pos + length])
        pos += length
    tensors = {}
    while pos < len(data):
        n_dims, length, ftype = take("3i")
        shape = take(f"{n_dims}i")[::-1]
        name = data[pos:pos + length].decode()
        pos += length
        dtype = np.float16 if ftype == 1 else np.float32
        count = int(np.prod(shape))
        tensors[name] = np.frombuffer(data, dtype, count, pos).reshape(shape)
        pos += count * np.dtype(dtype).itemsize
    return hparams, filters, vocab, tensors


def test_ggml_file(model, tmp_path):
    from transformers import WhisperFeatureExtractor

    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    WhisperFeatureExtractor(feature_size=8).save_pretrained(folder)
    vocab = {"a": 0, "\u0120b": 1, "\u010a": 2}  # byte-level: "Ġ" is a space, "Ċ" a newline
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}}))
    hparams, filters, tokens, tensors = _read_ggml(whisper_formats.write_ggml(folder, tmp_path / "ggml.bin"))
    assert hparams == [0x67676D6C, 300, 12, 16, 2, 2, 10, 16, 2, 1, 8, 1]
    assert filters.shape == (8, 201)
    assert tokens == [b"a", b" b", b"\n"]
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    assert len(tensors) == len(state) - 1  # the tied output projection is not written
    assert tensors["encoder.blocks.1.attn.key.weight"].dtype == np.float16
    assert "decoder.blocks.0.cross_attn.key.weight" in tensors and "decoder.blocks.0.attn.key.bias" not in tensors
    for name, array in state.items():
        if name == "proj_out.weight":
            continue
        got = tensors[whisper_formats.ggml_name(name)]
        np.testing.assert_allclose(got.astype(np.float32).reshape(array.shape), array, atol=2e-3, err_msg=name)
    assert tensors["encoder.conv1.bias"].shape == (16, 1)
    assert tensors["encoder.positional_embedding"].dtype == np.float32
