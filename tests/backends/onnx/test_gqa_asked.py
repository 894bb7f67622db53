"""`OnnxConfig(group_query_attention=True)` is met or refused, never quietly weakened: an export whose
cache's attention stays `MultiHeadAttention` raises naming why, where `None` in an export folder
keeps it and says why in the manifest (the folder then is no onnxruntime-genai package).

Tiny decoders drawn (`random.Random(5381)`: model type, head dim, kv heads, prompt length); the
"rule does not match" case stands in `fuse_static_gqa`'s answer for a model GQA cannot express
(alibi, cross-attention), whose own export is the same code path.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from hfexport import OnnxConfig, OnnxExporter, record_of
from hfexport.errors import ExportError
from tests.harness import require_backend, tiny_decoder

require_backend("onnx")

_DRAW = random.Random(5381)
#: (model type, head dim, kv heads, prompt length)
DRAWN = [(_DRAW.choice(["llama", "qwen3", "mistral"]), _DRAW.choice([8, 16]), _DRAW.choice([1, 2, 4]),
          _DRAW.randint(2, 7)) for _ in range(2)]


def test_true_without_ort_fusions_is_refused_at_once():
    with pytest.raises(ValueError, match="needs ort_fusions=True"):
        OnnxConfig(group_query_attention=True, ort_fusions=False)
    assert not OnnxConfig(group_query_attention=None, ort_fusions=False).rewrites_attention


@pytest.mark.slow  # two exports each
@pytest.mark.parametrize("variation", DRAWN, ids=str)
def test_true_on_a_dynamic_cache_raises_naming_why(variation):
    """A dynamic cache's decode has no static cache for GroupQueryAttention to take: asked for it,
    the export raises (it kept MultiHeadAttention before, the record alone saying so); asked
    nothing, it validates in ONNX Runtime with MultiHeadAttention."""
    model_type, head_dim, kv_heads, prompt = variation
    model, inputs = tiny_decoder(model_type, 2, head_dim=head_dim, kv_heads=kv_heads, prompt=prompt)
    with pytest.raises(ExportError, match=r"group_query_attention=True\).*stays as it was") as error:
        OnnxExporter().export_for_generation(model, inputs, OnnxConfig(dynamic=True, group_query_attention=True))
    assert "static cache" in str(error.value) and "What to do:" in str(error.value)
    decode = OnnxExporter().export_for_generation(model, inputs, OnnxConfig(dynamic=True, validate=True))["decode"]
    details = record_of(decode).details
    assert details["validation"]["passed"] and "GroupQueryAttention" not in details["ort_fusions"]["fused"]


@pytest.mark.slow  # an export and a folder
def test_a_rule_that_does_not_match_raises_when_asked_and_is_explained_in_a_folder(tmp_path, monkeypatch):
    """Where the rewrite does not match a static cache's attention, `True` raises with the rule's
    reason; the CLI's folder (`None`, on where it applies) keeps MultiHeadAttention, validates, and
    its manifest says why onnxruntime-genai does not open it; its `export_config.json` keeps None."""
    from transformers import GenerationConfig

    from hfexport.backends.onnx import fusions
    from hfexport.job.export import GenerationOptions, export_to_folder

    reason = "a test's attention that GroupQueryAttention cannot express"
    monkeypatch.setattr(fusions, "fuse_static_gqa", lambda model, positions: (model, {"kept": reason}))
    model_type, head_dim, kv_heads, prompt = DRAWN[0]
    model, inputs = tiny_decoder(model_type, 2, head_dim=head_dim, kv_heads=kv_heads, prompt=prompt)
    static = GenerationConfig(cache_implementation="static", max_cache_len=32)
    with pytest.raises(ExportError, match=reason):
        OnnxExporter().export_for_generation(model, inputs, OnnxConfig(dynamic=True, group_query_attention=True),
                                             generation_config=static)
    folder = tmp_path / "export"
    export_to_folder((model, inputs), OnnxConfig(dynamic=True), folder,
                     generation=GenerationOptions(generate=True, static_cache=32))
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["runtime_package"]["ready"] is False and reason in manifest["runtime_package"]["why"]
    report = json.loads((folder / "report.json").read_text())
    decode = report["components"]["decode"]
    assert decode["validation"]["passed"]
    assert decode["record"]["ort_fusions"]["group_query_attention"] == {"kept": reason}
    assert json.loads((folder / "export_config.json").read_text())["group_query_attention"] is None


def test_a_folder_asks_nothing_of_the_config_it_writes():
    """The folder's default turns GroupQueryAttention on for the export in hand only: the config
    written is the one given, so a re-export from it asks nothing more."""
    package = OnnxExporter().runtime_package("text-generation")
    assert package.folder_config(OnnxConfig()).rewrites_attention
    assert package.folder_config(OnnxConfig()).to_dict() == OnnxConfig().to_dict()
    assert not package.folder_config(OnnxConfig(group_query_attention=False)).rewrites_attention
    assert OnnxConfig.from_dict(package.folder_config(OnnxConfig()).to_dict()) == OnnxConfig()
