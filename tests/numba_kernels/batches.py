"""Random mixed prefill/decode batches for the token-kernel tests, and the buffers they fill."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cadence.numba_kernels.launcher import TokenBuffers


@dataclass
class Batch:
    input_ids: np.ndarray  # [T] int64
    last_sampled: np.ndarray  # [max_reqs] int64
    req_indices: np.ndarray  # [rows] int32
    last_token_index: np.ndarray  # [rows] int32
    use_sampled: np.ndarray  # [rows] int32
    sampled: np.ndarray  # [rows] int64
    count: np.ndarray  # [1] int32


def random_batch(
    rng: np.random.Generator, rows: int = 48, max_reqs: int = 64, use_dtype: type = np.int32
) -> Batch:
    # Shapes depend only on (rows, max_reqs), so successive batches fit the same buffers.
    """``count`` live rows drawn from a permutation of requests, each with 1..6 query tokens,
    decode rows (one token, use_sampled=1) mixed with prefill rows; the rows past ``count``
    carry junk that a correct kernel must ignore."""
    n = int(rng.integers(0, rows + 1))
    req = rng.permutation(max_reqs)[:rows].astype(np.int32)
    is_decode = rng.random(rows) < 0.6
    qlens = np.where(is_decode, 1, rng.integers(1, 7, rows))
    ends = np.cumsum(qlens[:n]) - 1
    total = rows * 6 + 4
    last_token_index = rng.integers(0, total, rows).astype(np.int32)  # junk past n
    last_token_index[:n] = ends
    use = is_decode.astype(use_dtype)
    use[n:] = 1  # junk rows would write if they were not ignored
    return Batch(
        input_ids=rng.integers(1000, 2000, total).astype(np.int64),
        last_sampled=rng.integers(0, 1000, max_reqs).astype(np.int64),
        req_indices=req,
        last_token_index=last_token_index,
        use_sampled=use,
        sampled=rng.integers(5000, 6000, rows).astype(np.int64),
        count=np.array([n], np.int32),
    )


def combine_loop(b: Batch) -> np.ndarray:
    """The combine semantics, one row at a time."""
    out = b.input_ids.copy()
    for i in range(int(b.count[0])):
        if b.use_sampled[i] != 0:
            out[b.last_token_index[i]] = b.last_sampled[b.req_indices[i]]
    return out


def scatter_loop(b: Batch) -> np.ndarray:
    """The scatter semantics, one row at a time."""
    out = b.last_sampled.copy()
    for i in range(int(b.count[0])):
        out[b.req_indices[i]] = b.sampled[i]
    return out


def token_buffers(b: Batch, device: str = "cpu") -> TokenBuffers:
    """Kernel buffers holding a copy of ``b`` (``count`` becomes ``num_reqs``)."""
    t = {k: torch.from_numpy(v.copy()).to(device) for k, v in vars(b).items()}
    return TokenBuffers(
        input_ids=t["input_ids"],
        last_sampled=t["last_sampled"],
        req_indices=t["req_indices"],
        last_token_index=t["last_token_index"],
        use_sampled=t["use_sampled"],
        num_reqs=t["count"],
        sampled=t["sampled"],
    )


def load_batch(bufs: TokenBuffers, b: Batch) -> None:
    """Copy a batch of the same shapes into existing buffers, as a later step would."""
    for name, value in vars(b).items():
        getattr(bufs, "num_reqs" if name == "count" else name).copy_(torch.from_numpy(value))
