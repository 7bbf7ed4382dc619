"""The greedy argmax kernels against ``torch.argmax`` (the definition: the first index of the
largest value, a NaN above every number, -0.0 equal to 0.0): on the CPU through Triton's
interpreter, on the GPU compiled; the sampler's plain greedy path."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":  # the interpreter driver: before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest  # noqa: E402
import torch  # noqa: E402

from cadence.worker.greedy_argmax import (  # noqa: E402
    BLOCK,
    ArgmaxScratch,
    argmax_rows,
    triton_applies,
    triton_argmax,
)
from tests.model.triton_interpreter import DONE, patch_interpreter, run_interpreted  # noqa: E402

NAN, INF = float("nan"), float("inf")


def cases(device: str, vocabs: tuple[int, ...]) -> list[torch.Tensor]:
    """Logits whose argmax is easy to get wrong: ties inside a block and across blocks, NaN
    against inf, rows of -inf, signed zeros, a last block that is mostly padding, a strided
    view."""
    g = torch.Generator().manual_seed(0)
    out = []
    for vocab in vocabs:
        x = torch.randn(6, vocab, generator=g)
        x[0, vocab // 3] = x[0, vocab - 1] = 50.0  # tie: the first wins
        if vocab > BLOCK:
            x[1, BLOCK - 1] = x[1, BLOCK] = 60.0  # tie across a block boundary
        x[2] = -INF
        x[3, vocab // 2] = INF
        x[3, vocab - 1] = NAN  # NaN above inf
        x[3, vocab // 4 + 1] = -NAN  # and the first NaN wins, whatever its sign
        x[4] = -1.0
        x[4, vocab // 5] = -0.0  # -0.0 == 0.0: the first of the two
        x[4, vocab // 5 + 1] = 0.0
        out.append(x.to(device))
    wide = torch.randn(3, 2 * vocabs[-1] + 40, generator=g)
    out.append(wide[:, 7 : 7 + vocabs[-1]].to(device))  # rows of a wider tensor: stride 0 > V
    out.append(torch.randn(1, vocabs[-1], generator=g).to(device))
    return out


def check(device: str, vocabs: tuple[int, ...]) -> None:
    scratch = ArgmaxScratch()  # shared by every case: it grows and is reused
    for x in cases(device, vocabs):
        assert torch.equal(triton_argmax(x, scratch), x.argmax(dim=-1)), x.shape
        # A model's own 16-bit logits: rounding makes more ties, which the first index breaks.
        for dtype in (torch.bfloat16, torch.float16):
            y = x.to(dtype)
            assert torch.equal(triton_argmax(y, scratch), y.float().argmax(dim=-1)), (dtype,
                                                                                      x.shape)


def test_cpu_and_other_dtypes_take_torch_argmax() -> None:
    x = torch.randn(3, 100)
    assert not triton_applies(x)
    assert torch.equal(argmax_rows(x, ArgmaxScratch()), x.argmax(dim=-1))
    if torch.cuda.is_available():
        assert not triton_applies(x.cuda().double()) and not triton_applies(x.cuda().t())
        assert not triton_applies(x.cuda()[:0]) and triton_applies(x.cuda())
        assert triton_applies(x.cuda().bfloat16()) and triton_applies(x.cuda().half())


def test_the_sampler_takes_the_argmax_of_plain_greedy_rows_without_copying() -> None:
    from cadence.worker.sampler import Sampler, SamplingMetadata

    logits = torch.randn(4, 50)
    logits[1, 3] = logits[1, 9] = 99.0
    before = logits.clone()
    got = Sampler()(logits, SamplingMetadata.greedy()).sampled_token_ids
    assert got.tolist() == [int(r.argmax()) for r in before] and got.tolist()[1] == 3
    assert torch.equal(logits, before)


def test_the_cpu_warm_up_is_harmless() -> None:
    from cadence.worker.sampler import Sampler, SamplingMetadata

    sampler = Sampler()
    sampler.warm_up(50, torch.device("cpu"))
    logits = torch.randn(2, 50)
    assert torch.equal(sampler(logits, SamplingMetadata.greedy()).sampled_token_ids,
                       logits.argmax(dim=-1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_warm_up_compiles_what_the_first_step_launches(dtype: torch.dtype) -> None:
    from cadence.worker import greedy_argmax as ga
    from cadence.worker.sampler import Sampler, SamplingMetadata

    sampler = Sampler()
    sampler.warm_up(151936, torch.device("cuda"), dtype)
    before = (ga._BLOCK_MAX.fast_launches, ga._ROW_MAX.fast_launches)
    logits = torch.randn(3, 151936, device="cuda").to(dtype)
    got = sampler(logits, SamplingMetadata.greedy()).sampled_token_ids
    # Both launches took the compiled launcher: nothing was left to compile.
    assert (ga._BLOCK_MAX.fast_launches, ga._ROW_MAX.fast_launches) == (before[0] + 1,
                                                                         before[1] + 1)
    assert torch.equal(got, logits.float().argmax(dim=-1))


@pytest.mark.timeout(600)  # the interpreter's subprocess
def test_kernels_in_triton_interpreter() -> None:
    run_interpreted(__file__)


@pytest.mark.gpu
@pytest.mark.parametrize("vocabs", [(17, 1000, BLOCK, BLOCK + 1), (128256, 151936)])
def test_kernels_on_the_gpu(vocabs: tuple[int, ...]) -> None:
    check("cuda", vocabs)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 64, 300])
def test_random_batches_on_the_gpu(rows: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, 151936, device="cuda", generator=g)
    # Coarse values: many ties within and across blocks.
    x = (x * 2).round()
    assert torch.equal(argmax_rows(x, ArgmaxScratch()), x.argmax(dim=-1))


if __name__ == "__main__":
    patch_interpreter()
    check("cpu", (17, 1000, BLOCK, BLOCK + 1, 3 * BLOCK - 5))
    print(DONE)
