"""Numpy reference versions of the token kernels (the CPU backend runs these).

Both take the row count as a 1-element int32 array, exactly like the device kernels, and skip
rows whose indices fall outside the target arrays (they can only come from padding).
"""

from __future__ import annotations

import numpy as np


def combine_reference(
    input_ids: np.ndarray,
    last_sampled: np.ndarray,
    req_indices: np.ndarray,
    last_token_index: np.ndarray,
    use_sampled: np.ndarray,
    count: np.ndarray,
) -> None:
    """For rows ``b < count[0]`` with ``use_sampled[b] != 0``:
    ``input_ids[last_token_index[b]] = last_sampled[req_indices[b]]`` (in place)."""
    n = int(count[0])
    rows = np.flatnonzero(use_sampled[:n] != 0)
    dst = last_token_index[rows].astype(np.int64)
    src = req_indices[rows].astype(np.int64)
    ok = (dst >= 0) & (dst < input_ids.shape[0]) & (src >= 0) & (src < last_sampled.shape[0])
    input_ids[dst[ok]] = last_sampled[src[ok]]


def scatter_reference(
    sampled: np.ndarray, req_indices: np.ndarray, last_sampled: np.ndarray, count: np.ndarray
) -> None:
    """For rows ``i < count[0]``: ``last_sampled[req_indices[i]] = sampled[i]`` (in place)."""
    n = int(count[0])
    dst = req_indices[:n].astype(np.int64)
    ok = (dst >= 0) & (dst < last_sampled.shape[0])
    last_sampled[dst[ok]] = sampled[:n][ok]
