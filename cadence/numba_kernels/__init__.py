"""combine (last sampled token -> next input ids) and scatter (sampled ids -> last_sampled).

``reference`` holds the numpy versions; ``kernels`` the Numba CUDA kernels (importing it imports
``numba.cuda``); ``launcher`` the persistent-buffer launchers the model runner uses.
"""

from __future__ import annotations

from cadence.numba_kernels.launcher import (
    HostTokenKernels,
    NumbaTokenKernels,
    TokenBuffers,
    make_token_kernels,
)
from cadence.numba_kernels.reference import combine_reference, scatter_reference

__all__ = [
    "HostTokenKernels",
    "NumbaTokenKernels",
    "TokenBuffers",
    "combine_reference",
    "make_token_kernels",
    "scatter_reference",
]
