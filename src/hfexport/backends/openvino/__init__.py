"""The OpenVINO backend: the captured program converted by `openvino.convert_model`.

`config.py` (`OpenVINOConfig`), `exporter.py` (`OpenVINOExporter`), `artifact.py`
(`HfOpenVINOModel`), `runner.py` (`OpenVINORunner`), `patches.py`, and `precision.py` (the
inference precision recorded with the model). Importing this package imports no OpenVINO; the
exporter, artifact and runner modules do.
"""

from .config import OpenVINOConfig

__all__ = ["OpenVINOConfig"]
