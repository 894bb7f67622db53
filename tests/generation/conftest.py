"""Generation cases; the session fixture `saved_generation` is in `tests/conftest.py` (the backend
tests use it too), the exports in `tests/generation/exports.py`."""

from __future__ import annotations

from .exports import CASES, FORMATS, MAX_CACHE_LEN, SavedExport

__all__ = ["CASES", "FORMATS", "MAX_CACHE_LEN", "SavedExport"]
