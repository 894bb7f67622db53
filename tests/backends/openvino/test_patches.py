"""The OpenVINO SDPA patch at the head sizes real models use (64, 128, 256), not only the tiny
presets' (issue 18's large-model run found it): with its row mask broadcast, Llamas of head dim
128 exported with wrong logits in OpenVINO 2026.4.1's CPU plugin, padded or not (each case here
failed without the fix but 64's)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("openvino")

from hfexport import OpenVINOConfig, OpenVINOExporter, validate  # noqa: E402
from tests.harness import padded_batch  # noqa: E402

pytestmark = pytest.mark.slow


def _llama(head_dim: int, heads: int, kv_heads: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(head_dim + kv_heads)
    config = LlamaConfig(vocab_size=128, hidden_size=heads * head_dim, head_dim=head_dim, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv_heads)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("head_dim,heads,kv_heads,padded", [
    (64, 4, 2, True), (128, 2, 2, False), (128, 2, 2, True), (128, 4, 1, True), (256, 2, 1, False)])
def test_dynamic_export_matches_eager_at_real_head_sizes(head_dim, heads, kv_heads, padded):
    model = _llama(head_dim, heads, kv_heads)
    inputs = padded_batch(2, 9, pad=3) if padded else {"input_ids": torch.randint(3, 128, (1, 11))}
    artifact = OpenVINOExporter().export(model, inputs, config=OpenVINOConfig(dynamic=True))
    report = validate(artifact, model, inputs)
    assert report.passed, report.to_table()
