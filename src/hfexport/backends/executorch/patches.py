"""Patches and FX fixes for the ExecuTorch backend.

Also registered for it: the MoE experts switch to `batched_mm` (`hfexport/models/moe.py`).
"""
