"""ExecuTorch's own `MultimodalRunner` run on an export folder's `multimodal.pte`, a processor's
`input_ids` and `pixel_values` in and token ids out, in a fresh process.

```python
from hfexport.backends.executorch.multimodal_runner import run_multimodal_runner
inputs = processor(images=image, text=prompt, return_tensors="pt")
ids = run_multimodal_runner("out/tiny-llava", inputs["input_ids"], inputs["pixel_values"], max_new_tokens=8)
```

# NOTE: the prompt goes in as `generate_hf` (executorch 1.4.1's `extension/llm/runner/__init__.py`)
# splits it: the ids before the one run of the image token, the image, the ids after (token
# inputs, so no tokenizer re-encodes them). Tokens come back as text pieces, so the runner decodes
# with a scratch tokenizer whose token i is one character (`text_runner.id_tokenizer`, and why
# a fresh process: `text_runner.py`'s notes); the folder's `tokenizer.json` is the user's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from .text_runner import FIRST_ID_CHAR, LOAD_RUNNER, id_tokenizer, vocab_size_of

__all__ = ["run_multimodal_runner", "split_prompt"]

#: Run in a fresh interpreter (the kernels and bindings loaded by path: `text_runner.LOAD_RUNNER`).
_SCRIPT = LOAD_RUNNER + """
program, tokenizer, pieces_file, pixels_file, new, data = sys.argv[1:7]
pixels = torch.load(pixels_file)
inputs = []
for kind, value in json.load(open(pieces_file)):
    inputs.append(llm.make_image_input(pixels) if kind == "image" else llm.make_token_input(value))
runner = llm.MultimodalRunner(program, tokenizer, data or None)
out = []
config = llm.GenerationConfig(echo=False, max_new_tokens=int(new), temperature=0.0, num_bos=0, num_eos=0)
runner.generate(inputs, config, token_callback=out.append)
print("RESULT " + json.dumps(out))
"""


def split_prompt(input_ids: Any, image_token_id: int) -> list[tuple[str, Any]]:
    """`[("tokens", ids before), ("image", None), ("tokens", ids after)]`: one prompt's ids around
    its one run of `image_token_id`, as `generate_hf` splits it (empty pieces left out).

    Raises:
        ValueError: the prompt has several sequences, or not exactly one run of the image token.
    """
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ValueError(f"MultimodalRunner generates one sequence; input_ids has {ids.shape[0]}: pass one prompt")
        ids = ids[0]
    ids = ids.tolist()
    where = [i for i, token in enumerate(ids) if token == image_token_id]
    if not where or where[-1] - where[0] + 1 != len(where):
        raise ValueError(f"MultimodalRunner takes one image, as one run of the image token {image_token_id}; "
                         f"the prompt has {len(where)} image tokens in {'no' if not where else 'several'} runs: "
                         "give the processor one image")
    pieces = [("tokens", ids[:where[0]]), ("image", None), ("tokens", ids[where[-1] + 1:])]
    return [(kind, value) for kind, value in pieces if kind == "image" or value]


def run_multimodal_runner(folder: str | Path, input_ids: Any, pixel_values: torch.Tensor,
                          max_new_tokens: int) -> list[int]:
    """Greedy token ids of `MultimodalRunner` on the folder's `multimodal.pte` for one prompt
    (`input_ids` with one run of the image token) and its image (`pixel_values` `[1, 3, H, W]`,
    the processor's); it stops at the program's end tokens (`get_eos_ids`).

    Raises:
        ExportFolderError: the folder's manifest is damaged, a listed file does not match it, it
            points outside the folder, or names a file it does not list (`manifest.ListedFiles`).
        RuntimeLoadError: the folder holds no `MultimodalRunner` program (why, from its
            manifest), or the runner failed.
    """
    from ...errors import RuntimeLoadError
    from ...folder.manifest import ListedFiles, parse_json, read_manifest, runtime_package
    from .multimodal import RUNNER

    folder = Path(folder)
    # a folder from elsewhere: its manifest checked, and the program, data file and config read
    # once, where it lists them, each checked as read; the runner (a C++ one, which opens files by
    # path) is given private copies of those bytes, so a file swapped in the folder after its
    # check is not what it reads
    manifest = read_manifest(folder, verify=False)
    entry = runtime_package(manifest, RUNNER)
    if entry is None or not entry["ready"]:
        why = (entry or {}).get("why") or "not an image-text export"
        raise RuntimeLoadError(f"{folder} is not a MultimodalRunner folder: {why}",
                               remedy="export a LLaVA model with --format executorch --generate")
    settings = entry["settings"]  # its program and data file listed, or `read_manifest` refused the folder
    listed = ListedFiles(folder, manifest)
    program_bytes = listed.read(settings["program"])
    data_bytes = listed.read(settings["data"]) if settings.get("data") else None
    config = listed.read("config.json")
    listed.check_others({settings["program"], settings.get("data"), "config.json"})
    pieces = split_prompt(input_ids, settings["image_token_id"])
    with tempfile.TemporaryDirectory(prefix="hfexport-runner-") as scratch:
        program, data = (Path(scratch) / name for name in ("model.pte", "model.ptd"))
        program.write_bytes(program_bytes.data)
        if data_bytes is not None:
            data.write_bytes(data_bytes.data)
        tokenizer, pieces_file, pixels_file = (Path(scratch) / name
                                               for name in ("tokenizer.json", "pieces.json", "pixels.pt"))
        tokenizer.write_text(json.dumps(id_tokenizer(vocab_size_of(parse_json(config.data, config.path))),
                                        ensure_ascii=False), encoding="utf-8")
        pieces_file.write_text(json.dumps(pieces))
        torch.save(pixel_values.detach().to(torch.float32).contiguous(), pixels_file)
        done = subprocess.run([sys.executable, "-c", _SCRIPT, str(program), str(tokenizer), str(pieces_file),
                               str(pixels_file), str(max_new_tokens), str(data) if data_bytes else ""],
                              capture_output=True, text=True, encoding="utf-8", timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeLoadError(f"ExecuTorch's MultimodalRunner failed on {folder / settings['program']} (exit "
                               f"{done.returncode}): {done.stderr.strip()[-1500:]}",
                               remedy="run the folder with hfexport generate to see whether its components run")
    tokens = [ord(c) - FIRST_ID_CHAR for c in "".join(json.loads(lines[-1].removeprefix("RESULT ")))]
    if any(t < 0 for t in tokens):
        raise RuntimeLoadError("MultimodalRunner's pieces are not the scratch tokenizer's tokens",
                               remedy="report this: the runner decoded tokens hfexport cannot read back")
    return tokens
