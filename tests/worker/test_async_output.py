"""A step's output rows: sample i belongs to request row ``rows[i]`` (a partial prefill chunk
samples nothing, so rows skip it); tokens, logprob rows, ranks and the in-flight peek follow."""

from __future__ import annotations

import numpy as np
import torch

from cadence.worker.async_output import PendingOutput, build_output


def test_samples_land_on_their_requests_rows() -> None:
    # "a" is mid-prefill (no sample); "b" and "c" sampled 7 and 9.
    out = build_output(["a", "b", "c"], np.array([1, 2]), [7, 9],
                       ([[7, 3], [9, 4]], [[-0.1, -2.0], [-0.2, -3.0]], [1, 4]))
    assert out.sampled_token_ids == [[], [7], [9]]
    assert out.logprobs is not None
    assert out.logprobs.logprob_token_ids == [[], [7, 3], [9, 4]]
    assert out.logprobs.logprobs == [[], [-0.1, -2.0], [-0.2, -3.0]]
    assert out.logprobs.sampled_token_ranks == [0, 1, 4]


class _Slot:
    def fetch(self, n: int) -> torch.Tensor:
        return torch.tensor([7, 9][:n])


def test_the_peek_names_each_samples_request() -> None:
    pending = PendingOutput(copier=None, slot=_Slot(), n=2, req_ids=["a", "b", "c"],
                            rows=np.array([1, 2]), logprobs=None)
    assert pending.peek() == {"b": 7, "c": 9}
    pending.done = True
    assert pending.peek() == {}
