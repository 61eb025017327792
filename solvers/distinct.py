"""Sorted distinct values of an array, as `np.unique(values)` gives them.

`np.unique` without index outputs asks `np.ma.is_masked` of its input, which imports `numpy.ma`
(6.5 ms) in the first process that calls it: every unit worker of a search paid it on its first
solve, on the first batch's critical path. Floats here are never NaN (NaN would need
`np.unique`'s `equal_nan` handling).
"""

from __future__ import annotations

import numpy as np


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of `values` (flattened): `np.unique(values)` for arrays without NaN."""
    out = np.sort(np.asarray(values).ravel())
    if len(out) < 2:
        return out
    return out[np.concatenate(([True], out[1:] != out[:-1]))]
