"""ExecuTorch's own `TextLLMRunner` run on an export folder's LLM-runner program, token ids in
and out, in a fresh process (the export job's runner check, `RuntimePackage.run`).

# NOTE: why token ids through a tokenizer of our own rather than the folder's `tokenizer.json`.
# `TextLLMRunner` (executorch 1.4.1's `_llm_runner` bindings) takes text and hands back each
# token's decoded text, so with the model's tokenizer the runner's tokens are only known as text
# pieces (a byte-level piece may be half a character), and the prompt's ids depend on how its
# tokenizer library applies the model's BOS (the runner's `num_bos` on top). The check is about
# the program the runner loads, so it is given a tokenizer whose token i is the one character
# `chr(FIRST_ID_CHAR + i)`, written to a scratch folder: the prompt's ids (BOS included as the model's
# tokenizer put it, `num_bos=0`) go in exactly and each generated piece names its id. The folder's
# own `tokenizer.json` is the user's (written by `llm_export.runner_tokenizer`).

# NOTE: why a subprocess. ExecuTorch's runtime aborts the process on a program it cannot run
# (ET_CHECK), which would take the export with it; a fresh interpreter costs 1.7 s of CPU (importing
# torch and the llama:: kernels, `_SCRIPT`), measured on tiny:llama.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["FIRST_ID_CHAR", "run_text_llm_runner", "id_tokenizer", "vocab_size_of"]

#: token i of the scratch tokenizer is `chr(FIRST_ID_CHAR + i)`: the supplementary planes, one character
#: per id and no surrogates for any vocabulary under ~1M tokens
FIRST_ID_CHAR = 0x10000

#: Run in a fresh interpreter: the llama:: kernels' library, then the runner's bindings loaded by
#: path. NOTE: the two files' places are read from executorch 1.4.1's wheel
#: (`extension/llm/custom_ops/libcustom_ops_aot_lib.so`, `extension/llm/runner/_llm_runner*.so`);
#: importing them as `executorch.extension.llm.custom_ops.custom_ops` and
#: `executorch.extension.llm.runner` does the same but imports torchao and transformers on the way
#: (6.1 s of CPU against 1.7 s; tests/generation/test_runner_check.py runs this script).
#: (`LOAD_RUNNER` binds the bindings' module as `llm`; `multimodal_runner.py`'s script starts with it too.)
LOAD_RUNNER = """
import importlib.util, json, os, sys
root = importlib.util.find_spec("executorch").submodule_search_locations[0]
import torch
torch.ops.load_library(os.path.join(root, "extension", "llm", "custom_ops", "libcustom_ops_aot_lib.so"))
folder = os.path.join(root, "extension", "llm", "runner")
name = next(f for f in os.listdir(folder) if f.startswith("_llm_runner") and f.endswith(".so"))
spec = importlib.util.spec_from_file_location("executorch.extension.llm.runner._llm_runner", os.path.join(folder, name))
llm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(llm)
"""
_SCRIPT = LOAD_RUNNER + """
program, tokenizer, prompt, new, data = sys.argv[1:6]
pieces = []
runner = llm.TextLLMRunner(program, tokenizer, data or None)
config = llm.GenerationConfig(echo=False, max_new_tokens=int(new), temperature=0.0, num_bos=0, num_eos=0)
runner.generate(prompt, config, token_callback=pieces.append)
print("RESULT " + json.dumps(pieces))
"""


def run_text_llm_runner(folder: Path, request: Any) -> Any:
    """Greedy tokens of `TextLLMRunner` on the folder's `decode.pte` (and `decode.ptd`) for
    `request` (`RunnerRequest`); it stops at the program's end tokens (`get_eos_ids`).

    Raises:
        RunnerUnavailable: the folder holds the components rather than the LLM-runner program
            (why, from its manifest), or executorch's LLM runner is not installed.
        RuntimeLoadError: the runner failed or its tokens cannot be read back.
    """
    from ..._versions import installed_version, is_importable
    from ...errors import RuntimeLoadError
    from ...folder.package import RunnerTokens, RunnerUnavailable
    from ...folder.manifest import read_manifest, runtime_package
    from .llm_export import TEXT_RUNNER

    entry = runtime_package(read_manifest(folder, verify=False), TEXT_RUNNER)  # the folder this export just wrote
    if entry is None or "program" not in entry["settings"]:
        raise RunnerUnavailable((entry or {}).get("why") or "the folder holds no LLM-runner program")
    if not is_importable("executorch"):
        raise RunnerUnavailable("executorch is not installed: pip install 'hfexport[executorch]'", missing=True)
    data = entry["settings"].get("data")
    with tempfile.TemporaryDirectory(prefix="hfexport-runner-") as scratch:
        tokenizer = Path(scratch) / "tokenizer.json"
        tokenizer.write_text(json.dumps(id_tokenizer(vocab_size_of(folder)), ensure_ascii=False), encoding="utf-8")
        prompt = "".join(chr(FIRST_ID_CHAR + i) for i in request.prompt_ids)
        done = subprocess.run([sys.executable, "-c", _SCRIPT, str(folder / "decode.pte"), str(tokenizer), prompt,
                               str(request.max_new_tokens), str(folder / data) if data else ""],
                              capture_output=True, text=True, encoding="utf-8", timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeLoadError(f"ExecuTorch's TextLLMRunner failed on {folder / 'decode.pte'} (exit "
                               f"{done.returncode}): {done.stderr.strip()[-1500:]}",
                               remedy="run the folder with hfexport generate to see whether the program runs; "
                               "export with --no-validate to write it anyway")
    text = "".join(json.loads(lines[-1].removeprefix("RESULT ")))
    tokens = tuple(ord(c) - FIRST_ID_CHAR for c in text)
    if any(t < 0 for t in tokens):
        raise RuntimeLoadError(f"TextLLMRunner's pieces {text!r} are not the scratch tokenizer's tokens",
                               remedy="report this: the runner decoded tokens hfexport cannot read back")
    return RunnerTokens(tokens, f"executorch TextLLMRunner {installed_version('executorch')}")


def vocab_size_of(config: Path | dict[str, Any]) -> int:
    """The vocabulary of a model config (`config.json`'s content, or the folder holding it; the
    text config's)."""
    if not isinstance(config, dict):
        config = json.loads((config / "config.json").read_text())
    return int(config.get("vocab_size") or config.get("text_config", {})["vocab_size"])


def id_tokenizer(size: int) -> dict[str, Any]:
    """A Hugging Face `tokenizer.json` whose token i is the character `chr(FIRST_ID_CHAR + i)` (a BPE
    without merges, normalizer or pre-tokenizer: one character, one token)."""
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": None, "post_processor": None, "decoder": None,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {chr(FIRST_ID_CHAR + i): i for i in range(size)}, "merges": []}}
