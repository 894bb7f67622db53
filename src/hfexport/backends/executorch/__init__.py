"""The ExecuTorch backend: the captured program lowered to a `.pte` (XNNPACK by default).

`config.py` (`ExecutorchConfig`), `exporter.py` (`ExecutorchExporter`), `artifact.py` (`.pte` files),
`runner.py` (`ExecutorchRunner`), `patches.py` (its FX fixes), and `delegates.py` (which
partitioner a delegate uses, and whether it runs here), `partitioner.py` (XNNPACK's),
`folding.py` (weight-only math folded), `planning.py` (memory plan bounds and checks),
`external.py` (weights in a `.ptd` beside the `.pte`), `llm.py` (the program ExecuTorch's LLM
runner loads), `llm_export.py` (which static-cache exports get it), `compat.py` (ExecuTorch's
non-public names).
Importing this package imports no ExecuTorch; the exporter, artifact and runner modules do.
"""

from .config import ExecutorchConfig

__all__ = ["ExecutorchConfig"]
