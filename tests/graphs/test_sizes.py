from __future__ import annotations

import pytest

from cadence.graphs.sizes import capture_sizes, padded_batch_size, token_capture_sizes


def test_capture_sizes_follow_the_pattern_and_end_at_max() -> None:
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(4) == [1, 2, 4]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    full = capture_sizes(256)
    assert full[:5] == [1, 2, 4, 8, 16] and full[-3:] == [240, 248, 256]
    assert len(full) == 3 + 31 + 1
    big = capture_sizes(300)
    assert big[-5:] == [248, 256, 272, 288, 300]
    assert capture_sizes(512)[-2:] == [496, 512]
    for m in (1, 7, 100, 255, 257, 1000):
        sizes = capture_sizes(m)
        assert sizes == sorted(set(sizes)) and sizes[-1] == m
    with pytest.raises(ValueError):
        capture_sizes(0)


def test_padded_batch_size_picks_the_smallest_bucket() -> None:
    sizes = capture_sizes(100)
    assert padded_batch_size(1, sizes) == 1
    assert padded_batch_size(3, sizes) == 4
    assert padded_batch_size(9, sizes) == 16
    assert padded_batch_size(96, sizes) == 96
    assert padded_batch_size(97, sizes) == 100
    assert padded_batch_size(101, sizes) is None
    assert padded_batch_size(0, sizes) is None
    for n in range(1, 101):
        b = padded_batch_size(n, sizes)
        assert b is not None and b >= n
        assert all(s < n for s in sizes if s < b)


@pytest.mark.parametrize(
    ("tokens", "size", "ok"),
    [
        # size^2 against 1.15 * tokens^2, worked by hand.
        (1000, 1024, True),  # 1,048,576 <= 1,150,000
        (955, 1024, True),  # 1,048,576 <= 1,048,878
        (954, 1024, False),  # 1,048,576 > 1,046,681
        (45, 48, True),  # 2,304 <= 2,328.75
        (44, 48, False),  # 2,304 > 2,226.4
        (48, 48, True),
        (0, 48, False),
        (49, 48, False),  # does not fit
    ],
)
def test_dense_padding_ok(tokens, size, ok):
    from cadence.graphs.sizes import dense_padding_ok

    assert dense_padding_ok(tokens, size) is ok


def test_token_capture_sizes_step_16_up_to_256_then_8_a_doubling() -> None:
    """The docstring's pattern, written out: 16, 32, ..., 256 (256 included), then 32 apart
    up to 512, 64 apart up to 1024; the largest given exactly."""
    assert token_capture_sizes(512) == [*range(16, 257, 16), *range(288, 513, 32)]
    assert token_capture_sizes(1000) == [*range(16, 257, 16), *range(288, 513, 32),
                                         *range(576, 961, 64), 1000]
    assert token_capture_sizes(256)[-2:] == [240, 256]
    assert token_capture_sizes(15) == []
