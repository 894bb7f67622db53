"""Benchmark: the Python work `GenerationRunner` adds to a decode step of ExecuTorch's LLM-runner
program, measured side by side in one process (issue 30: "the runner's Python work per step under
5% of the step").

    python bench/runner_overhead.py                 # the tiny Llama (`tiny:llama`), exported here
    python bench/runner_overhead.py --model llama   # issue 30's random Llama (134 MB fp32), exported here
    python bench/runner_overhead.py --model llama --quantize int8-dynamic-int4-weights   # ... its 8da4w program
    python bench/runner_overhead.py --folder DIR    # an existing `--format executorch --static-cache N` export
                                                    # (exported there first, with --model, where DIR does not exist)

Three loops over the same program, interleaved for `--repeats` rounds, each from the same prompt
for `--steps` greedy decode steps after the first token (no end token):
  - bare: `method.execute([ids, input_pos])` + `argmax` of the last logits row, written by hand;
  - fast: `GenerationRunner.generate` (the greedy fast path, `generation/greedy.py`);
  - generic: the same with `runner.use_fast_path = False` (the loop every other case takes).
A step's time is the decode time over the steps (from the first token on, `tokens_per_s`). The
method is wrapped in a timer, so each loop's own work is measured in the same run as its steps:
"outside execute" is a step's time less its `execute` call (the timer's two `perf_counter` calls
counted as execute's), and the Python share is that over the step, the median over the rounds.
Loops also compared with one another as differences of medians (noisy on a loaded machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def export(model: str, folder: Path, cache: int, quantize: str | None) -> None:
    """`hfexport export MODEL --format executorch --generate --static-cache CACHE [--quantize Q]` into `folder`."""
    from hfexport import ExecutorchConfig
    from hfexport.job import GenerationOptions, JudgingOptions, export_to_folder

    if model == "llama":
        from executorch_llm import issue_llama

        source = folder.parent / "source"
        issue_llama()[0].save_pretrained(source)
        model = str(source)
    export_to_folder(model, ExecutorchConfig(dynamic=True), folder, generation=GenerationOptions(static_cache=cache),
                     judging=JudgingOptions(validate=False), quantize=quantize)


class TimedMethod:
    """A method whose `execute` calls are timed (`seconds`, one entry per call)."""

    def __init__(self, method):
        self.method, self.seconds = method, []

    def execute(self, inputs):
        start = time.perf_counter()
        outputs = self.method.execute(inputs)
        self.seconds.append(time.perf_counter() - start)
        return outputs


def bare_step_ms(method, prompt: list[int], steps: int) -> tuple[float, list[int]]:
    """ms per decode step of a hand-written loop: `execute` + argmax, the feed built once."""
    import torch

    logits = method.execute([torch.tensor([prompt]), torch.tensor([0])])[0]
    tokens = [int(logits[0, -1].argmax())]
    ids, pos = torch.zeros((1, 1), dtype=torch.long), torch.zeros(1, dtype=torch.long)
    leaves = [ids, pos]
    start = time.perf_counter()
    for past in range(len(prompt), len(prompt) + steps):
        ids[0, 0] = tokens[-1]
        pos[0] = past
        tokens.append(int(method.execute(leaves)[0][0, -1].argmax()))
    return (time.perf_counter() - start) * 1000 / steps, tokens


def runner_step_ms(runner, prompt: list[int], steps: int, fast: bool) -> tuple[float, list[int], bool]:
    runner.use_fast_path = fast
    result = runner.generate(prompt, max_new_tokens=steps + 1, eos_token_id=None)
    return 1000 / result.tokens_per_s, result.tokens, result.fast_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny:llama", help="tiny:llama, or llama (issue 30's random Llama)")
    parser.add_argument("--folder", help="an export to run (exported there first where it does not exist)")
    parser.add_argument("--quantize", help="a quantization recipe for the export (int8-dynamic-int4-weights)")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--prompt-length", type=int, default=8)
    args = parser.parse_args()

    import torch

    from hfexport import GenerationRunner

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.folder) if args.folder else Path(tmp) / "export"
        if not folder.exists():
            start = time.perf_counter()
            folder.parent.mkdir(parents=True, exist_ok=True)
            export(args.model, folder, args.prompt_length + args.steps + 8, args.quantize)
            print(f"export: {time.perf_counter() - start:.1f} s")
        runner = GenerationRunner.load(folder, engine="hfexport")  # its own loop, not the runtime's engine
        vocab = runner.export.config.vocab_size
        prompt = torch.randint(3, vocab, (args.prompt_length,), generator=torch.Generator().manual_seed(1)).tolist()
        method = runner.runners["decode"].method = TimedMethod(runner.runners["decode"].method)
        times: dict[str, list[float]] = {"bare": [], "fast": [], "generic": []}
        outside: dict[str, list[float]] = {key: [] for key in times}
        for _ in range(args.repeats):
            tokens = {}
            for key in times:
                method.seconds.clear()
                if key == "bare":
                    step, tokens[key] = bare_step_ms(method, prompt, args.steps)
                else:
                    step, tokens[key], taken = runner_step_ms(runner, prompt, args.steps, key == "fast")
                    assert taken == (key == "fast"), f"the {key} loop took fast_path={taken}"
                executed = sum(method.seconds[1:]) * 1000 / args.steps  # the decode steps' (not the prefill's)
                times[key].append(step)
                outside[key].append(step - executed)
            assert tokens["bare"] == tokens["fast"] == tokens["generic"], "the three loops disagree"
    bare = statistics.median(times["bare"])
    print(f"{folder if args.folder else args.model}: {args.steps} steps x {args.repeats} rounds, "
          f"prompt {args.prompt_length}, load {os.getloadavg()[0]:.2f}")
    print("| loop | ms/step (median; min-max) | median - bare's | outside execute, ms/step | Python share |")
    print("|---|---|---|---|---|")
    for key, values in times.items():
        median = statistics.median(values)
        shares = [o / v for o, v in zip(outside[key], values)]
        print(f"| {key} | {median:.3f} ({min(values):.3f}-{max(values):.3f}) | {median - bare:+.3f} | "
              f"{statistics.median(outside[key]):.4f} | {statistics.median(shares) * 100:.1f}% |")


if __name__ == "__main__":
    main()
