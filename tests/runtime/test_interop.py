from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu


def test_cupy_views_and_dlpack() -> None:
    cp = pytest.importorskip("cupy")
    from cadence.runtime import get_device
    from cadence.runtime.interop import cupy_view, to_cupy, to_torch

    dev = get_device("cuda")
    with dev.alloc_device(1024) as dbuf, dev.alloc_pinned(1024) as hbuf:
        a = cupy_view(dbuf, cp.int32, (16, 16))
        a[...] = cp.arange(256, dtype=cp.int32).reshape(16, 16)
        cp.cuda.runtime.deviceSynchronize()
        assert dbuf.torch(torch.int32)[17].item() == 17  # same memory as the torch view
        h = cupy_view(hbuf, cp.float32, (256,))
        h[...] = 3.0  # a device kernel writing mapped pinned memory
        cp.cuda.runtime.deviceSynchronize()
        assert (hbuf.numpy(np.float32) == 3.0).all()
        t = torch.arange(10, device="cuda", dtype=torch.float32)
        c = to_cupy(t)
        c *= 2
        torch.cuda.synchronize()
        assert t[3].item() == 6.0
        back = to_torch(c)
        assert back.data_ptr() == t.data_ptr()
