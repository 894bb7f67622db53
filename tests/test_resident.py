"""`hfexport.resident.drop_clean_pages`: the clean pages of a mapped checkpoint or runtime file leave
the resident set and come back unchanged on the next touch; a mapping holding a page this process
wrote, and memory no file backs, are never advised.

The checkpoint is a tiny random Llama saved and loaded by transformers (which maps its safetensors
file), its hidden size drawn (`HFEXPORT_TEST_SEED`); the runtime's file is one `numpy.memmap` maps,
as ONNX Runtime maps the external weights `scratch.scratch_model` writes.
"""

from __future__ import annotations

import os
import random
import re
import sys

import numpy as np
import pytest
import torch

from hfexport.resident import drop_clean_pages, weight_storages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps is Linux's")

_DRAW = random.Random(int(os.environ.get("HFEXPORT_TEST_SEED", "0")))
HIDDEN = _DRAW.choice([64, 128, 192])


def _resident_kib(path) -> int:
    """The resident KiB of this process's mappings of `path` (`/proc/self/smaps`)."""
    total, current = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                current = line.rstrip().endswith(str(path))
            elif current and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("resident") / f"llama-h{HIDDEN}"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2)).save_pretrained(folder)
    return folder, AutoModelForCausalLM.from_pretrained(folder).eval()


def test_a_mapped_checkpoints_pages_leave_and_come_back_unchanged(checkpoint):
    folder, model = checkpoint
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        before = model(ids).logits
    weights = folder / "model.safetensors"
    assert _resident_kib(weights) > 0, "transformers no longer maps the checkpoint: the drop has nothing to do"
    dropped = drop_clean_pages(spans=weight_storages(model))
    assert dropped >= sum(p.numel() * p.element_size() for p in model.parameters()) // 2
    assert _resident_kib(weights) == 0
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    assert _resident_kib(weights) > 0  # touched again: mapped back from the page cache


@pytest.mark.slow  # one ONNX export
def test_validation_leaves_the_checkpoint_out_of_the_resident_set_while_the_runtime_runs(checkpoint):
    """`validate` drops eager's mapped pages before the runtime runs (its last step: eager, dropped,
    then the runtime), so the checkpoint is not resident when it returns; the comparison still
    passes on the pages mapped back."""
    pytest.importorskip("onnxruntime")
    from hfexport import OnnxConfig, OnnxExporter
    from hfexport.validation import validate

    folder, model = checkpoint
    inputs = {"input_ids": torch.tensor([[5, 6, 7, 8, 9]])}
    artifact = OnnxExporter().export(model, inputs, OnnxConfig(validate=False))
    with torch.no_grad():
        model(**inputs)
    assert _resident_kib(folder / "model.safetensors") > 0
    report = validate(artifact, model, inputs)
    assert report.passed, report.to_table()
    assert _resident_kib(folder / "model.safetensors") == 0


def test_a_mapping_with_a_written_page_is_kept(checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    folder, _ = checkpoint
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    weight = model.model.layers[0].mlp.up_proj.weight
    with torch.no_grad():
        weight[0, 0] += 1.0  # this process's copy of the page now (copy-on-write)
    written = weight.clone()
    assert drop_clean_pages(spans=weight_storages(model)) == 0
    assert torch.equal(weight, written)


def test_a_runtimes_mapped_file_is_dropped_by_path(tmp_path):
    path = tmp_path / "weights.data"
    values = np.random.default_rng(HIDDEN).standard_normal(HIDDEN * 4096).astype(np.float32)
    values.tofile(path)
    mapped = np.memmap(path, dtype=np.float32, mode="r")
    assert float(mapped.sum()) == pytest.approx(float(values.sum()), rel=1e-4)
    assert _resident_kib(path) > 0
    assert drop_clean_pages(paths=[path]) >= values.nbytes
    assert _resident_kib(path) == 0
    assert np.array_equal(mapped, values)


def test_a_tensor_subclass_without_storage_is_passed_over():
    """torchao's quantized weights are wrapper subclasses whose storage has no data pointer."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    module = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 64))
    quantize_(module, Int8WeightOnlyConfig())
    assert drop_clean_pages(spans=weight_storages(module)) == 0


def test_memory_no_file_backs_is_never_advised():
    tensor = torch.randn(HIDDEN, 1024)
    copy = tensor.clone()
    module = torch.nn.Linear(1024, HIDDEN)
    module.weight.data = tensor
    assert drop_clean_pages(spans=weight_storages(module)) == 0
    assert torch.equal(tensor, copy)
    assert drop_clean_pages() == 0 and drop_clean_pages(paths=[]) == 0


def test_the_page_table_and_smaps_agree_on_written_pages(checkpoint):
    """Which mappings hold a written page is read from `/proc/self/pagemap` for the chosen mappings
    alone (`smaps` walks every mapping); both say the same of a clean and a written checkpoint."""
    from transformers import AutoModelForCausalLM

    from hfexport.resident import _has_written_page, _mappings

    folder, _ = checkpoint
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))  # every page touched, none written
    weights = str(folder / "model.safetensors")

    def both() -> list[tuple[bool | None, bool]]:
        by_smaps = {m.start: m.written for m in _mappings(with_pages=True) if m.path == weights}
        assert by_smaps, "transformers no longer maps the checkpoint"
        return [(_has_written_page(m), by_smaps[m.start]) for m in _mappings(with_pages=False) if m.path == weights]

    if any(from_table is None for from_table, _ in both()):
        pytest.skip("/proc/self/pagemap cannot be read here: drop_clean_pages reads smaps instead")
    assert all(from_table is False and from_smaps is False for from_table, from_smaps in both())
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[-1, -1] += 1.0
    pairs = both()
    assert all(from_table == from_smaps for from_table, from_smaps in pairs), pairs
    assert any(from_smaps for _, from_smaps in pairs)
