"""`GraphInterface`: the record's feed (4-D boolean causal mask, write counters) as a
GroupQueryAttention graph takes it (2-D mask over cached + new tokens), and the counters it no
longer returns. No export: the translation alone (the exports are in test_genai.py, test_decode.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from hfexport.backends.onnx.graph_interface import GraphInterface
from hfexport.errors import ExportError


def _causal(past: int, query: int, slots: int) -> np.ndarray:
    return (np.arange(slots)[None, :] <= np.arange(past, past + query)[:, None])[None, None]


@pytest.mark.parametrize("past, query, slots", [(0, 6, 32), (6, 3, 32), (9, 1, 10), (4, 2, 7)])
def test_the_causal_mask_becomes_ones_over_cached_and_new_tokens(past, query, slots):
    interface = GraphInterface(["cache.0.cumulative_length", "cache.1.cumulative_length"], ["position_ids"])
    named = {"input_ids": np.zeros((1, query), np.int64), "attention_mask": _causal(past, query, slots),
             "position_ids": np.arange(past, past + query)[None], "cache.0.cumulative_length": np.array(past),
             "cache.1.cumulative_length": np.array(past), "cache.0.keys": np.zeros((1, 2, slots, 16), np.float32)}
    feed = interface.feed(named)
    assert set(feed) == {"input_ids", "attention_mask", "cache.0.keys"}
    assert feed["attention_mask"].dtype == np.int64 and feed["attention_mask"].shape == (1, past + query)
    assert feed["attention_mask"].all()
    assert {k: int(v) for k, v in interface.outputs(named).items()} == {
        "cache.0.cumulative_length": past + query, "cache.1.cumulative_length": past + query}
    counterless = GraphInterface([], [])  # the cached tokens read from the mask instead
    assert counterless.written(named) == past


@pytest.mark.parametrize("past, query", [(0, 5), (6, 3), (9, 1)])
def test_positions_the_graph_would_not_take_are_refused_not_dropped(past, query):
    """A graph whose GroupQueryAttention rotates the query itself (its `position_ids` unfed) numbers
    the new tokens after the cached ones; other positions would silently give another answer than
    eager's (validation's resized case tiled one position three times, and the graph differed)."""
    interface = GraphInterface(["cache.0.cumulative_length"], ["position_ids"])
    named = {"input_ids": np.zeros((2, query), np.int64), "attention_mask": np.repeat(_causal(past, query, 16), 2, 0),
             "position_ids": np.repeat(np.arange(past, past + query)[None], 2, 0),
             "cache.0.cumulative_length": np.array(past)}
    assert "position_ids" not in interface.feed(named)
    named["position_ids"] = named["position_ids"] + 1
    with pytest.raises(ExportError, match=re.escape(f"positions {list(range(past, past + query))}")):
        interface.feed(named)
    named["position_ids"] = np.full((2, query), past)  # a position for every token alike
    if query > 1:
        with pytest.raises(ExportError, match="group_query_attention=False"):
            interface.feed(named)
    fed = GraphInterface(["cache.0.cumulative_length"], [])  # a graph that reads them: fed as they are
    assert (fed.feed(named)["position_ids"] == named["position_ids"]).all()


def test_padding_and_a_short_mask_are_refused_with_a_remedy():
    interface = GraphInterface(["cache.0.cumulative_length"], [])
    padded = _causal(4, 2, 16)
    padded[..., 1] = False  # a padded slot among the cached ones
    named = {"input_ids": np.zeros((1, 2), np.int64), "attention_mask": padded, "cache.0.cumulative_length": np.array(4)}
    with pytest.raises(ExportError, match="no padding"):
        interface.feed(named)
    named["attention_mask"] = _causal(4, 2, 16)[..., :5]  # 4 cached + 2 new need 6 slots
    with pytest.raises(ExportError, match="need 6"):
        interface.feed(named)


def test_a_masked_slot_is_recognised_at_the_lowest_value_of_a_16_bit_bias():
    """Issue 50: a float16 graph blocks a masked slot with -65504 (`torch.finfo(float16).min`),
    which a fixed floor of -1e30 did not take for a mask: the attention kept its MultiHeadAttention
    and `--dtype float16` made no onnxruntime-genai package. Any dtype's lowest value blocks; a
    finite bias above it does not (it is not the boolean mask, GroupQueryAttention's causal mask
    would not be the model's)."""
    from hfexport.backends.onnx.gqa_match import _blocks

    assert _blocks(np.array(np.finfo(np.float16).min, np.float16))
    assert _blocks(np.array(np.finfo(np.float32).min, np.float32)) and _blocks(np.array(-np.inf, np.float32))
    assert not _blocks(np.array(-65504.0, np.float32))  # a float32 bias of float16's lowest: not the mask
    assert not _blocks(np.array(-1000.0, np.float16)) and not _blocks(np.array(0.0, np.float16))


def test_a_feed_the_graph_refuses_is_a_reason_not_a_crash():
    """`gqa_match.evaluate` on a graph of one query row: rows fed one at a time are computed in one
    session; a feed of two rows, which ONNX Runtime refuses, comes back as the reason (the sliding
    window check then keeps the attention and says why)."""
    import onnx_ir as ir

    from hfexport.backends.onnx.gqa_match import MASK, evaluate

    mask = ir.Value(name=MASK, type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([1, 1, 1, 4]))
    node = ir.node("Not", [mask])
    node.outputs[0].name = "kept"
    model = ir.Model(ir.Graph([mask], node.outputs, nodes=[node], opset_imports={"": 17}), ir_version=10)
    rows = [np.array([[[[True, False, True, True]]]]), np.array([[[[False, False, True, False]]]])]
    got = evaluate(model, [node.outputs[0]], {MASK: rows[0]}, {MASK: rows[1]})
    assert [[value.tolist() for value in each] for each in got] == [[(~row).tolist()] for row in rows]
    assert evaluate(model, [node.outputs[0]], {MASK: rows[0]})[0].tolist() == (~rows[0]).tolist()
    refused = evaluate(model, [node.outputs[0]], {MASK: np.ones((1, 1, 2, 4), dtype=bool)})
    assert isinstance(refused, str) and refused.startswith("ONNX Runtime could not compute them")
