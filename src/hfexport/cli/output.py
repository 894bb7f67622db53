"""The CLI's output folder: see `hfexport.storage` (shared with `save_generation_export`)."""

from ..storage import check_target, staged_folder

__all__ = ["check_target", "staged_folder"]
