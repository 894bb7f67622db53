"""ExecuTorch's own `MultimodalRunner` run on an export folder's `multimodal.pte`, a processor's
`input_ids` and its image (`pixel_values`) or clip (`input_features`) in, token ids out, in a fresh
process.

```python
from hfexport.backends.executorch.multimodal_runner import run_multimodal_runner
inputs = processor(images=image, text=prompt, return_tensors="pt")
ids = run_multimodal_runner("out/tiny-llava", inputs["input_ids"], inputs["pixel_values"], max_new_tokens=8)
inputs = processor(text=[prompt], audio=[clip], sampling_rate=16000, return_tensors="pt")  # a clip filling the chunk
ids = run_multimodal_runner("out/tiny-qwen2-audio", inputs["input_ids"], inputs["input_features"], 8,
                            frame_mask=inputs["feature_attention_mask"])
```

# NOTE: the prompt goes in as `generate_hf` (executorch 1.4.1's `extension/llm/runner/__init__.py`)
# splits it: the ids before the one run of the image (audio) token, the image (`make_image_input`)
# or clip (`make_audio_input`, the features as the processor gave them), the ids after (token
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

__all__ = ["run_multimodal_runner", "run_multimodal_request", "split_prompt"]

#: Run in a fresh interpreter (the kernels and bindings loaded by path: `text_runner.LOAD_RUNNER`).
_SCRIPT = LOAD_RUNNER + """
program, tokenizer, pieces_file, media_file, new, data = sys.argv[1:7]
media = torch.load(media_file)
make = {"image": llm.make_image_input, "audio": llm.make_audio_input}
inputs = []
for kind, value in json.load(open(pieces_file)):
    inputs.append(make[kind](media) if kind in make else llm.make_token_input(value))
runner = llm.MultimodalRunner(program, tokenizer, data or None)
out = []
config = llm.GenerationConfig(echo=False, max_new_tokens=int(new), temperature=0.0, num_bos=0, num_eos=0)
runner.generate(inputs, config, token_callback=out.append)
print("RESULT " + json.dumps(out))
"""


def split_prompt(input_ids: Any, token_id: int, kind: str = "image") -> list[tuple[str, Any]]:
    """`[("tokens", ids before), (kind, None), ("tokens", ids after)]`: one prompt's ids around
    its one run of `token_id` (the image or audio placeholder), as `generate_hf` splits it (empty
    pieces left out).

    Raises:
        ValueError: the prompt has several sequences, or not exactly one run of the token.
    """
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ValueError(f"MultimodalRunner generates one sequence; input_ids has {ids.shape[0]}: pass one prompt")
        ids = ids[0]
    ids = ids.tolist()
    where = [i for i, token in enumerate(ids) if token == token_id]
    if not where or where[-1] - where[0] + 1 != len(where):
        what = "clip" if kind == "audio" else kind
        raise ValueError(f"MultimodalRunner takes one {what}, as one run of the {kind} token {token_id}; "
                         f"the prompt has {len(where)} {kind} tokens in {'no' if not where else 'several'} runs: "
                         f"give the processor one {what}")
    pieces = [("tokens", ids[:where[0]]), (kind, None), ("tokens", ids[where[-1] + 1:])]
    return [(piece, value) for piece, value in pieces if piece == kind or value]


def run_multimodal_runner(folder: str | Path, input_ids: Any, media: torch.Tensor, max_new_tokens: int, *,
                          frame_mask: Any = None) -> list[int]:
    """Greedy token ids of `MultimodalRunner` on the folder's `multimodal.pte` for one prompt
    (`input_ids` with one run of the image or audio token) and its image (`pixel_values`
    `[1, 3, H, W]`) or clip (`input_features` `[1, bins, frames]`), as the processor gave them;
    it stops at the program's end tokens (`get_eos_ids`).

    Args:
        frame_mask: a clip's per-frame mask from the processor (`feature_attention_mask`), checked
            to hold no padding: the program serves a clip filling the feature extractor's chunk.

    Raises:
        ExportFolderError: the folder's manifest is damaged, a listed file does not match it, it
            points outside the folder, or names a file it does not list (`manifest.ListedFiles`).
        RuntimeLoadError: the folder holds no `MultimodalRunner` program (why, from its
            manifest), or the runner failed.
        PrepareError: a clip other than the program's: features of another shape, padding in
            `frame_mask`, or another number of audio tokens than the program's rows.
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
        why = (entry or {}).get("why") or "not an image-text or audio-text export"
        raise RuntimeLoadError(f"{folder} is not a MultimodalRunner folder: {why}",
                               remedy="export a LLaVA or Qwen2-Audio model with --format executorch --generate")
    settings = entry["settings"]  # its program and data file listed, or `read_manifest` refused the folder
    listed = ListedFiles(folder, manifest)
    program_bytes = listed.read(settings["program"])
    data_bytes = listed.read(settings["data"]) if settings.get("data") else None
    config = listed.read("config.json")
    listed.check_others({settings["program"], settings.get("data"), "config.json"})
    kind = "audio" if "audio" in settings else "image"
    pieces = split_prompt(input_ids, settings[f"{kind}_token_id"], kind)
    if kind == "audio":
        _check_clip(settings, media, input_ids, frame_mask)
    with tempfile.TemporaryDirectory(prefix="hfexport-runner-") as scratch:
        program, data = (Path(scratch) / name for name in ("model.pte", "model.ptd"))
        program.write_bytes(program_bytes.data)
        if data_bytes is not None:
            data.write_bytes(data_bytes.data)
        tokenizer, pieces_file, media_file = (Path(scratch) / name
                                              for name in ("tokenizer.json", "pieces.json", "media.pt"))
        tokenizer.write_text(json.dumps(id_tokenizer(vocab_size_of(parse_json(config.data, config.path))),
                                        ensure_ascii=False), encoding="utf-8")
        pieces_file.write_text(json.dumps(pieces))
        torch.save(torch.as_tensor(media).detach().to(torch.float32).contiguous(), media_file)
        done = subprocess.run([sys.executable, "-c", _SCRIPT, str(program), str(tokenizer), str(pieces_file),
                               str(media_file), str(max_new_tokens), str(data) if data_bytes else ""],
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


def _check_clip(settings: dict[str, Any], features: Any, input_ids: Any, frame_mask: Any) -> None:
    """Refuse a clip the program does not serve (`multimodal.py`'s note on audio): it takes the
    features of one clip filling the chunk, and writes all its rows over the prompt's audio tokens."""
    from ...errors import PrepareError

    audio = settings["audio"]
    chunk = f"the chunk ({audio['seconds']} s)" if audio.get("seconds") else "the feature extractor's chunk"
    remedy = (f"pad the clip with silence to {chunk} before the processor, or run the folder with hfexport generate "
              "--audio, which takes any clip up to the chunk")
    shape = list(torch.as_tensor(features).shape)
    if shape != audio["shape"]:
        raise PrepareError(f"the program's audio_encoder takes input_features of shape {audio['shape']} (one clip "
                           f"filling {chunk}); these are {shape}", remedy=remedy)
    if frame_mask is not None and not bool(torch.as_tensor(frame_mask).all()):
        heard = int(torch.as_tensor(frame_mask).sum())
        raise PrepareError(f"the clip fills {heard} of the {shape[-1]} frames of {chunk}: MultimodalRunner passes "
                           "audio_encoder no mask, so the program serves a clip filling the chunk", remedy=remedy)
    placeholders = int((torch.as_tensor(input_ids) == settings["audio_token_id"]).sum())
    if placeholders != audio["rows"]:
        raise PrepareError(f"the prompt has {placeholders} audio tokens and the program's audio_encoder gives "
                           f"{audio['rows']} rows (a clip filling {chunk})", remedy=remedy)


def run_multimodal_request(folder: Path, request: Any) -> Any:
    """`MultimodalRunner`'s greedy tokens for the export job's runner check (`RuntimePackage.run`):
    the request's prompt ids with the processor's image or clip (`RunnerRequest.inputs`).

    Raises:
        RunnerUnavailable: the folder is no `MultimodalRunner` folder (why, from its manifest),
            executorch is not installed, or the request holds no image or clip for the program.
        RuntimeLoadError: the runner failed (`run_multimodal_runner`).
        PrepareError: a clip the program does not serve (`run_multimodal_runner`).
    """
    from ..._versions import installed_version, is_importable
    from ...folder.manifest import read_manifest, runtime_package
    from ...folder.package import RunnerTokens, RunnerUnavailable
    from ...generation.audio_tower import frame_mask_name
    from .multimodal import RUNNER

    entry = runtime_package(read_manifest(folder, verify=False), RUNNER)  # the folder this export just wrote
    if entry is None or not entry["ready"]:
        raise RunnerUnavailable((entry or {}).get("why") or "the folder holds no MultimodalRunner program")
    if not is_importable("executorch"):
        raise RunnerUnavailable("executorch is not installed: pip install 'hfexport[executorch]'", missing=True)
    settings = entry["settings"]
    kind = "audio" if "audio" in settings else "image"
    name, inputs = settings[kind]["input"], dict(request.inputs or {})
    if name not in inputs:
        raise RunnerUnavailable(f"the request holds no {name}, which the program's {kind} method takes")
    mask = frame_mask_name(inputs)
    tokens = run_multimodal_runner(folder, list(request.prompt_ids), inputs[name], request.max_new_tokens,
                                   frame_mask=inputs.get(mask) if mask else None)
    return RunnerTokens(tuple(tokens), f"executorch MultimodalRunner {installed_version('executorch')}")
