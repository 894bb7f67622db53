"""`GreedySteps`: the decode steps of a greedy generation on a program that keeps its own cache,
with no Python between two runtime calls but what choosing the token needs.

# NOTE: why a second loop beside `GenerationRunner._generate_on`'s: a decode step of the tiny
# Llama's ExecuTorch LLM-runner program took 0.556 ms through the generic loop where a bare loop
# of `method.execute` + argmax took 0.119 ms (`bench/RESULTS.md`, issue 30): the generic step
# builds its input dict, goes through `DecodeState.step` -> `CacheSession.run` -> `run_named` ->
# `run_flat`, applies transformers' processors and concatenates the sequence, which 0.44 ms of
# Python a step is 8-16% of the 134 MB Llama's step. Here the feed is built once by
# `DecodeState._value` (the generic path's own filling), bound to the runtime (`CacheSession.bind`),
# and each step writes the token and its position into it in place, calls the runtime, and takes
# the argmax of the logits' last row. It serves only what needs nothing else: greedy, no logits
# processor, no per-step logits asked for, every input a token, a position or an attention mask
# over the cached and new tokens; anything else stays on the generic loop. A mask changes its
# length each step, so the session fills it itself from the step's token count (`bind(feed,
# masks)`): OpenVINO's stateful model and ONNX Runtime's GroupQueryAttention session (issue 43:
# their generic steps ran at 0.70-0.72x of the vendors' runners on the same int4 folder) bind
# one preallocated row of ones, its first `total` entries each step, and their logits' buffer
# once. A session that cannot (a 4-D mask over a static cache's slots, a cache copied each step)
# returns no call.
"""

from __future__ import annotations

from typing import Any

import torch

from .arrays import as_array

__all__ = ["GreedySteps"]

#: inputs a one-token step fills with the token, and with its position
TOKEN_INPUTS = ("input_ids", "decoder_input_ids")
POSITION_INPUTS = ("position_ids", "decoder_position_ids", "cache_position", "input_pos")


class GreedySteps:
    """The greedy decode steps after the first token, on `state`'s decode session bound to one feed.

    Build with `GreedySteps.of(state, steps)`, which says None where the generic loop must run them.
    """

    def __init__(self, state: Any, call: Any, token: Any, positions: list[Any]):
        self.state = state
        self._call = call  # runs the bound feed given the tokens cached after the step, returns the outputs by name
        self._token = token  # the `[1, 1]` array the next token is written into
        self._positions = positions  # arrays written with the token's position

    @classmethod
    def of(cls, state: Any, steps: int) -> GreedySteps | None:
        """The fast steps of `state` (a `loop.DecodeState` that has run its first call) for up to `steps`
        more tokens, or None where its decode component or session needs the generic loop: an
        input other than the token and its position, a cache passed in and out, or `steps` that
        would overflow the cache (the generic step raises at the step that does)."""
        runner = state.runner
        if state.session is None or state.session[0] != "decode" or state.is_seq2seq or state.rope_delta:
            return None
        fed = runner.fed_inputs("decode")
        masks = tuple(name for name, _, _ in fed if name.endswith("attention_mask"))
        if any(name not in TOKEN_INPUTS + POSITION_INPUTS + masks for name, _, _ in fed):
            return None
        if runner.max_cache_len and state.past + steps > runner.max_cache_len:
            return None
        record = runner.records["decode"]
        ids = torch.zeros((1, 1), dtype=torch.long)
        feed = {name: state._value(record, name, shape, dtype, ids) for name, shape, dtype in fed}
        call = state.session[1].bind(feed, masks, state.past + steps)
        if call is None:
            return None
        arrays = {name: as_array(value) for name, value in feed.items() if name not in masks}
        tokens = [array for name, array in arrays.items() if name in TOKEN_INPUTS]
        if len(tokens) != 1 or any(not _shares(array, feed[name]) for name, array in arrays.items()):
            return None
        positions = [array for name, array in arrays.items() if name in POSITION_INPUTS]
        return cls(state, call, tokens[0], positions)

    def run(self, tokens: list[int], limit: int, eos: frozenset[int], streamer: Any = None) -> None:
        """Feed `tokens[-1]`, append the argmax of the last logits row to `tokens`, and so on
        until `tokens` holds `limit` tokens or ends with one of `eos`; the state counts what was fed."""
        state, call, token_array, positions = self.state, self._call, self._token, self._positions
        past, fed = state.past, []
        try:
            while len(tokens) < limit:
                token_array[...] = tokens[-1]
                for array in positions:
                    array[...] = past
                logits = call(past + 1)["logits"]
                fed.append(tokens[-1])
                past += 1
                token = int(as_array(logits)[0, -1].argmax())
                tokens.append(token)
                if streamer is not None:
                    streamer.put(torch.tensor([token]))
                if token in eos:
                    break
        finally:
            state.past = past
            state.fed += fed


def _shares(array: Any, tensor: torch.Tensor) -> bool:
    """Whether writing into `array` writes into `tensor` (as_array shared its memory)."""
    return array.__array_interface__["data"][0] == tensor.data_ptr()
