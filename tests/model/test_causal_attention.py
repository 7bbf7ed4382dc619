"""The dense causal attention kernel (model/causal_attention.py) against a float64 reference:
lengths that are not a multiple of the block, grouped-query heads, packed heads, padded head
dims, strided views of one qkv projection, both launch orders. On the CPU through Triton's
interpreter (float16 and float32: its bfloat16 dot is not the GPU's), on the GPU in bf16."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":  # the interpreter driver: before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest  # noqa: E402
import torch  # noqa: E402

from cadence.model.causal_attention import CausalTile, causal_attention  # noqa: E402
from tests.model.causal_reference import causal_reference  # noqa: E402
from tests.model.triton_interpreter import DONE, patch_interpreter, run_interpreted  # noqa: E402


def qkv_views(t: int, h: int, hk: int, d: int, dtype: torch.dtype, device: str, seed: int):
    """q, k, v as strided views of one projection's output, as the model hands them over."""
    g = torch.Generator(device=device).manual_seed(seed)
    qkv = torch.randn(t, (h + 2 * hk) * d, generator=g, device=device).to(dtype)
    q, k, v = qkv.split([h * d, hk * d, hk * d], dim=-1)
    return q.view(t, h, d), k.view(t, hk, d), v.view(t, hk, d)


def check(t: int, h: int, hk: int, d: int, dtype: torch.dtype, device: str, tile: CausalTile,
          sms: int, tol: float, window: int = 0, softcap: float = 0.0) -> None:
    q, k, v = qkv_views(t, h, hk, d, dtype, device, seed=t * 7 + h + d)
    if softcap > 0:  # scores past the cap, so that it bites
        q = q * 4
    out = torch.full((t, h, d), float("nan"), dtype=dtype, device=device)
    scale = d**-0.5
    assert causal_attention(q, k, v, out, scale, num_sms=sms, tile=tile,
                            sliding_window=window, softcap=softcap) is out
    err = (out.double() - causal_reference(q, k, v, scale, window, softcap)).abs().max().item()
    assert err < tol, (t, h, hk, d, dtype, tile, sms, window, softcap, err)


INTERPRETED = [
    # (tokens, heads, kv heads, head dim, tile, SMs)
    (37, 4, 2, 32, CausalTile(16, 1, 16, 4, 2), 0),
    (64, 4, 2, 32, CausalTile(32, 1, 16, 4, 2), 3),
    (70, 4, 2, 32, CausalTile(16, 2, 16, 4, 2), 2),
    (50, 4, 1, 16, CausalTile(16, 4, 16, 4, 2), 1),
    (33, 2, 2, 40, CausalTile(16, 1, 16, 4, 2), 100),  # head dim padded to 64
    (1, 2, 1, 16, CausalTile(16, 1, 16, 4, 2), 4),
]
WINDOWED = [
    # (tokens, heads, kv heads, head dim, tile, SMs, window, cap): windows shorter than a
    # block, of a block and a half, ending mid-tile, as long as the prompt; caps with and
    # without a window.
    (70, 4, 2, 32, CausalTile(32, 1, 16, 4, 2), 2, 5, 0.0),
    (70, 4, 2, 32, CausalTile(16, 1, 16, 4, 2), 0, 24, 0.0),
    (67, 2, 1, 16, CausalTile(32, 2, 16, 4, 2), 3, 37, 0.0),
    (40, 2, 2, 16, CausalTile(16, 1, 16, 4, 2), 0, 40, 0.0),
    (45, 4, 2, 32, CausalTile(16, 1, 16, 4, 2), 2, 0, 1.5),
    (60, 2, 1, 16, CausalTile(32, 1, 16, 4, 2), 1, 19, 2.0),
]


def run_interpreter_cases() -> None:
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 4e-3)):
        for t, h, hk, d, tile, sms in INTERPRETED:
            check(t, h, hk, d, dtype, "cpu", tile, sms, tol)
        for t, h, hk, d, tile, sms, window, cap in WINDOWED:
            check(t, h, hk, d, dtype, "cpu", tile, sms, tol, window, cap)


# --- CPU ----------------------------------------------------------------------------------------


def test_the_kernel_in_the_interpreter() -> None:
    run_interpreted(__file__)


def test_tiles_are_checked() -> None:
    with pytest.raises(ValueError, match="block_m must be a power of two"):
        CausalTile(block_m=48)
    with pytest.raises(ValueError, match="multiple of block_n"):
        CausalTile(block_m=32, block_n=64)
    with pytest.raises(ValueError, match="pack must be"):
        CausalTile(pack=3)
    with pytest.raises(ValueError, match="bad launch options"):
        CausalTile(num_warps=3)


def test_bad_shapes_are_value_errors() -> None:
    q, k, v = qkv_views(8, 4, 2, 16, torch.float32, "cpu", 0)
    out = torch.empty(8, 4, 16)
    with pytest.raises(ValueError, match="shapes do not match"):
        causal_attention(q, k[:4], v, out, 0.25)
    with pytest.raises(ValueError, match="shapes do not match"):
        causal_attention(q[:, :3], k, v, out[:, :3], 0.25)  # 3 heads over 2 kv heads
    with pytest.raises(ValueError, match="contiguous last dim"):
        causal_attention(q, k, v, torch.empty(8, 4, 32)[:, :, ::2], 0.25)
    with pytest.raises(ValueError, match="pack 4 does not divide"):
        causal_attention(q, k, v, out, 0.25, tile=CausalTile(pack=4))
    with pytest.raises(ValueError, match="sliding_window and softcap"):
        causal_attention(q, k, v, out, 0.25, sliding_window=-1)
    with pytest.raises(ValueError, match="sliding_window and softcap"):
        causal_attention(q, k, v, out, 0.25, softcap=-2.0)


# --- GPU ----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(("t", "h", "hk", "d"), [(1, 16, 8, 128), (100, 16, 8, 128),
                                                 (1000, 16, 8, 128), (1024, 32, 8, 128),
                                                 (777, 12, 4, 64), (300, 8, 8, 96),
                                                 (2048, 16, 8, 128)])
@pytest.mark.parametrize("sms", [0, 132])
def test_the_kernel_on_the_gpu(t: int, h: int, hk: int, d: int, sms: int) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    check(t, h, hk, d, torch.bfloat16, "cuda", CausalTile(), sms, 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize(("t", "h", "hk", "d", "window", "cap"), [
    (1000, 16, 8, 128, 100, 0.0), (2048, 16, 8, 128, 1024, 0.0), (777, 32, 8, 96, 2047, 0.0),
    (500, 8, 4, 128, 0, 50.0), (1500, 8, 4, 128, 512, 30.0), (300, 16, 8, 64, 4096, 0.0)])
def test_windows_and_caps_on_the_gpu(t: int, h: int, hk: int, d: int, window: int,
                                     cap: float) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    check(t, h, hk, d, torch.bfloat16, "cuda", CausalTile(), 132, 2e-2, window, cap)


if __name__ == "__main__":
    patch_interpreter()
    run_interpreter_cases()
    print(DONE)
