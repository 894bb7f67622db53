"""Patches and FX fixes for the `torch.export` backend: none of its own with the tested versions.

The workarounds every format needs are in `hfexport/models/` (torch's and transformers' export
bugs); `hfexport patches --format dynamo` lists those that apply.
"""
