"""The embedding lookup kernel: the rows of ``torch.embedding``, bit for bit (Triton's
interpreter on the CPU, the compiled kernel on a GPU), zeros for ids outside the table, and
``embed`` choosing the kernel only where it applies."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":  # the interpreter driver: before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from tests.model.triton_interpreter import DONE, patch_interpreter, run_interpreted  # noqa: E402

CASES = [(1, 1024, 50), (7, 1000, 300), (3, 2500, 17), (0, 64, 9)]  # tokens, width, vocab


def check_lookup(device: str, dtype: torch.dtype, id_dtype: torch.dtype, tokens: int,
                 width: int, vocab: int) -> None:
    from cadence.model.embedding import embedding_lookup

    gen = torch.Generator().manual_seed(tokens * 31 + width)
    table = torch.randn(vocab, width, generator=gen).to(device=device, dtype=dtype)
    ids = torch.randint(0, vocab, (tokens,), generator=gen).to(device=device, dtype=id_dtype)
    out = embedding_lookup(table, ids)
    assert out.shape == (tokens, width) and out.dtype == dtype
    assert torch.equal(out, torch.embedding(table, ids.long()))


def check_outside_ids_give_zeros(device: str) -> None:
    from cadence.model.embedding import embedding_lookup

    table = torch.arange(12.0, device=device).view(4, 3) + 1.0
    ids = torch.tensor([2, -1, 4, 0, 1 << 40], device=device)
    out = embedding_lookup(table, ids)
    expected = torch.stack([table[2], torch.zeros(3, device=device), torch.zeros(3, device=device),
                            table[0], torch.zeros(3, device=device)])
    assert torch.equal(out, expected)


def check_strided_table(device: str) -> None:
    """A table whose rows are a slice of wider rows (row stride != width)."""
    from cadence.model.embedding import embedding_lookup

    wide = torch.randn(20, 96, generator=torch.Generator().manual_seed(3)).to(device)
    table = wide[:, 16:80]
    ids = torch.tensor([19, 0, 7, 7], device=device)
    assert torch.equal(embedding_lookup(table, ids), table[ids])


@pytest.mark.timeout(600)  # the interpreter's subprocess, minutes on 2 cores
def test_kernel_in_triton_interpreter() -> None:
    run_interpreted(__file__)


def test_lookup_refuses_what_it_cannot_read() -> None:
    pytest.importorskip("triton")
    from cadence.model.embedding import embedding_lookup

    with pytest.raises(ValueError, match="unit column stride"):
        embedding_lookup(torch.zeros(4, 6).t(), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"ids \[T\]"):
        embedding_lookup(torch.zeros(4, 6), torch.tensor([[0]]))


def test_embed_keeps_the_module_where_the_kernel_does_not_apply() -> None:
    from cadence.model.embedding import embed

    calls = []

    class Counting(nn.Embedding):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            calls.append(ids)
            return super().forward(ids)

    ids = torch.tensor([1, 2])
    module = Counting(5, 4)
    with torch.no_grad():
        assert torch.equal(embed(module, ids), module.weight[ids])  # not a plain nn.Embedding
    plain = nn.Embedding(5, 4)
    with torch.no_grad():
        assert torch.equal(embed(plain, ids), plain.weight[ids])  # CPU ids: the module
    assert len(calls) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"t{c[0]}-h{c[1]}-v{c[2]}")
def test_lookup_on_gpu(dtype, id_dtype, case) -> None:
    check_lookup("cuda", dtype, id_dtype, *case)


@pytest.mark.gpu
def test_outside_ids_and_strided_tables_on_gpu() -> None:
    check_outside_ids_give_zeros("cuda")
    check_strided_table("cuda")


@pytest.mark.gpu
def test_embed_takes_the_kernel_on_cuda() -> None:
    from cadence.model import embedding

    module = nn.Embedding(300, 128).cuda().bfloat16()
    ids = torch.randint(0, 300, (9,), device="cuda")
    launches = embedding._EMBEDDING.fast_launches
    with torch.inference_mode():
        for _ in range(2):
            assert torch.equal(embedding.embed(module, ids), module.weight[ids])
    assert embedding._EMBEDDING.fast_launches > launches  # the kernel, not the module


if __name__ == "__main__":
    patch_interpreter()
    for dtype in (torch.float32, torch.bfloat16):
        for id_dtype in (torch.int32, torch.int64):
            for case in CASES:
                check_lookup("cpu", dtype, id_dtype, *case)
    check_outside_ids_give_zeros("cpu")
    check_strided_table("cpu")
    print(DONE)
