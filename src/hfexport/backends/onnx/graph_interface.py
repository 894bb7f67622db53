"""The translation between the interface an ONNX export's record keeps (the 4-D boolean causal
mask, the write counters `cache.<l>.cumulative_length`, `position_ids`) and the interface of a graph
whose attention `gqa.py` rewrote into `GroupQueryAttention` (a 2-D int64 mask of ones, no counters).
`record.details["graph_interface"]` says which counters and inputs the graph dropped; the runner
(`OnnxRunner`), the calibration feed and the genai config read it through `GraphInterface`."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["GRAPH_INTERFACE", "GraphInterface", "two_d_mask"]

#: The record's key for the translation from hfexport's interface to the graph's.
GRAPH_INTERFACE = "graph_interface"

_MASK = "attention_mask"
_POSITIONS = "position_ids"


@dataclasses.dataclass
class GraphInterface:
    """How a feed in the record's interface (the 4-D boolean mask, the write counters,
    `position_ids`) becomes the rewritten graph's feed, and its outputs the record's.

    Attributes:
        counters: the record's `cache.<l>.cumulative_length` leaves the graph no longer takes or
            returns: each call returns them plus the query length.
        unfed: record inputs the graph no longer takes (`position_ids` where nothing reads it).
    """

    counters: list[str]
    unfed: list[str]

    @classmethod
    def of(cls, record: Any) -> GraphInterface | None:
        """The translation a record asks for (`record.details["graph_interface"]`), else None."""
        entry = record.details.get(GRAPH_INTERFACE)
        return cls(list(entry["counters"]), list(entry["unfed"])) if entry else None

    def feed(self, named: dict[str, Any]) -> dict[str, Any]:
        """`named` (record names; tensors or arrays) as the graph takes it: the 4-D boolean mask as
        the 2-D mask of ones over the cached and new tokens, the counters and unfed inputs left out."""
        feed = {name: value for name, value in named.items() if name not in self.counters and name not in self.unfed}
        if _MASK in feed:
            feed[_MASK] = two_d_mask(np.asarray(named[_MASK]), self.written(named), _query_length(named))
        if _POSITIONS in self.unfed and named.get(_POSITIONS) is not None:
            self._check_positions(np.asarray(named[_POSITIONS]), named)
        return feed

    def _check_positions(self, positions: np.ndarray, named: dict[str, Any]) -> None:
        """The graph numbers the query from the mask (GroupQueryAttention's own rotary: the cached
        tokens, then one position a new token); `position_ids` that say otherwise are refused, not
        dropped."""
        from ...errors import ExportError

        written = self.written(named) if _MASK in named or self.counters else None
        if written is None or positions.ndim != 2:
            return
        expected = written + np.arange(positions.shape[1])
        if not (positions == expected[None, :]).all():
            raise ExportError(f"this ONNX export's GroupQueryAttention places the query at positions "
                              f"{expected.tolist()} (after the {written} cached tokens); position_ids "
                              f"{positions[0].tolist()} differ",
                              remedy="number the new tokens after the cached ones, or export with "
                              "OnnxConfig(group_query_attention=False) to feed positions of your own")

    def written(self, named: dict[str, Any]) -> int:
        """The tokens already in the cache: the first counter's value, else (a cache without
        counters) the last query's own slot in the 4-D mask less the query's other tokens."""
        if self.counters:
            return int(np.asarray(named[self.counters[0]]).reshape(()))
        mask = np.asarray(named[_MASK])
        if mask.ndim == 2:
            return mask.shape[1] - _query_length(named)
        return int(np.flatnonzero(mask[0, 0, -1]).max()) + 1 - _query_length(named)

    def outputs(self, named: dict[str, Any]) -> dict[str, np.ndarray]:
        """The counters the graph no longer returns: each input counter plus the query length."""
        query = _query_length(named)
        return {name: np.asarray(np.asarray(named[name]).reshape(()) + query) for name in self.counters}


def _query_length(named: dict[str, Any]) -> int:
    ids = named.get("input_ids", named.get("inputs_embeds"))
    return int(np.asarray(ids).shape[1])


def two_d_mask(mask: np.ndarray, written: int, query: int) -> np.ndarray:
    """The 2-D int64 mask `[batch, written + query]` the GQA graph takes for the boolean causal `mask`
    `[batch, 1, query, >= written + query]`; padding (a masked slot before the last query's own)
    is refused: GroupQueryAttention counts attended slots, it cannot skip one."""
    from ...errors import ExportError

    total = written + query
    if mask.ndim == 2:
        return mask.astype(np.int64)
    if mask.shape[-1] < total:
        raise ExportError(f"the attention mask covers {mask.shape[-1]} slots; {written} cached + {query} new tokens "
                          f"need {total}", remedy="pass a mask over the cached and new tokens")
    if not mask[:, 0, -1, :total].all():
        raise ExportError("this ONNX export's GroupQueryAttention takes no padding in the mask",
                          remedy="run unpadded sequences one at a time, or export with OnnxConfig(ort_fusions=False)")
    return np.ones((mask.shape[0], total), dtype=np.int64)
