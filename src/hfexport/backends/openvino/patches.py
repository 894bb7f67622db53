"""Patches and FX fixes for the OpenVINO backend.

Registered here: the shared `fix_cat_empty_legacy_input` (see `hfexport/fx_fixes.py`).
"""

from ... import fx_fixes  # noqa: F401  (registers the shared FX fixes this backend needs)
