"""`as_array`: a generation step's small input tensor as the numpy array a runtime binds.

# NOTE: a decode step runs Python between two runtime calls, with the CPU caches just flushed
# by the model's weights (`bench/RESULTS.md`, issue 31/32 sections: 150-260 us of a test model's
# step outside the runtime became 680-750 us with 134 MB streamed through the caches): every
# torch call counts, and `runner.to_numpy` makes four per input
# (`detach().cpu().contiguous().numpy()`). The loop's inputs are CPU tensors without grad, most
# already contiguous: one `numpy()` call gives the same array.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runner import to_numpy

__all__ = ["as_array"]


def as_array(value: Any) -> np.ndarray:
    """`value` (a tensor or an array) as a C-contiguous numpy array sharing its memory where it
    can; 0-d stays 0-d, as `runner.to_numpy` gives it."""
    if isinstance(value, np.ndarray):
        return value if value.flags.c_contiguous else np.ascontiguousarray(value).reshape(value.shape)
    try:
        array = value.numpy()  # refuses a tensor that needs grad or is not on the CPU
    except (RuntimeError, TypeError):
        return to_numpy(value)
    return array if array.flags.c_contiguous else to_numpy(value)
