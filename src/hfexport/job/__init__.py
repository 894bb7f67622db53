"""The export job and what runs many of them: `export.py` (`export_to_folder`, the one job every
front end calls, and its `JobOptions`), `batch.py` and `batch_item.py` (`export-many`: a page of
exports, resumable), `executors.py` (where a batch's cells run: here, or on Ray).

`from hfexport.job import export_to_folder, JobOptions` is the documented import; importing this
package imports `export.py` only."""

from .export import (ExportJobResult, JobOptions, default_min_agreement, default_min_cache_cosine,
                     default_min_cosine, export_to_folder)

__all__ = ["export_to_folder", "JobOptions", "ExportJobResult", "default_min_cosine", "default_min_cache_cosine",
           "default_min_agreement"]
