"""Benchmark: where an export's time goes, per format, a tiny and an 8-layer Llama side by side.

    python bench/export_time.py                                   # every format, both models
    python bench/export_time.py --formats onnx --markdown out.md

Each export is the export job (`export_to_folder`, a dynamic single graph, validated), run once in
this process one after the other; its report's `timing` (`hfexport.timing`: seconds per phase,
summed over the components) is printed beside the job's wall time, and the rest of the wall time
(loading the model, preparing, everything outside a named phase) as `other`. Models: the
`tiny:llama` preset and a random Llama of vocabulary 8192, hidden 512, 8 layers (8 heads, 4 kv
heads), built with a fixed seed. One run: these are where the time goes, not a timing to the
tenth of a second.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

FORMATS = ("dynamo", "onnx", "executorch", "openvino")


def eight_layer_llama():
    """`(model, inputs)`: the random 8-layer Llama of this benchmark."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    inputs = {"input_ids": torch.randint(0, 8192, (1, 16)), "attention_mask": torch.ones(1, 16, dtype=torch.long)}
    return model, inputs


def export_row(fmt: str, name: str, model, out: Path) -> dict:
    """One export's wall time and phases."""
    from hfexport import AutoExportConfig
    from hfexport.job import export_to_folder
    from hfexport.timing import PHASES

    start = time.perf_counter()
    result = export_to_folder(model, AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True}), out)
    wall = time.perf_counter() - start
    timing = result.report["timing"]
    phases = {p: round(sum(own.get(p, 0.0) for own in timing.values()), 2) for p in PHASES}
    return {"format": fmt, "model": name, "wall": round(wall, 2), **phases,
            "other": round(wall - sum(phases.values()), 2), "job_seconds": result.report["job_seconds"]}


def markdown(rows: list[dict]) -> str:
    from hfexport.timing import PHASES

    head = ["format", "model", "wall", *PHASES, "other"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(str(row[k]) for k in head) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for fmt in args.formats.split(","):
            for name, model in (("tiny:llama", "tiny:llama"), ("llama 8 layers", eight_layer_llama())):
                rows.append(export_row(fmt, name, model, Path(scratch) / f"{fmt}-{len(rows)}"))
                print(rows[-1], flush=True)
    table = markdown(rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")


if __name__ == "__main__":
    main()
