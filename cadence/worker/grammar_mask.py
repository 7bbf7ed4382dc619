"""The token bitmask of one step's grammar rows: filled on the host into pinned staging, moved
to the device in one copy, and applied to the logits by one kernel.

Only the rows under a grammar travel: ``words[i]`` is the bitmask (bit ``t % 32`` of word
``t // 32`` set = token ``t`` allowed) of logits row ``rows[i]``, over the ``mask_vocab`` ids the
grammars know (the tokenizer's); ids from ``mask_vocab`` to the model's ``vocab_size`` (padding)
are always banned. On CUDA the staging is
double-buffered: a buffer is refilled only once the copy that last read it has run (an event
per buffer, recorded after its copy; usually long done, so the wait costs nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["GrammarMask", "MaskStaging", "apply_grammar_mask", "words_per_row"]

_BLOCK = 4096  # vocabulary entries per program of the apply kernel


def words_per_row(vocab_size: int) -> int:
    return -(-vocab_size // 32)


@dataclass
class GrammarMask:
    """One step's grammar rows on the logits' device."""

    rows: torch.Tensor  # [k] int32: the logits rows under a grammar
    words: torch.Tensor  # [k, words_per_row(mask_vocab)] int32: their bitmasks
    vocab_size: int  # the logits' vocabulary
    mask_vocab: int  # the bitmask's (ids from here on are banned)
    launch: Any = None  # the apply kernel's launcher (CUDA); None: torch ops


class MaskStaging:
    """Host staging (pinned on CUDA) and device buffers for up to ``max_rows`` grammar rows."""

    def __init__(self, max_rows: int, vocab_size: int, mask_vocab: int,
                 device: torch.device) -> None:
        self.max_rows = max_rows
        self.vocab_size = vocab_size
        self.mask_vocab = mask_vocab
        self.device = device
        width = words_per_row(mask_vocab)
        cuda = device.type == "cuda"
        buffers = 2 if cuda else 1
        self._host_words = [torch.empty(max_rows, width, dtype=torch.int32, pin_memory=cuda)
                            for _ in range(buffers)]
        self._host_rows = [torch.empty(max_rows, dtype=torch.int32, pin_memory=cuda)
                           for _ in range(buffers)]
        if cuda:
            self._dev_words = torch.empty(max_rows, width, dtype=torch.int32, device=device)
            self._dev_rows = torch.empty(max_rows, dtype=torch.int32, device=device)
            self._copied = [torch.cuda.Event() for _ in range(buffers)]
            from cadence.runtime.triton_launch import TritonLaunch
            from cadence.worker.grammar_mask_kernel import apply_bitmask_kernel

            self._launch = TritonLaunch(apply_bitmask_kernel)
        self._current = 0
        self._pending = [False] * buffers

    def close(self) -> None:
        # NOTE: torch's pinned allocator records an event on the stream of the last copy when
        # a pinned block is freed: free these while that stream still exists.
        if self.device.type == "cuda":
            for event in self._copied:
                event.synchronize()
        self._host_words = self._host_rows = []
        self._pending = []

    def host(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next staging buffer's first ``k`` rows: (words [k, W], logits rows [k])."""
        i = self._current
        if self._pending[i]:
            # NOTE: deliberate wait, normally already satisfied: the copy that last read this
            # buffer (two steps ago) must have run before the host overwrites it.
            self._copied[i].synchronize()
            self._pending[i] = False
        return self._host_words[i][:k], self._host_rows[i][:k]

    def upload(self, k: int) -> GrammarMask:
        """The staged rows on the device (copies on the current stream)."""
        i = self._current
        words, rows = self._host_words[i][:k], self._host_rows[i][:k]
        if self.device.type != "cuda":
            return GrammarMask(rows, words, self.vocab_size, self.mask_vocab)
        dev_words, dev_rows = self._dev_words[:k], self._dev_rows[:k]
        dev_words.copy_(words, non_blocking=True)
        dev_rows.copy_(rows, non_blocking=True)
        self._copied[i].record()
        self._pending[i] = True
        self._current = 1 - i
        return GrammarMask(dev_rows, dev_words, self.vocab_size, self.mask_vocab, self._launch)


def apply_grammar_mask(logits: torch.Tensor, mask: GrammarMask) -> None:
    """Set, in place, the logits of the tokens each grammar row may not take next to -inf."""
    k = mask.rows.shape[0]
    if k == 0:
        return
    if mask.launch is not None:
        mask.launch((k, -(-mask.vocab_size // _BLOCK)),
                    (logits, logits.stride(0), mask.words, mask.words.stride(0), mask.rows,
                     mask.vocab_size, mask.mask_vocab), BLOCK=_BLOCK, num_warps=8)
        return
    apply_grammar_mask_reference(logits, mask)


def apply_grammar_mask_reference(logits: torch.Tensor, mask: GrammarMask) -> None:
    """The same in torch ops (the CPU path and the kernel's reference)."""
    rows = mask.rows.long()
    vocab, known = mask.vocab_size, min(mask.mask_vocab, mask.vocab_size)
    shifts = torch.arange(32, dtype=torch.int32, device=mask.words.device)
    bits = (mask.words.unsqueeze(-1) >> shifts) & 1
    allowed = torch.zeros(rows.shape[0], vocab, dtype=torch.bool, device=logits.device)
    allowed[:, :known] = bits.reshape(rows.shape[0], -1)[:, :known].bool().to(logits.device)
    sub = logits[rows, :vocab]
    logits[rows, :vocab] = sub.masked_fill(~allowed, float("-inf"))
