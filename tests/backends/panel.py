"""The architecture panel every backend's parity tests run (tiny presets from `hfexport.presets`):
decoder-only, sliding window (Mistral, window 4 < 8 tokens), MoE, encoder, encoder-decoder
(text and speech), vision and audio — and the one table of known failures.

A known failure is a strict xfail: when upstream fixes it, the test passes unexpectedly and fails
the run, so the entry gets removed.
"""

from __future__ import annotations

import pytest

PANEL = ["llama", "qwen3", "gpt2", "mistral", "qwen3_moe", "bert", "t5", "vit", "whisper", "wav2vec2"]

#: (backend, preset) -> (reason, upstream reference)
KNOWN_FAILURES: dict[tuple[str, str], tuple[str, str]] = {
}


def panel_params(backend: str) -> list:
    """`PANEL` as pytest params, known failures of `backend` marked strict xfail with their reason."""
    params = []
    for name in PANEL:
        known = KNOWN_FAILURES.get((backend, name))
        marks = [pytest.mark.xfail(reason=f"{known[0]} [{known[1]}]", strict=True)] if known else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params
