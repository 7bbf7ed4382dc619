"""A small HF model trained on text from a random Markov chain: next-token distributions
peaked on a few successors, as a trained language model's are, for measurements (FP8's top-1
agreement) that a random model's flat distributions cannot make.

Each token of the vocabulary has ``SUCCESSORS`` successors drawn at random, with probabilities
from a Dirichlet(0.5) (some nearly tied, as real continuations are); the model learns the chain
by next-token cross entropy. Its greedy continuation falls into a short cycle (a random map on
the vocabulary), so measurements feed it text sampled from the chain: every step a different
context.
"""

from __future__ import annotations

import torch

from tests.model.helpers import VOCAB
from tests.model.test_fp8 import unit_gain_model

SUCCESSORS = 4


def markov_chain(seed: int, vocab: int = VOCAB) -> torch.Tensor:
    """[vocab, vocab] transition probabilities: ``SUCCESSORS`` non-zero entries a row."""
    gen = torch.Generator().manual_seed(seed)
    probs = torch.zeros(vocab, vocab)
    for token in range(vocab):
        successors = torch.randperm(vocab, generator=gen)[:SUCCESSORS]
        weights = torch._standard_gamma(torch.full((SUCCESSORS,), 0.5), generator=gen)
        probs[token, successors] = weights / weights.sum()
    return probs


def markov_text(chain: torch.Tensor, rows: int, length: int, seed: int) -> torch.Tensor:
    """[rows, length] token ids sampled from ``chain``, from uniform first tokens (not the
    special ids 0-2)."""
    gen = torch.Generator().manual_seed(seed)
    text = torch.empty(rows, length, dtype=torch.long)
    text[:, 0] = torch.randint(3, chain.shape[0], (rows,), generator=gen)
    for i in range(1, length):
        text[:, i] = torch.multinomial(chain[text[:, i - 1]], 1, generator=gen)[:, 0]
    return text


def trained_model(family: str, seed: int, device: str = "cpu", steps: int = 300):
    """``unit_gain_model(family, seed)`` after ``steps`` Adam steps on 32 sequences of 64
    tokens a step from ``markov_chain(seed)`` (float64, on ``device``); returned on the CPU in
    float32, in eval mode, with the chain."""
    chain = markov_chain(seed)
    corpus = markov_text(chain, 1024, 64, seed + 1).to(device)
    # NOTE: trained in float64, returned in float32: in float32 the weights after 300 steps
    # depended on the CPU's vector width (AVX-512 against AVX2 sums), and the figures with them.
    model = unit_gain_model(family, seed).to(device, torch.float64)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed + 2)
    for _ in range(steps):
        batch = corpus[torch.randint(0, corpus.shape[0], (32,), generator=gen).to(device)]
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval().float().cpu(), chain
