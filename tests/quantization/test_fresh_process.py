"""A quantized export opens in a new process as where it was made: the ops a quantized program calls
are registered by the loader, not by whatever the exporting process had imported.

A PT2E-quantized Dynamo program calls `quantized_decomposed` ops, which torch registers only when
`torch.ao.quantization.fx._decomposed` is imported: the export (which quantized, so imported it)
validated and passed its accuracy gate, and every later `hfexport generate` or `verify` of the folder
failed to deserialize it. Here the folder is made and read by the CLI in processes of their own,
and its program loaded by torch's own `torch.export.load` as docs/runtimes/dynamo.md says.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

PROMPT = [1, 5, 9, 13]
NEW_TOKENS = 6

#: torch's own loader on the folder's `decode.pt2`, as docs/runtimes/dynamo.md says to load a quantized
#: program: the op registration imported, the cache class registered, its saved example inputs run.
PLAIN_LOAD = """
import sys
import torch
import torch.ao.quantization.fx._decomposed  # registers quantized_decomposed
from transformers import StaticCache
from hfexport.exporter_dynamo import register_pytree_node

register_pytree_node(StaticCache)
program = torch.export.load(sys.argv[1])
args, kwargs = program.example_inputs
torch.save(program.module()(*args, **kwargs)["logits"], sys.argv[2])
"""


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
    # and torch's own loader, in a process of its own, gives what hfexport's load of the file gives
    script, logits = tmp_path / "plain_load.py", tmp_path / "logits.pt"
    script.write_text(PLAIN_LOAD)
    plain = subprocess.run([sys.executable, str(script), str(out / "decode.pt2"), str(logits)], capture_output=True,
                           text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr[-2000:]
    from hfexport import DynamoExporter

    program = DynamoExporter().load([out / "decode.pt2"])
    args, kwargs = program.example_inputs
    expected = program.module()(*args, **kwargs)["logits"]
    torch.testing.assert_close(torch.load(logits), expected, atol=1e-5, rtol=1e-5)
