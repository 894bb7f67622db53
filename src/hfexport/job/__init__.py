"""The export job and what runs many of them: `export.py` (`export_to_folder`, the one job every
front end calls), `options.py` (its `JobOptions`, in groups that check themselves), `batch.py` and
`batch_item.py` (`export-many`: a page of exports, resumable), `executors.py` (where a batch's cells
run: here, or on Ray).

`from hfexport.job import export_to_folder, JobOptions` is the documented import. Its names are
imported on first use, as `hfexport`'s are: importing `hfexport.job.executors` (a Ray driver, the
coverage matrix) does not load the export job and torch's exporters with it."""

from __future__ import annotations

from ..registry import lazy_names as _lazy_names

#: The documented names, by the module that defines them.
_LAZY = {**dict.fromkeys(("export_to_folder", "ExportJobResult", "default_min_cosine", "default_min_cache_cosine",
                          "default_min_agreement"), "hfexport.job.export"),
         **dict.fromkeys(("JobOptions", "LoadingOptions", "JudgingOptions", "GenerationOptions"), "hfexport.job.options")}

__all__ = ["export_to_folder", "JobOptions", "LoadingOptions", "JudgingOptions", "GenerationOptions",
           "ExportJobResult", "default_min_cosine", "default_min_cache_cosine", "default_min_agreement"]

__getattr__, __dir__ = _lazy_names(__name__, _LAZY)
