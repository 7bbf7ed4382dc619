"""Programmatic dependent launch (PDL) for the decoder's own Triton kernels (sm_90 and newer).

A kernel launched with PDL may start while the kernel before it on the stream is finishing: its
programs first wait on the grid dependency (``griddepcontrol.wait``: the previous grid has
completed and its memory is visible), then let the next PDL kernel launch, then work. Inside a
CUDA graph of small decode kernels this hides most of each launch's latency behind the previous
kernel's tail. Kernels take a ``PDL`` constexpr that puts ``pdl_prologue()`` first; their
launchers pass ``PDL=use_pdl(x)`` and ``launch_pdl=use_pdl(x)`` together.
``CADENCE_DISABLE_PDL=1`` turns it off.
"""

from __future__ import annotations

import os

import torch

from cadence.envs import read_envs

try:
    import triton
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - CPU installs, or a Triton without grid dependency control
    triton = None

__all__ = ["pdl_prologue", "use_pdl"]

_ENABLED = (
    triton is not None
    and not read_envs().disable_pdl
    and os.environ.get("TRITON_INTERPRET", "0") != "1"
)
_BY_DEVICE: dict[int, bool] = {}  # device index -> capability 9.0 or newer

pdl_prologue = None
if triton is not None:

    @triton.jit
    def pdl_prologue():
        # NOTE: nothing may touch memory before the wait: the previous kernel may still run.
        gdc_wait()
        gdc_launch_dependents()


def use_pdl(x: torch.Tensor) -> bool:
    """Whether kernels working on ``x``'s device launch with PDL."""
    if not _ENABLED:
        return False
    index = x.get_device()
    found = _BY_DEVICE.get(index)
    if found is None:
        found = index >= 0 and torch.cuda.get_device_capability(index)[0] >= 9
        _BY_DEVICE[index] = found
    return found
