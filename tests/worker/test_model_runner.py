from __future__ import annotations

import pytest

from cadence.worker.model_runner import largest_step_layout


@pytest.mark.parametrize(
    ("tokens", "seqs", "model_len", "expected"),
    [
        (8192, 1, 153, [153]),
        (8192, 32, 153, [153] * 32),
        (8192, 128, 400, [400] * 20 + [192]),
        (100, 4, 64, [64, 36]),
    ],
)
def test_largest_step_layout(tokens, seqs, model_len, expected):
    lens = largest_step_layout(tokens, seqs, model_len)
    assert lens == expected
    assert len(lens) <= seqs and max(lens) <= model_len and sum(lens) <= tokens
