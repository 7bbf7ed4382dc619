from __future__ import annotations

import numpy as np
import pytest
import torch

from cadence.numba_kernels.launcher import HostTokenKernels, TokenBuffers, make_token_kernels
from tests.numba_kernels.batches import (
    combine_loop,
    load_batch,
    random_batch,
    scatter_loop,
    token_buffers,
)


def test_host_kernels_follow_the_buffers_across_steps() -> None:
    rng = np.random.default_rng(0)
    first = random_batch(rng)
    bufs = token_buffers(first)
    kernels = make_token_kernels(bufs)
    assert isinstance(kernels, HostTokenKernels)
    for step in range(5):
        b = first if step == 0 else random_batch(rng)
        load_batch(bufs, b)
        kernels.combine()
        kernels.scatter()
        np.testing.assert_array_equal(bufs.input_ids.numpy(), combine_loop(b))
        np.testing.assert_array_equal(bufs.last_sampled.numpy(), scatter_loop(b))


def test_separate_scatter_count() -> None:
    b = random_batch(np.random.default_rng(3))
    b.count[0] = 10
    bufs = token_buffers(b)
    bufs.num_sampled = torch.tensor([4], dtype=torch.int32)
    HostTokenKernels(bufs).scatter()
    b.count[0] = 4
    np.testing.assert_array_equal(bufs.last_sampled.numpy(), scatter_loop(b))


def test_buffer_validation() -> None:
    b = random_batch(np.random.default_rng(1))
    good = token_buffers(b)
    with pytest.raises(TypeError, match="req_indices"):
        TokenBuffers(**{**vars(good), "req_indices": good.req_indices.long()})
    with pytest.raises(ValueError, match="sampled"):
        TokenBuffers(**{**vars(good), "sampled": good.sampled[:-1]})
    with pytest.raises(ValueError, match="num_reqs"):
        TokenBuffers(**{**vars(good), "num_reqs": torch.zeros(2, dtype=torch.int32)})


@pytest.mark.gpu
def test_numba_launcher_on_runtime_stream_and_inside_a_captured_graph() -> None:
    from cadence.numba_kernels.launcher import NumbaTokenKernels
    from cadence.runtime import get_device

    dev = get_device("cuda")
    main = dev.create_stream()
    rng = np.random.default_rng(7)
    first = random_batch(rng, rows=200, max_reqs=256)
    bufs = token_buffers(first, "cuda")
    torch.cuda.synchronize()  # made on torch's stream, which main does not wait for
    kernels = make_token_kernels(bufs)
    assert isinstance(kernels, NumbaTokenKernels)

    # Eager on the runtime stream.
    kernels.combine(main)
    kernels.scatter(main)
    main.synchronize()
    assert kernels.direct_launch  # one cuLaunchKernel per launch, no per-call dispatch
    np.testing.assert_array_equal(bufs.input_ids.cpu().numpy(), combine_loop(first))
    np.testing.assert_array_equal(bufs.last_sampled.cpu().numpy(), scatter_loop(first))

    # Captured once, replayed with new buffer contents and counts.
    torch.cuda.synchronize()
    with main.capture() as graph:
        kernels.combine(main)
        kernels.scatter(main)
    assert graph.kernel_count == 2
    for _ in range(4):
        b = random_batch(rng, rows=200, max_reqs=256)
        with main.context():
            load_batch(bufs, b)
        graph.launch(main)
        main.synchronize()
        np.testing.assert_array_equal(bufs.input_ids.cpu().numpy(), combine_loop(b))
        np.testing.assert_array_equal(bufs.last_sampled.cpu().numpy(), scatter_loop(b))
    graph.close()
    main.close()


def test_a_numpy_that_numba_cuda_cannot_use_is_a_clear_error() -> None:
    import numpy
    import pytest

    from cadence.numba_kernels.launcher import check_numba_cuda

    def broken() -> None:
        raise AttributeError("module 'numpy' has no attribute 'row_stack'")

    with pytest.raises(RuntimeError, match=rf"does not work with numpy {numpy.__version__}"):
        check_numba_cuda(broken)

    def other() -> None:
        raise AttributeError("'Foo' object has no attribute 'bar'")

    with pytest.raises(AttributeError, match="bar"):  # a real bug is not disguised
        check_numba_cuda(other)
    check_numba_cuda(lambda: None)
