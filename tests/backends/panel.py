"""The architecture panel every backend's parity tests run (tiny presets from `hfexport.presets`):
decoder-only, sliding window (Mistral, window 4 < 8 tokens), MoE, encoder, encoder-decoder
(text and speech), vision and audio.

Its known failures are the `export` entries of the one table, `hfexport.coverage.KNOWN_FAILURES`:
each is a strict xfail, so when upstream fixes it the test passes unexpectedly and fails the run,
and the entry gets removed.
"""

from __future__ import annotations

import pytest

from tests.harness import known_failure_marks

PANEL = ["llama", "qwen3", "gpt2", "mistral", "qwen3_moe", "bert", "t5", "vit", "whisper", "wav2vec2"]


def panel_params(backend: str) -> list:
    """`PANEL` as pytest params, known failures of `backend` marked strict xfail with their reason."""
    return [pytest.param(name, marks=known_failure_marks(name, backend, "export"), id=name) for name in PANEL]
