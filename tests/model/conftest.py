from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def single_thread_torch() -> Iterator[None]:
    """The model tests multiply tiny matrices: one intra-op thread is faster, and immune to the
    spin-wait slowdowns of a busy 2-core machine."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
