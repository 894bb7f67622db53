"""Patches and FX fixes for the ONNX backend: none of its own with the tested versions.

ATen ops torch.onnx does not translate get a translation in `translations.py`; the workarounds
every format needs are in `hfexport/models/` (`hfexport patches --format onnx` lists them).
"""
