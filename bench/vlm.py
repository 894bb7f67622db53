"""Benchmark: an image-text model from an image file, eager against each export and the vendor's VLM runner.

    python bench/vlm.py --root /tmp/vlm                               # onnx, openvino, dynamo
    python bench/vlm.py --root /tmp/vlm --formats openvino,executorch --markdown out.md

Issue 42 asks for image encoding and time to first token measured against eager and against the
vendor's runner on the same folder, decode as the text LLM's. The model is a random LLaVA of a
small real shape (`SIZES`: a CLIP ViT-S/14 tower at 224x224, 256 patches; an 8-layer Llama of
hidden 512, vocabulary 8192) saved with its processor (CLIP image processor, a BPE tokenizer with
`<image>`, a chat template), exported with the CLI (`hfexport export SRC -f F --generate -o OUT`),
one fresh process per format. Each process times, after one warm-up, the best of `--rounds`
interleaved rounds on one 224x224 PNG and one prompt (16 new tokens, greedy):

- `encode ms`: the image features the language model reads (tower + projector): eager
  `model.get_image_features`, hfexport's `ImagePrefill.image_features` on the processor's
  `pixel_values`;
- `TTFT ms`: from the processor's inputs to the first new token (eager `generate` with one new
  token; `GenerationResult.time_to_first_token_s`; VLMPipeline's `perf_metrics.get_ttft()`, which
  includes its own image preprocessing);
- `decode tok/s`: from the second new token on;
- `same ids`: the 16 tokens equal eager `generate`'s (VLMPipeline's: eager's on the prompt as
  VLMPipeline lays it out, which takes no chat template here).

Eager runs in each format's process beside the export (2 threads: `torch.set_num_threads`, the
runtimes' own thread settings as the runner leaves them, `INFERENCE_NUM_THREADS=2` for
VLMPipeline), so each row's ratios are measured side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

THREADS, ROUNDS, NEW_TOKENS, IMAGE_TOKEN = 2, 3, 16, 8000
SIZES = {
    "vision": dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=6,
                   image_size=224, patch_size=14),
    "text": dict(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                 num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048, bos_token_id=0,
                 eos_token_id=1, pad_token_id=0),
}
PROMPT = "Describe this image in a few words."
TEMPLATE = ("{% for message in messages %}{{ message['role'] | upper }}: {% if message['content'] is string %}"
            "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
            "<image>\n{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %} {% endfor %}"
            "{% if add_generation_prompt %}ASSISTANT:{% endif %}")
VENDOR = {"openvino": "VLMPipeline"}


def source_folder(root: Path) -> Path:
    """The random LLaVA with its processor, saved as transformers saves them (made once under `root`)."""
    folder = root / "random-llava"
    if (folder / "config.json").exists():
        return folder
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (CLIPImageProcessorPil, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor, PreTrainedTokenizerFast)

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = ["describe this image in a few words", "a photo of a cat on a mat", "what is in the picture"] * 20
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.add_special_tokens([f"<unused{i}>" for i in range(IMAGE_TOKEN - tokenizer.get_vocab_size())] + ["<image>"])
    made = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
    assert made.convert_tokens_to_ids("<image>") == IMAGE_TOKEN
    vision = SIZES["vision"]
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessorPil(size={"shortest_edge": vision["image_size"]},
                                              crop_size={"height": vision["image_size"], "width": vision["image_size"]}),
        tokenizer=made, patch_size=vision["patch_size"], vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=TEMPLATE)
    torch.manual_seed(0)
    config = LlavaConfig(vision_config=CLIPVisionConfig(**vision), text_config=LlamaConfig(**SIZES["text"]),
                         image_token_index=IMAGE_TOKEN, vision_feature_layer=-1)
    LlavaForConditionalGeneration(config).eval().save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def image_file(root: Path) -> Path:
    path = root / "image.png"
    if not path.exists():
        import numpy as np
        from PIL import Image

        Image.fromarray(np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)).save(path)
    return path


def export(source: Path, fmt: str, out: Path) -> float:
    """`hfexport export SOURCE -f FMT --generate -o OUT` once (kept under the root); its wall seconds."""
    if (out / "manifest.json").exists():
        return float("nan")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hfexport", "export", str(source), "-f", fmt, "--generate", "-o", str(out),
                    "--no-validate"], check=True)
    return time.perf_counter() - start


def _best(runs: dict, rounds: int) -> tuple[dict, dict]:
    for run in runs.values():  # warm-up
        run()
    times: dict[str, list] = {key: [] for key in runs}
    for _ in range(rounds):
        for key, run in runs.items():
            times[key].append(run())
    return {key: {m: (max if m == "tok_s" else min)(r[m] for r in rows) for m in rows[0] if m != "tokens"}
            for key, rows in times.items()}, {key: rows[-1]["tokens"] for key, rows in times.items()}


def run_one(fmt: str, source: Path, folder: Path, image: Path, rounds: int) -> dict:
    """The side-by-side measurement of one folder, in this (fresh) process."""
    import torch
    from PIL import Image
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from hfexport import GenerationRunner
    from hfexport.generation.image_input import image_prompt_inputs

    torch.set_num_threads(THREADS)
    model = LlavaForConditionalGeneration.from_pretrained(source).eval()
    processor = AutoProcessor.from_pretrained(source)
    with Image.open(image) as opened:
        picture = opened.convert("RGB")
    inputs = image_prompt_inputs(processor, picture, PROMPT)

    def eager():
        with torch.no_grad():
            start = time.perf_counter()
            model.get_image_features(pixel_values=inputs["pixel_values"])
            encode = time.perf_counter() - start
            start = time.perf_counter()
            model.generate(**inputs, max_new_tokens=1, do_sample=False)
            ttft = time.perf_counter() - start
            start = time.perf_counter()
            out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
            whole = time.perf_counter() - start
        return {"encode_ms": encode * 1e3, "ttft_ms": ttft * 1e3, "tok_s": (NEW_TOKENS - 1) / (whole - ttft),
                "tokens": out[0, inputs["input_ids"].shape[1]:].tolist()}

    runner = GenerationRunner.load(folder)

    def ours():
        start = time.perf_counter()
        runner.image_prefill.image_features({"pixel_values": inputs["pixel_values"]})
        encode = time.perf_counter() - start
        result = runner.generate_from_image(picture, PROMPT, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
        return {"encode_ms": encode * 1e3, "ttft_ms": result.time_to_first_token_s * 1e3,
                "tok_s": result.tokens_per_s, "tokens": result.tokens}

    runs = {"eager": eager, "ours": ours}
    expected = {}
    if fmt == "openvino":
        runs["vendor"] = vlm_pipeline(folder, picture)
        # VLMPipeline 2026.4.1 lays LLaVA's prompt out itself (no chat template here): `<image>` once per
        # feature, then "\n", then the text (tests/backends/openvino/test_vlm.py); eager on that layout
        features = (SIZES["vision"]["image_size"] // SIZES["vision"]["patch_size"]) ** 2
        ids = processor.tokenizer("<image>" * features + "\n" + PROMPT, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=inputs["pixel_values"],
                                 max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        expected["vendor"] = out[0, ids.shape[1]:].tolist()
    best, tokens = _best(runs, rounds)
    return {"format": fmt, "best": {k: {m: round(v, 2) for m, v in row.items()} for k, row in best.items()},
            "same_ids": {k: tokens[k] == expected.get(k, tokens["eager"]) for k in tokens},
            "load": round(os.getloadavg()[0], 1)}


def vlm_pipeline(folder: Path, picture):
    """OpenVINO GenAI's `VLMPipeline` on the folder with the properties its manifest entry names, 2 threads."""
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    from hfexport.folder.manifest import read_manifest, runtime_package

    entry = runtime_package(read_manifest(folder), "VLMPipeline") or {"ready": False, "why": "no VLMPipeline entry"}
    if not entry["ready"]:
        raise SystemExit(f"{folder} is no VLMPipeline folder: {entry['why']}")
    pipe = ov_genai.VLMPipeline(str(folder), "CPU", INFERENCE_NUM_THREADS=THREADS, **entry["settings"]["properties"])
    config = ov_genai.GenerationConfig()
    config.max_new_tokens = config.min_new_tokens = NEW_TOKENS
    config.do_sample, config.ignore_eos, config.apply_chat_template = False, True, False
    tensor = ov.Tensor(np.asarray(picture, np.uint8)[None])

    class Ids(ov_genai.StreamerBase):
        def __init__(self):
            super().__init__()
            self.ids = []

        def write(self, token):
            self.ids += token if isinstance(token, list) else [token]
            return ov_genai.StreamingStatus.RUNNING

        def end(self):
            pass

    def run():
        ids = Ids()
        metrics = pipe.generate(PROMPT, images=[tensor], generation_config=config, streamer=ids).perf_metrics
        return {"encode_ms": float("nan"), "ttft_ms": metrics.get_ttft().mean, "tok_s": 1e3 / metrics.get_tpot().mean,
                "tokens": [int(t) for t in ids.ids]}

    return run


def markdown(rows: list[dict]) -> str:
    lines = ["| format | export s | runner | encode ms | x eager | TTFT ms | x eager | decode tok/s | x eager "
             "| same ids as eager | load |", "|" + "---|" * 11]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['format']} | | error: {r['error']} |" + " |" * 8)
            continue
        eager = r["best"]["eager"]
        for key, label in (("eager", "eager PyTorch"), ("ours", "hfexport generate"), ("vendor", VENDOR.get(r["format"]))):
            if key not in r["best"]:
                continue
            row = r["best"][key]

            def ratio(metric, faster_is_lower=True):
                if row[metric] != row[metric] or key == "eager":  # nan, or the eager row itself
                    return ""
                value = eager[metric] / row[metric] if faster_is_lower else row[metric] / eager[metric]
                return f"{value:.2f}x"

            lines.append(f"| {r['format']} | {r.get('export_s', '')} | {label} | {row['encode_ms']} | {ratio('encode_ms')} "
                         f"| {row['ttft_ms']} | {ratio('ttft_ms')} | {row['tok_s']} | {ratio('tok_s', False)} "
                         f"| {'yes' if r['same_ids'][key] else '**no**'} | {r['load']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True, help="where the source model, the image and the exports go (kept)")
    parser.add_argument("--formats", default="onnx,openvino,dynamo")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    root = Path(args.root)
    if args.one:
        fmt, folder = args.one.split(":", 1)
        print(json.dumps(run_one(fmt, source_folder(root), Path(folder), image_file(root), args.rounds)))
        return
    root.mkdir(parents=True, exist_ok=True)
    source, image = source_folder(root), image_file(root)
    rows = []
    for fmt in args.formats.split(","):
        folder = root / f"llava-{fmt}"
        seconds = export(source, fmt, folder)
        env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
        done = subprocess.run([sys.executable, __file__, "--root", str(root), "--rounds", str(args.rounds),
                               "--one", f"{fmt}:{folder}"], capture_output=True, text=True, env=env, timeout=3600)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        row = (json.loads(lines[-1]) if done.returncode == 0 and lines else
               {"format": fmt, "error": ((done.stderr.strip().splitlines() or ["no output"])[-1])[:300]})
        row["export_s"] = "" if seconds != seconds else round(seconds, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    table = markdown(rows)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table)


if __name__ == "__main__":
    main()
