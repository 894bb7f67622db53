"""The export job and what runs many of them: `export.py` (`export_to_folder`, the one job every
front end calls), `options.py` (its `JobOptions`, in groups that check themselves), `batch.py` and
`batch_item.py` (`export-many`: a page of exports, resumable), `executors.py` (where a batch's cells
run: here, or on Ray).

`from hfexport.job import export_to_folder, JobOptions` is the documented import; importing this
package imports `export.py` and `options.py` only."""

from .export import (ExportJobResult, GenerationOptions, JobOptions, JudgingOptions, LoadingOptions,
                     default_min_agreement, default_min_cache_cosine, default_min_cosine, export_to_folder)

__all__ = ["export_to_folder", "JobOptions", "LoadingOptions", "JudgingOptions", "GenerationOptions",
           "ExportJobResult", "default_min_cosine", "default_min_cache_cosine", "default_min_agreement"]
