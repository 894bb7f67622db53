"""A model whose weights exceed the memory the export may use (issue 18): a 3 GB random Llama
saved with `save_pretrained`, exported by the CLI in a memory cgroup capped at half its weight
bytes (`bench/large_model.py`, which also measures the 5.9 GB case in `bench/RESULTS.md`).

Not in CI (minutes, 6 GB of disk, root and a cgroup v1 memory controller); run it with

    HFEXPORT_LARGE=1 python -m pytest -q -p no:cacheprovider tests/test_large_model.py

The cap is the assertion: past it, with nothing left to reclaim, the kernel kills the export.
OpenVINO's and ExecuTorch's exports run with --no-validate: their runtimes repack every weight when
they load a model (about 1x of their own), which no cap under the weights holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "large_model.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("HFEXPORT_LARGE") != "1",
                       reason="minutes and 6 GB of disk: run with HFEXPORT_LARGE=1 (see the module docstring)"),
    pytest.mark.skipif(not os.access("/sys/fs/cgroup/memory", os.W_OK),
                       reason="needs root and a cgroup v1 memory controller at /sys/fs/cgroup/memory"),
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("large") / "llama"
    subprocess.run([sys.executable, str(BENCH), "--make", str(folder), "--layers", "10"], check=True)
    return folder


@pytest.mark.parametrize("backend,validate", [("onnx", True), ("openvino", False), ("executorch", False)],
                         ids=["onnx-validated", "openvino-no-validate", "executorch-no-validate"])
def test_exports_in_a_cgroup_capped_at_half_the_weights(checkpoint, backend, validate, tmp_path):
    out = tmp_path / "result.json"
    command = [sys.executable, str(BENCH), "--model", str(checkpoint), "--backends", backend, "--cap", "0.5",
               "--work", str(tmp_path), "--json", str(out), *([] if validate else ["--no-validate"])]
    subprocess.run(command, check=True)
    [result] = json.loads(out.read_text())
    assert result["returncode"] == 0, result.get("error")
    assert result["peak_anonymous"] <= 0.5
    if validate:
        assert result["validated"]
