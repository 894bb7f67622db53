"""The deploy pages' code runs: each page's export command has the flags the package is made with,
and its Python block, run as written in a fresh process on a tiny Llama's package (the page's
folder name and prompt replaced by the test's), gives eager `generate`'s greedy tokens.

The tiny package carries a tokenizer (`harness.tiny_bpe_tokenizer`), so the blocks' text prompts
run as written; only the folder and the prompt's words change.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.generation.exports import LLM_PROMPT

pytestmark = pytest.mark.slow  # exports a tiny Llama to each runtime (shared with tests/generation/test_llm_package.py)

DEPLOY = Path(__file__).resolve().parents[1] / "docs" / "deploy"
#: the prompt the pages use, and how many new tokens their blocks ask for
PAGE_PROMPT, PAGE_NEW_TOKENS = "The capital of France is", 16
#: page -> (runtime, the page's folder name, the page's flags beside `-f <format>` (none: a causal LM's
#: package is the default, `--task auto`), the variable its block leaves)
PAGES = {
    "onnxruntime-genai.md": ("onnx", "smollm2-genai", "", "tokens"),
    "openvino-genai.md": ("openvino", "smollm2-ov", "", "tokens"),
    "executorch.md": ("executorch", "smollm2-et", "", "pieces"),
}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _blocks(page: str, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall((DEPLOY / page).read_text()) if lang == language]


def test_every_deploy_page_is_tested_and_linked():
    """Each page under docs/deploy/ is one of `PAGES`, and the README links every one."""
    assert sorted(p.name for p in DEPLOY.glob("*.md")) == sorted(PAGES)
    readme = (DEPLOY.parents[1] / "README.md").read_text()
    assert all(f"docs/deploy/{page}" in readme for page in PAGES)


@pytest.mark.parametrize("page", list(PAGES))
def test_the_page_exports_with_the_packages_flags(page):
    """The page's `hfexport export` writes its folder name with the flags the test's package has:
    none, the one command a user runs for the runtime's LLM package."""
    runtime, folder, flags, _ = PAGES[page]
    commands = [line for block in _blocks(page, "bash") for line in block.splitlines()
                if line.startswith("hfexport export")]
    assert len(commands) == 1, commands
    words = commands[0].split()
    assert words[3:] == ["-f", runtime, *flags.split(), "-o", folder], commands[0]


@pytest.mark.parametrize("page", list(PAGES))
def test_the_pages_python_gives_eagers_tokens(llm_package, page):
    """The page's Python block, on the tiny Llama's package, in a fresh process: greedy tokens
    (ExecuTorch's runner: text pieces) equal to eager `generate`'s, which stops at EOS as they do."""
    runtime, folder, _, result = PAGES[page]
    (block,) = _blocks(page, "python")
    assert folder in block and f'"{PAGE_PROMPT}"' in block and str(PAGE_NEW_TOKENS) in block
    package = llm_package("llama", runtime)
    code = block.replace(folder, str(package.folder)).replace(PAGE_PROMPT, LLM_PROMPT)
    code += f"\nimport json\nprint('RESULT ' + json.dumps([t if isinstance(t, str) else int(t) for t in {result}]))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-2000:]
    got = json.loads(lines[-1].removeprefix("RESULT "))
    eager = package.eager(PAGE_NEW_TOKENS, stop_at_eos=True)
    assert got == (eager if result == "tokens" else [package.tokenizer.decode([token]) for token in eager])
