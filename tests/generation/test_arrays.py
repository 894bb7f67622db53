"""`as_array` gives the array `runner.to_numpy` gives, without a copy where the tensor allows."""

from __future__ import annotations

import numpy as np
import torch

from hfexport.generation.arrays import as_array
from hfexport.runner import to_numpy


def test_as_array_is_to_numpy_for_every_kind_of_tensor():
    base = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    for tensor in (base, base.t(), torch.tensor(5), base[:, 1:], torch.ones(2, requires_grad=True), base.numpy()):
        array = as_array(tensor)
        expected = tensor if isinstance(tensor, np.ndarray) else to_numpy(tensor)
        assert array.flags.c_contiguous and array.shape == expected.shape and array.dtype == expected.dtype
        np.testing.assert_array_equal(array, expected)
    assert np.shares_memory(as_array(base), base.numpy())  # no copy of a contiguous tensor
