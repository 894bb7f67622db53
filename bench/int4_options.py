"""Which int4 options keep a real LLM's greedy tokens: OpenVINO's NNCF recipes and ExecuTorch's 8da4w,
measured on SmolLM2-135M-Instruct itself, without an export (issues 29, 30, 32).

An export takes 6-30 minutes of this machine per recipe; the quantization's own error does not
need one. Each option is applied to the fp32 model and judged the way the export job's accuracy
gate judges an export (`generation.accuracy`), teacher-forced against fp32 eager: eager answers
each prompt greedily (48 tokens, or 64 for the gate's raw sample prompt "Hello, world!"), the
quantized model reads the same tokens, and per prompt the share of steps whose greedy token is
eager's ("agreement") and the mean of the steps' logits cosines.

- `--openvino`: the model converted once with `openvino.convert_model` (logits for every
  position), then `nncf.compress_weights` with each option set (`OV_OPTIONS`), run in OpenVINO
  with f32 inference; the chat prompts and the gate's sample prompt.
- `--torchao`: torchao's `Int8DynamicActivationIntxWeightConfig` on the eager model's linears,
  as `TorchaoQuantizer` applies it to the export's graph (`TORCHAO_OPTIONS`: the group size, the
  head's bits, the scale algorithm, or the quantizer's own mixed-precision rule `linear_bits`
  with its ratio and ranking); nine chat prompts and the sample prompt; each row's linear-weight
  bytes as XNNPACK holds them. The ExecuTorch program's greedy tokens followed torchao's eager
  ones on SmolLM2 (`bench/RESULTS.md`).

    HFEXPORT_CACHE=... python bench/int4_options.py --openvino [--only "asym g128, ratio 0.8"]
    HFEXPORT_CACHE=... python bench/int4_options.py --torchao [--only "8da4w g32"]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_model import CHAT_PROMPTS, chat_inputs, smollm2_folder  # noqa: E402

from hfexport.quantization.torchao import linear_bits  # noqa: E402

#: More chat prompts for the torchao options (the per-prompt spread is wide at int4).
MORE_PROMPTS = ("Write a haiku about autumn leaves.", "How many legs does a spider have?",
                "Explain what photosynthesis is in two sentences.", "Give me three tips for learning a new language.",
                "What is 12 times 7?", "Translate 'good morning' into Spanish.")
SAMPLE_PROMPT = "Hello, world!"  # the export job's sample input, the accuracy gate's prompt


def ov_options():
    import nncf

    mode, adjust = nncf.CompressWeightsMode, nncf.AdvancedCompressionParameters(
        group_size_fallback_mode=nncf.GroupSizeFallbackMode.ADJUST)
    asym128 = {"mode": mode.INT4_ASYM, "group_size": 128, "advanced_parameters": adjust}
    return {
        "asym g128, ratio 1.0": {**asym128, "ratio": 1.0},
        "asym g64": {"mode": mode.INT4_ASYM, "group_size": 64, "ratio": 1.0},
        "asym g32": {"mode": mode.INT4_ASYM, "group_size": 32, "ratio": 1.0},
        "sym g32": {"mode": mode.INT4_SYM, "group_size": 32, "ratio": 1.0},
        "asym g128, ratio 0.8": {**asym128, "ratio": 0.8},
        "asym g128, scale estimation": {**asym128, "ratio": 1.0, "scale_estimation": True, "data": True},
        "asym g128, AWQ + scale estimation": {**asym128, "ratio": 1.0, "awq": True, "scale_estimation": True,
                                              "data": True},
    }


#: name: (head bits, group size (0: per channel, int8 weights), torchao's qparams algorithm, mixed precision),
#: mixed precision `(ratio, metric)` choosing each linear's bits with `TorchaoQuantizer`'s own rule
#: (`quantization.torchao.linear_bits`; the head bits then come from it), or None.
TORCHAO_OPTIONS = {
    "8da4w g32": (4, 32, "affine", None),
    "8da4w g32, hqq": (4, 32, "hqq_scale_only", None),
    "8da4w g32, head int8": (8, 32, "affine", None),
    "8da4w g16, head int8": (8, 16, "affine", None),
    "8da4w g16, head int8, hqq": (8, 16, "hqq_scale_only", None),
    "8da4w g32, head int8, ratio 0.8 by int4 error": (8, 32, "affine", (0.8, "int4")),
    "8da4w g32, head int8, ratio 0.8 by NNCF's criterion": (8, 32, "affine", (0.8, "nncf")),
    "8da4w g32, head int8, ratio 0.9 by NNCF's criterion": (8, 32, "affine", (0.9, "nncf")),
    "8da4w g32, head int8, ratio 0.7 by NNCF's criterion": (8, 32, "affine", (0.7, "nncf")),
    "8da8w": (8, 0, "affine", None),
}


def _weight_bytes(linears: dict[str, torch.nn.Linear], bits: dict[str, int], group: int) -> int:
    """Bytes of the linears' weights as XNNPACK holds them: int4 packed two a byte with a bf16 scale
    per group (or per row off the group size), int8 with an fp32 scale per row."""
    total = 0
    for path, linear in linears.items():
        rows, columns = linear.weight.shape
        if bits[path] == 4:
            total += rows * columns // 2 + rows * (columns // group if columns % group == 0 else 1) * 2
        else:
            total += rows * columns + rows * 4
    return total


def _references(model, tokenizer, prompts):
    """Per prompt: the sequence eager answered greedily, where its answer starts, eager's logits over it."""
    out = []
    for prompt in prompts:
        inputs = (tokenizer(prompt, return_tensors="pt") if prompt == SAMPLE_PROMPT
                  else chat_inputs(tokenizer, prompt))
        new = 64 if prompt == SAMPLE_PROMPT else 48
        with torch.no_grad():
            sequence = model.generate(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                      pad_token_id=tokenizer.eos_token_id)
            start = inputs["input_ids"].shape[1]
            out.append((sequence, start, model(sequence).logits[0, start - 1:-1].numpy()))
    return out


def _scores(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    agreement = float((got.argmax(-1) == want.argmax(-1)).mean())
    cosine = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    return agreement, float(cosine.mean())


def _row(name: str, seconds: float, prompts, scores) -> None:
    cells = ", ".join(f"{p[:12]!r} {a:.2f}/{c:.3f}" for p, (a, c) in zip(prompts, scores))
    agreements, cosines = [a for a, _ in scores], [c for _, c in scores]
    print(f"| {name} | {min(agreements):.2f}-{max(agreements):.2f} (mean {np.mean(agreements):.3f}) | "
          f"{min(cosines):.3f}-{max(cosines):.3f} (mean {np.mean(cosines):.3f}) | {cells} | {seconds:.0f} |",
          flush=True)


def run_openvino(model, tokenizer, only):
    import nncf
    import openvino as ov

    prompts = [*CHAT_PROMPTS, SAMPLE_PROMPT]
    references = _references(model, tokenizer, prompts)

    class Logits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        # the mask given, transformers' packed-sequence check (aten::diff, which OpenVINO cannot convert) stays out
        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    example = references[0][0]
    dynamic = [ov.PartialShape([1, -1])] * 2
    fp32 = ov.convert_model(Logits(model), example_input=(example, torch.ones_like(example)), input=dynamic)
    core, properties = ov.Core(), {"INFERENCE_PRECISION_HINT": "f32"}
    feeds = [[s.numpy(), np.ones_like(s.numpy())] for s, _, _ in references]

    def scores(compiled):
        return [_scores(compiled(feed)[0][0, start - 1:-1], want) for feed, (_, start, want) in zip(feeds, references)]

    for name, options in ov_options().items():
        if only and name not in only:
            continue
        options = dict(options)
        if options.pop("data", False):  # the chat prompts' answers as the calibration data
            options["dataset"] = nncf.Dataset(feeds[:len(CHAT_PROMPTS)])
        started = time.perf_counter()
        compressed = nncf.compress_weights(fp32.clone(), **options)
        seconds = time.perf_counter() - started
        _row(name, seconds, prompts, scores(core.compile_model(compressed, "CPU", properties)))


def run_torchao(model_factory, tokenizer, only):
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quantize_.workflows.intx.intx_choose_qparams_algorithm import (
        IntxChooseQParamsAlgorithm,  # torchao 0.18's module path
    )

    prompts = [*CHAT_PROMPTS, *MORE_PROMPTS, SAMPLE_PROMPT]
    references = _references(model_factory(), tokenizer, prompts)
    for name, (head_bits, group, algorithm, mixed) in TORCHAO_OPTIONS.items():
        if only and name not in only:
            continue
        model, started = model_factory(), time.perf_counter()
        linears = {path: m for path, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        if mixed:
            embedding_rows = [m.weight.shape[0] for m in model.modules() if isinstance(m, torch.nn.Embedding)]
            chosen = linear_bits({path: m.weight for path, m in linears.items()}, embedding_rows, group, *mixed)
        else:
            chosen = {path: head_bits if path == "lm_head" else (8 if group == 0 else 4) for path in linears}
        for path, linear in linears.items():
            bits = chosen[path]
            grouped = bits == 4 and linear.in_features % group == 0  # int8: one scale per row
            granularity = PerGroup(group) if grouped else PerAxis(0)
            linear.weight = torch.nn.Parameter(linear.weight.detach().clone(), requires_grad=False)  # untied
            config = Int8DynamicActivationIntxWeightConfig(
                weight_dtype=getattr(torch, f"int{bits}"), weight_granularity=granularity,
                intx_choose_qparams_algorithm=IntxChooseQParamsAlgorithm(algorithm))
            quantize_(linear, config, filter_fn=lambda module, _, target=linear: module is target)
        seconds = time.perf_counter() - started
        with torch.no_grad():
            scores = [_scores(model(sequence).logits[0, start - 1:-1].numpy(), want)
                      for sequence, start, want in references]
        int8 = [path for path, b in chosen.items() if b == 8]
        print(f"{name}: linear weights {_weight_bytes(linears, chosen, group or 32) / 1e6:.1f} MB, "
              f"{len(int8)} of {len(chosen)} linears int8: {int8}", flush=True)
        _row(name, seconds, prompts, scores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--openvino", action="store_true")
    parser.add_argument("--torchao", action="store_true")
    parser.add_argument("--only", action="append", help="an option's name (repeatable); default: all")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    folder = smollm2_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)

    def load():
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    print("| option | agreement, lowest-highest prompt | mean step cosine | per prompt (agreement/cosine) "
          "| quantize s |")
    print("|---|---|---|---|---|")
    if args.openvino:
        run_openvino(load(), tokenizer, args.only)
    if args.torchao:
        run_torchao(load, tokenizer, args.only)


if __name__ == "__main__":
    main()
