"""Patches and FX fixes for the `torch.export` backend (none needed with the tested versions).

Shared capture workarounds register for every backend in `hfexport/capture/patches.py`.
"""
