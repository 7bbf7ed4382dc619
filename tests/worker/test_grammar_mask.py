"""Grammar bitmasks: staging, the apply kernel (Triton, under its interpreter on CPU) and its
torch form, against a per-token loop over the bits."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":  # the interpreter driver: before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest  # noqa: E402
import torch  # noqa: E402

from cadence.worker.grammar_mask import (  # noqa: E402
    GrammarMask,
    MaskStaging,
    apply_grammar_mask,
    apply_grammar_mask_reference,
    words_per_row,
)
from tests.model.triton_interpreter import DONE, patch_interpreter, run_interpreted  # noqa: E402


def _expected(logits: torch.Tensor, rows: list[int], words: torch.Tensor, vocab: int,
              known: int):
    """Token t of a grammar row survives iff t < known and its bit is set; columns from
    ``vocab`` on are left alone."""
    out = logits.clone()
    for i, row in enumerate(rows):
        for t in range(vocab):
            word = int(words[i, t // 32]) & 0xFFFFFFFF if t < known else 0
            if not (word >> (t % 32)) & 1:
                out[row, t] = float("-inf")
    return out


def _case(vocab: int, batch: int, rows: list[int], seed: int, known: int | None = None):
    known = vocab if known is None else known
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab + 5, generator=g)  # columns past ``vocab`` stay
    words = torch.randint(-(2**31), 2**31 - 1, (len(rows), words_per_row(known)), generator=g,
                          dtype=torch.int64).to(torch.int32)
    want = _expected(logits, rows, words, vocab, known)
    return logits, words, want


def check_kernel(device: str, launch) -> None:
    for vocab, known, batch, rows in ((100, 100, 4, [2, 0]), (4096 + 33, 4096 + 33, 3, [1]),
                                      (70, 70, 6, [5, 3, 4, 0]), (5000, 45, 3, [2, 1]),
                                      (300, 64, 2, [1]), (64, 70, 2, [0])):
        logits, words, want = _case(vocab, batch, rows, seed=vocab, known=known)
        logits, words = logits.to(device), words.to(device)
        rows_t = torch.tensor(rows, dtype=torch.int32, device=device)
        apply_grammar_mask(logits, GrammarMask(rows_t, words, vocab, known, launch))
        assert torch.equal(logits.cpu(), want)


@pytest.mark.parametrize(("vocab", "known", "batch", "rows"), [
    (64, 64, 3, [0, 2]), (95, 95, 5, [4, 1, 3]), (1000, 1000, 2, [1]), (1000, 40, 3, [2, 0]),
    (96, 70, 2, [1, 0]), (64, 70, 3, [2, 0]),  # a tokenizer that knows more ids than the logits
])
def test_torch_form_matches_the_bits(vocab, known, batch, rows) -> None:
    logits, words, want = _case(vocab, batch, rows, seed=batch, known=known)
    mask = GrammarMask(torch.tensor(rows, dtype=torch.int32), words, vocab, known)
    apply_grammar_mask_reference(logits, mask)
    assert torch.equal(logits, want)


def test_words_per_row_holds_each_id_once() -> None:
    # 32 ids a word: 1-32 ids fill one word, 33 a second; 151669 ids take 4740 words.
    assert [words_per_row(n) for n in (1, 31, 32, 33, 64, 65)] == [1, 1, 1, 2, 2, 3]
    assert words_per_row(151669) == 4740


def test_untouched_rows_and_an_empty_mask() -> None:
    logits, words, _ = _case(50, 3, [1], seed=0)
    before = logits.clone()
    apply_grammar_mask(logits, GrammarMask(torch.tensor([1], dtype=torch.int32), words, 50, 50))
    assert torch.equal(logits[[0, 2]], before[[0, 2]])
    empty = GrammarMask(torch.zeros(0, dtype=torch.int32), words[:0], 50, 50)
    after = logits.clone()
    apply_grammar_mask(logits, empty)
    assert torch.equal(logits, after)


def test_staging_gives_the_first_rows_of_its_buffer() -> None:
    staging = MaskStaging(max_rows=4, vocab_size=500, mask_vocab=70, device=torch.device("cpu"))
    words, rows = staging.host(3)
    assert words.shape == (3, 3) and rows.shape == (3,)
    words.fill_(-1)
    rows.copy_(torch.tensor([2, 0, 1], dtype=torch.int32))
    mask = staging.upload(3)
    assert mask.rows.tolist() == [2, 0, 1] and mask.words.shape == (3, 3)
    assert mask.launch is None  # CPU: torch ops


@pytest.mark.timeout(600)  # the interpreter's subprocess, minutes on 2 cores
def test_kernel_under_the_interpreter() -> None:
    run_interpreted(__file__)


@pytest.mark.gpu
def test_kernel_and_staging_on_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from cadence.runtime.triton_launch import TritonLaunch
    from cadence.worker.grammar_mask_kernel import apply_bitmask_kernel

    launch = TritonLaunch(apply_bitmask_kernel)
    check_kernel("cuda", launch)
    check_kernel("cuda", launch)  # the bound fast path
    assert launch.fast_launches > 0
    # Staging round trip: double-buffered pinned host rows reach the device intact.
    device = torch.device("cuda")
    staging = MaskStaging(max_rows=8, vocab_size=151936, mask_vocab=151669, device=device)
    for step in range(4):
        words, rows = staging.host(2 + step)
        words.fill_(step)
        rows.copy_(torch.arange(2 + step, dtype=torch.int32))
        mask = staging.upload(2 + step)
        assert torch.equal(mask.words.cpu(), torch.full_like(words, step))
        assert mask.rows.tolist() == list(range(2 + step))


if __name__ == "__main__":
    patch_interpreter()
    from cadence.runtime.triton_launch import TritonLaunch
    from cadence.worker.grammar_mask_kernel import apply_bitmask_kernel

    check_kernel("cpu", TritonLaunch(apply_bitmask_kernel))
    print(DONE)
