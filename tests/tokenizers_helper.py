"""A tiny byte-level BPE tokenizer trained in the tests (no download)."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast


def byte_level_tokenizer(
    corpus: list[str], vocab_size: int, special_tokens: list[str]
) -> PreTrainedTokenizerFast:
    """A GPT-2-style byte-level BPE trained on ``corpus``; ``special_tokens[0]`` is EOS.

    Every byte is in the initial alphabet, so any text encodes; merges come only from ``corpus``.
    """
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=special_tokens[0])
