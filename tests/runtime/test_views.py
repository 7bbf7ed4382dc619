from __future__ import annotations

import numpy as np
import pytest
import torch

from cadence.runtime.views import byte_range, numpy_view, torch_view


def test_byte_range_defaults_and_bounds() -> None:
    assert byte_range(64, 8, None, 0) == ((8,), 64)
    assert byte_range(64, 4, (2, 3), 8) == ((2, 3), 24)
    with pytest.raises(ValueError, match="exceeds"):
        byte_range(64, 8, (9,), 0)
    with pytest.raises(ValueError, match="multiple"):
        byte_range(64, 8, None, 4)


def test_views_alias_the_flat_memory() -> None:
    flat = torch.zeros(32, dtype=torch.uint8)
    t = torch_view(flat, torch.int32, (2, 2), 16)
    t[1, 1] = 0x01020304
    n = numpy_view(flat.numpy(), np.int32, None, 0)
    assert n.shape == (8,)
    assert n[7] == 0x01020304
    b = torch_view(flat, torch.bfloat16, (4,), 0)
    b.fill_(1.5)
    assert torch_view(flat, torch.bfloat16, (4,), 0).tolist() == [1.5] * 4
