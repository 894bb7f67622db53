"""A tiny GGUF file written in the test: a random 2-layer Llama, quantized as llama.cpp would
(Q4_1 matrices, a Q8_0 embedding, the norms and the untied output in F32), with a byte-level BPE tokenizer and a ChatML chat
template in its metadata, the way `convert_hf_to_gguf.py` lays a Llama out. transformers loads it
with `from_pretrained(folder, gguf_file=...)` like any GGUF off a hub, so the GGUF path runs in the
default suite without a download.

The generation config's end token (`tokenizer.ggml.eos_token_id`) is `<|endoftext|>`, while the
chat template ends a turn with `<|im_end|>`: a chat stops at the latter only if the runner reads
it from the template. `write_chat_gguf` makes the model answer `FIRST_MESSAGE` with a few tokens
and then `<|im_end|>`, so a chat's stop at the end of a turn can be seen.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = ("h e", "l l", "Ġ t", "Ġ a", "i s", "e r", "o u", "Ġ w")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2


def _byte_level_tokens() -> list[str]:
    """Every byte spelled in GPT-2's byte alphabet (the tokens a byte-level BPE starts from)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            spelling[byte] = chr(byte)
        else:
            spelling[byte] = chr(256 + extra)
            extra += 1
    return [spelling[byte] for byte in range(256)]


def tokens() -> list[str]:
    """The vocabulary: the special tokens (ids 0-2), the 256 bytes, one token per merge."""
    return [*SPECIAL_TOKENS, *_byte_level_tokens(), *(merge.replace(" ", "") for merge in MERGES)]


def tiny_llama_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """The float weights of the tiny Llama, by GGUF tensor name (`[out, in]` matrices)."""
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS
    shapes = {"token_embd.weight": (len(tokens()), HIDDEN)}
    for layer in range(LAYERS):
        block = f"blk.{layer}"
        shapes.update({f"{block}.attn_norm.weight": (HIDDEN,), f"{block}.attn_q.weight": (HIDDEN, HIDDEN),
                       f"{block}.attn_k.weight": (KV_HEADS * head_dim, HIDDEN),
                       f"{block}.attn_v.weight": (KV_HEADS * head_dim, HIDDEN),
                       f"{block}.attn_output.weight": (HIDDEN, HIDDEN), f"{block}.ffn_norm.weight": (HIDDEN,),
                       f"{block}.ffn_gate.weight": (INTERMEDIATE, HIDDEN),
                       f"{block}.ffn_up.weight": (INTERMEDIATE, HIDDEN),
                       f"{block}.ffn_down.weight": (HIDDEN, INTERMEDIATE)})
    shapes.update({"output_norm.weight": (HIDDEN,), "output.weight": (len(tokens()), HIDDEN)})
    out = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            out[name] = np.ones(shape, dtype=np.float32)
        else:
            scale = 0.5 if name in ("token_embd.weight", "output.weight") else 0.25
            out[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
    return out


def _qtype(name: str):
    """llama.cpp's Q4_1 mix: Q4_1 matrices, a Q8_0 embedding, the norms and the output in F32."""
    import gguf

    if name.endswith("norm.weight") or name == "output.weight":
        return None
    return gguf.GGMLQuantizationType.Q8_0 if name == "token_embd.weight" else gguf.GGMLQuantizationType.Q4_1


def write_tiny_llama_gguf(path: str | Path, *, seed: int = 0, architecture: str = "llama",
                          tensors: dict[str, np.ndarray] | None = None) -> Path:
    """Write the tiny Llama GGUF to `path` (see the module docstring): `tensors` (default
    `tiny_llama_tensors(seed)`); `architecture` names another `general.architecture` (one
    transformers cannot load, for the error path)."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    vocab = tokens()
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-llama-chat")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(vocab))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab)
    writer.add_token_types([gguf.TokenType.CONTROL] * len(SPECIAL_TOKENS)
                           + [gguf.TokenType.NORMAL] * (len(vocab) - len(SPECIAL_TOKENS)))
    writer.add_token_merges(list(MERGES))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(0)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    for name, weight in (tensors if tensors is not None else tiny_llama_tensors(seed)).items():
        qtype = _qtype(name)
        if qtype is None:
            writer.add_tensor(name, weight)
        else:
            writer.add_tensor(name, gguf.quants.quantize(weight, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


FIRST_MESSAGE = "hello there"


def write_chat_gguf(path: str | Path, *, after: int = 3) -> Path:
    """Write the tiny Llama GGUF with its output row of `<|im_end|>` made a copy of the row of the
    token greedy decoding picks at step `after` of its answer to `FIRST_MESSAGE` (scaled up a
    little), so that the answer ends there with `<|im_end|>`. (The first write is loaded to find
    that token.)"""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = write_tiny_llama_gguf(path)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": FIRST_MESSAGE}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=after + 1, do_sample=False, eos_token_id=None,
                             output_logits=True, return_dict_in_generate=True)
    token = int(out.sequences[0, -1])
    assert token not in out.sequences[0, -after - 1:-1].tolist(), "pick another step: the token came earlier"
    tensors = tiny_llama_tensors()
    end = SPECIAL_TOKENS.index("<|im_end|>")
    tensors["output.weight"][end] = tensors["output.weight"][token] * (1.05 if out.logits[-1][0, token] > 0 else 0.95)
    return write_tiny_llama_gguf(path, tensors=tensors)
