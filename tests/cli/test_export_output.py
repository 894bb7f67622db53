"""What `hfexport export` prints, run as a user runs it, piped into a log: step numbers that count to a
total known from the first step, each step's lines in order; validation as one line per component and
the verdict (the whole table in report.json, and printed with --verbose); no progress bar of another
package."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

LAYERS = 4
STEP = re.compile(r"^\[(\d+)/(\d+)\] (.*?)(?: \.\.\.|: done in \d+\.\ds|: still running \(.*\))$")


def _hfexport(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hfexport", *args], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """A random Llama of `LAYERS` layers saved with `save_pretrained` (3 cache tensors a layer: a long table)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=LAYERS,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    folder = tmp_path_factory.mktemp("llama") / "model"
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def onnx_export(llama_folder, tmp_path_factory):
    """`hfexport export FOLDER -f onnx`: the LLM package, its folder checked in onnxruntime-genai."""
    out = tmp_path_factory.mktemp("onnx") / "out"
    return out, _hfexport("export", str(llama_folder), "-f", "onnx", "-o", str(out))


@pytest.fixture(scope="module")
def verbose_components(llama_folder, tmp_path_factory):
    """`hfexport --verbose export FOLDER --generate` (dynamo): two components, every table printed."""
    out = tmp_path_factory.mktemp("dynamo") / "out"
    return out, _hfexport("--verbose", "export", str(llama_folder), "--generate", "-o", str(out))


def _steps(stderr: str) -> list[tuple[int, int, str, str]]:
    """`(number, total, label, line)` of each progress line."""
    return [(int(m[1]), int(m[2]), m[3], line) for line in stderr.splitlines() if (m := STEP.match(line))]


def _assert_steps_in_order(stderr: str, total: int) -> list[str]:
    """Every step line says `/total`, numbers never go back and reach `total`, and each step (or part)
    ends with its `done` line before the next one starts. Returns the labels in order."""
    steps = _steps(stderr)
    assert steps and {t for _, t, _, _ in steps} == {total}, stderr
    numbers = [n for n, _, _, _ in steps]
    assert numbers == sorted(numbers) and numbers[-1] == total, stderr
    starts = [(n, label) for n, _, label, line in steps if line.endswith(" ...")]
    ends = [(n, label) for n, _, label, line in steps if ": done in " in line]
    assert starts == ends, stderr
    lines = [line for *_, line in steps if "still running" not in line]
    assert all(start.endswith(" ...") and ": done in " in end for start, end in zip(lines[::2], lines[1::2])), stderr
    return [label for _, label in starts]


def test_the_steps_count_to_the_total_said_first_and_the_folder_check_comes_after_writing(onnx_export):
    out, result = onnx_export
    assert result.returncode == 0, result.stderr
    labels = _assert_steps_in_order(result.stderr, 5)
    assert labels[-2:] == [f"writing {out}", "running the folder in onnx's own LLM runner"]


def test_the_default_output_is_one_line_per_component_and_the_verdict(onnx_export):
    out, result = onnx_export
    assert result.returncode == 0, result.stderr
    stdout = result.stdout.splitlines()
    validation = stdout[stdout.index(next(line for line in stdout if line.startswith("  validation:"))):]
    assert validation[0] == ("  validation:     against eager in ONNX Runtime (CPUExecutionProvider), cases sample, "
                             "resized, smallest (every output: report.json, or --verbose)")
    assert re.fullmatch(r"    decode: +passed; worst output (logits|cache\.\d+\.(keys|values)) \((sample|resized|smallest) "
                        r"case\): max abs \S+ \(tolerance atol=0\.0001, rtol=0\.0001\)", validation[1]), validation[1]
    assert validation[2].startswith("  runtime runner: onnxruntime-genai ")
    assert validation[3:] == ["result: PASSED"]
    assert not [line for line in stdout if "cache.0.keys" in line or line.startswith("  sample ")]
    # the whole table is in report.json, as before: every output of every case
    table = json.loads((out / "report.json").read_text())["components"]["decode"]["validation"]
    assert [len(case["outputs"]) for case in table["cases"]] == [1 + 3 * LAYERS] * 3
    worst = re.search(r"worst output (\S+) \((\w+) case\): max abs (\S+) ", validation[1])
    rows = {(case["label"], o["name"]): o for case in table["cases"] for o in case["outputs"]}
    assert float(worst[3]) == pytest.approx(rows[worst[2], worst[1]]["max_abs"], rel=1e-2)


def test_no_progress_bar_of_another_package_reaches_the_log(onnx_export):
    _, result = onnx_export
    assert result.returncode == 0, result.stderr
    assert "Loading weights" not in result.stderr and "it/s]" not in result.stderr, result.stderr


def test_verbose_prints_every_output_and_the_parts_of_the_export_step_share_its_number(verbose_components):
    out, result = verbose_components
    assert result.returncode == 0, result.stderr
    labels = _assert_steps_in_order(result.stderr, 5)
    exports = [(n, label) for n, _, label, line in _steps(result.stderr)
               if label.startswith("exporting") and line.endswith(" ...")]
    assert [n for n, _ in exports] == [3, 3] and len(labels) == 6, result.stderr
    report = json.loads((out / "report.json").read_text())["components"]
    rows = [line for line in result.stdout.splitlines() if re.match(r"  (sample|resized|smallest) +\S", line)]
    expected = sum(len(case["outputs"]) for entry in report.values() for case in entry["validation"]["cases"])
    assert len(rows) == expected > 2 * 3 * LAYERS
    assert result.stdout.splitlines()[-1] == "result: PASSED"


def test_a_failed_validation_prints_its_failing_rows_and_the_verdict_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    result = _hfexport("export", "tiny:llama", "-f", "onnx", "--task", "forward", "--tolerance", "0", "--rtol", "0",
                       "-o", str(out))
    assert result.returncode == 3, result.stderr
    stdout = result.stdout.splitlines()
    line = next(line for line in stdout if line.startswith("    model:"))
    failed = int(re.match(r"    model: +FAILED \((\d+) of \d+ outputs\); worst output \S+ \(\w+ case\): max abs ", line)[1])
    rows = stdout[stdout.index(line) + 1:-1]
    assert len(rows) == min(failed, 10) + (failed > 10) and all(" FAIL" in row for row in rows[:10])
    assert stdout[-1] == "result: FAILED" and not out.exists()
    assert "differs from eager PyTorch" in result.stderr.splitlines()[-1]
