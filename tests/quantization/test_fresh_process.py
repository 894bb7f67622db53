"""A quantized export opens in a new process as where it was made: the ops a quantized program calls
are registered by the loader, not by whatever the exporting process had imported.

A PT2E-quantized Dynamo program calls `quantized_decomposed` ops, which torch registers only when
`torch.ao.quantization.fx._decomposed` is imported: the export (which quantized, so imported it)
validated and passed its accuracy gate, and every later `hfexport generate` or `verify` of the folder
failed to deserialize it. Here the folder is made and read by the CLI in processes of their own.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROMPT = [1, 5, 9, 13]
NEW_TOKENS = 6


def _hfexport(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hfexport", *args], capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["int8-dynamic", "int8-static"])
def test_a_pt2e_quantized_dynamo_folder_generates_in_a_new_process(tmp_path, scheme):
    out = tmp_path / "out"
    made = _hfexport("export", "tiny:llama", "-f", "dynamo", "--quantize", scheme, "-o", str(out))
    assert made.returncode == 0, made.stderr[-2000:]
    checked = _hfexport("verify", str(out))
    assert checked.returncode == 0, checked.stderr[-2000:]
    done = _hfexport("generate", str(out), "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens",
                     str(NEW_TOKENS), "--min-new-tokens", str(NEW_TOKENS), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    # the same folder run here, where the exporting imports registered the ops: what validation passed
    from hfexport import GenerationRunner

    here = GenerationRunner.load(out).generate(PROMPT, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    assert printed["tokens"] == list(here.tokens) and len(printed["tokens"]) == NEW_TOKENS
