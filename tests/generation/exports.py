"""Generation exports shared by several test packages (runner, static decode, declared shapes):
the cases, and how each is exported and saved. The session fixture `saved_generation` that makes
each one once lives in `tests/conftest.py`."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import torch

from hfexport import AutoExportConfig
from hfexport.job.export import GenerationOptions, LoadingOptions, export_to_folder
from hfexport.presets import build_preset, tiny_processor  # noqa: F401 - tests import it from here

MAX_CACHE_LEN = 32
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str):
    """The module `examples/<name>.py` (the seed's decode loops), imported by path."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

#: case -> (preset, static cache length or None). Static cases use multi-token decode (SPEC R8).
CASES = {
    "llama": ("llama", None),
    "llama-static": ("llama", MAX_CACHE_LEN),
    "mistral": ("mistral", None),  # sliding window 4 < prompt 8: the window matters
    "t5": ("t5", None),
    "qwen2_vl": ("qwen2_vl", None),  # image-text: tests/generation/test_multimodal_generate.py
    "llava": ("llava", None),
}
#: The image-text cases: they generate from an image (test_multimodal_generate.py), not from text alone.
IMAGE_CASES = ("qwen2_vl", "llava")
FORMATS = ["dynamo", "onnx", "openvino", "executorch"]


@dataclasses.dataclass
class SavedExport:
    directory: Path
    model: torch.nn.Module
    inputs: dict[str, Any]
    generation_config: Any
    processor: Any = None  # the processor saved with the export (`tiny_processor`), or None

    def eager(self, new_tokens: int):
        """Greedy `generate()` on the same prompt (no early stop): (new tokens, per-step logits)."""
        with torch.no_grad():
            out = self.model.generate(**self.inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                      do_sample=False, generation_config=self.generation_config,
                                      output_logits=True, return_dict_in_generate=True)
        start = 1 if self.model.config.is_encoder_decoder else self.inputs["input_ids"].shape[1]
        return out.sequences[0, start:].tolist(), list(out.logits)


def export_case(fmt: str, case: str, directory: Path) -> SavedExport:
    """Export `case` (a key of `CASES`) to `fmt` with `dynamic=True` and save it to `directory`
    by the export job as the CLI runs it: every component validated against eager and a packaged
    folder run in its runtime's own LLM runner (issue 50: with validation off, the Qwen2-VL
    OpenVINO folder these tests used was one `hfexport export` refused). A case with a tiny
    processor (`tiny_processor`) is exported with it, as a model folder holding one is: the folder
    carries it for `hfexport generate --image`."""
    from hfexport.loading import LoadedModel

    saved = saved_case(case, directory)
    preset, static = CASES[case]
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True})
    processor = saved.processor
    loaded = LoadedModel(saved.model, saved.inputs, preset, getattr(processor, "tokenizer", None), processor=processor)
    # llm_runner=False: the static cases are the static-cache components (the cache as method inputs, the
    # seed's decode loops); ExecuTorch's LLM-runner program, its default, is tests/generation/test_executorch_llm_runner.py's.
    # LLaVA keeps the default: its ExecuTorch folder also holds MultimodalRunner's program
    # (tests/backends/executorch/test_multimodal.py), beside the components the other tests run
    export_to_folder(loaded, config, directory, generation=GenerationOptions(generate=True, static_cache=static),
                     llm_runner=None if case == "llava" else False)
    return saved


def saved_case(case: str, directory: Path) -> SavedExport:
    """`case`'s export in `directory` with what the tests compare it to: a fresh build of its preset
    (seeded: the weights it was exported from), the prompt, the generation config and the processor."""
    preset, static = CASES[case]
    model, inputs = build_preset(preset)
    inputs = {k: v for k, v in inputs.items() if not k.startswith("decoder_")}
    return SavedExport(directory, model, inputs, _generation_config(static), tiny_processor(case))


def _generation_config(static: int | None) -> Any:
    from transformers import GenerationConfig

    return GenerationConfig(cache_implementation="static", max_cache_len=static) if static else None


#: The LLM packages' prompt: 8 tokens of `harness.tiny_bpe_tokenizer`, longer than the windowed presets' 4.
LLM_PROMPT = "once upon a time there was a model"
#: The LLM packages' chat template (`hfexport chat` on them): each turn between `<s>` and `</s>` (its EOS)
LLM_CHAT_TEMPLATE = ("{% for message in messages %}<s>{{ message['role'] }}\n{{ message['content'] }}</s>\n"
                     "{% endfor %}{% if add_generation_prompt %}<s>assistant\n{% endif %}")
LLM_CACHE = 64
#: runtime -> (the modules its export and vendor runner import, the CLI's package flags as job options:
#: `-f onnx --generate --multi-token-decode --static-cache 64`, `-f openvino --generate`,
#: `-f executorch --generate --static-cache 64`)
LLM_RUNTIMES = {
    "onnx": (("onnxscript", "onnxruntime", "onnxruntime_genai"),
             GenerationOptions(task="auto", static_cache=LLM_CACHE)),
    "openvino": (("openvino", "openvino_genai", "openvino_tokenizers"),
                 GenerationOptions(task="auto", static_cache=LLM_CACHE)),
    "executorch": (("executorch",), GenerationOptions(task="auto", static_cache=LLM_CACHE)),
}


@dataclasses.dataclass
class LlmPackage:
    """A runtime's LLM package of a tiny preset saved with the tiny tokenizer."""

    folder: Path
    manifest: dict[str, Any]
    model: torch.nn.Module
    tokenizer: Any
    ids: torch.Tensor  # `LLM_PROMPT`'s ids

    def eager(self, new_tokens: int, *, stop_at_eos: bool = False) -> list[int]:
        """Eager `generate`'s greedy new tokens on the prompt: `new_tokens` of them, or up to and
        with the first EOS where `stop_at_eos` (as the vendors' runners stop)."""
        least = None if stop_at_eos else new_tokens
        with torch.no_grad():
            out = self.model.generate(self.ids, attention_mask=torch.ones_like(self.ids), max_new_tokens=new_tokens,
                                      min_new_tokens=least, do_sample=False)
        return out[0, self.ids.shape[1]:].tolist()


def export_llm_package(name: str, runtime: str, directory: Path, **overrides: Any) -> LlmPackage:
    """Save preset `name` (its vocabulary resized to the tiny tokenizer's, its config updated with
    `overrides`) with that tokenizer and `LLM_CHAT_TEMPLATE`, as transformers saves a model, and export its `runtime`
    package from that folder by the CLI's job with the CLI's package flags (`LLM_RUNTIMES`) into
    `directory / "out"`."""
    from hfexport.presets import build_preset, tiny_processor  # noqa: F401 - tests import it from here
    from tests.harness import tiny_bpe_tokenizer

    tokenizer = tiny_bpe_tokenizer()
    tokenizer.chat_template = LLM_CHAT_TEMPLATE
    model, _ = build_preset(name, vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=1, **overrides)
    model.save_pretrained(directory / "source")
    tokenizer.save_pretrained(directory / "source")
    config = AutoExportConfig.from_dict({"export_format": runtime, "dynamic": True})
    result = export_to_folder(str(directory / "source"), config, directory / "out",
                              loading=LoadingOptions(prompt=LLM_PROMPT), generation=LLM_RUNTIMES[runtime][1])
    ids = tokenizer(LLM_PROMPT, return_tensors="pt").input_ids
    return LlmPackage(directory / "out", result.manifest, model, tokenizer, ids)


#: The `cli_generation_exports` key of `tiny:whisper`'s flagless export (its speech package), which
#: tests/generation/test_audio.py and tests/backends/openvino/test_whisper.py read.
SPEECH_PACKAGE = "speech-package"


def cli_generation_exports(shared_folder: Any, preset: str, key: str, *, generate: bool = True) -> Any:
    """`get(fmt)`: `hfexport export tiny:<preset> -f fmt --generate -o OUT` in a new process (without
    `--generate` where `generate` is false: the flagless export), made once per test run
    (`shared_folder`, under `<key>-<fmt>`), skipped where the format or soundfile is missing."""
    import subprocess
    import sys

    import pytest

    from tests.harness import require_backend

    flags = ["--generate"] if generate else []

    def write(fmt: str, folder: Path) -> None:
        done = subprocess.run([sys.executable, "-m", "hfexport", "export", f"tiny:{preset}", "-f", fmt, *flags,
                               "-o", str(folder / "export")], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]

    def get(fmt: str) -> Path:
        require_backend(fmt)
        pytest.importorskip("soundfile")
        return shared_folder(f"{key}-{fmt}", lambda folder: write(fmt, folder)) / "export"

    return get
