"""Patches and FX fixes for the ONNX backend (none needed with the tested versions)."""
