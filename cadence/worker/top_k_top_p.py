"""Top-k / top-p filtering and sampling without a host sync: the full-sort masks (vLLM's method),
the candidate path that finds each row's best ``kmax`` tokens instead of sorting the vocabulary,
and the exponential race that draws from the filtered distribution (seeded rows from their own
generators)."""

from __future__ import annotations

import torch


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Mask everything outside each row's top-k, then outside its top-p nucleus, with -inf.

    Both masks are computed on the ascending sort of the logits (vLLM's method). A row's top-k
    of -1 (or 0, or >= V) means no top-k; a top-p of 1 means no top-p. Ties at the top-k
    threshold are all kept.
    """
    if top_k is None and top_p is None:
        return logits
    vocab = logits.shape[-1]
    # Stable: tokens of equal probability leave the top-p nucleus by increasing id, in this path
    # and in ``sample_from_top_k`` alike.
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False, stable=True)
    if top_k is not None:
        k = top_k.to(device=logits.device, dtype=torch.int64)
        k = torch.where((k <= 0) | (k > vocab), torch.full_like(k, vocab), k)
        threshold = logits_sort.gather(1, (vocab - k).unsqueeze(1))
        logits_sort.masked_fill_(logits_sort < threshold, float("-inf"))
    if top_p is not None:
        p = top_p.to(device=logits.device, dtype=torch.float32)
        probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
        mask = probs_sum <= (1.0 - p).unsqueeze(1)
        mask[:, -1] = False  # the most likely token always survives
        logits_sort.masked_fill_(mask, float("-inf"))
    return logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)


def exponential_race(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Sample each row of ``probs`` as argmax(probs / E), E ~ Exp(1) i.i.d. per entry.

    Equivalent to sampling from the categorical distribution, without a host sync. Seeded rows
    draw their noise from their own generator.
    """
    q = torch.empty_like(probs)
    if len(generators) < probs.shape[0]:
        q.exponential_()
    for row, gen in generators.items():
        q[row].exponential_(generator=gen)
    # Hazard: an exact 0 draw would give 0/0 = NaN on masked entries, and argmax picks NaN.
    q.clamp_(min=torch.finfo(q.dtype).tiny)
    return probs.div(q).argmax(dim=-1)


def sample_from_top_k(
    logits: torch.Tensor,
    top_k: torch.Tensor,
    kmax: int,
    top_p: torch.Tensor | None,
    generators: dict[int, torch.Generator],
) -> torch.Tensor:
    """Top-k (then top-p) sampling that finds each row's ``kmax`` best candidates instead of
    sorting the whole vocabulary.

    Same tokens as ``apply_top_k_top_p`` + ``exponential_race``, seeded rows included (up to the
    rounding of a cumulative probability that meets a top-p exactly), when every row's top-k is at
    most ``kmax`` (rows with top-k off use ``kmax``): the k-th best logit is a threshold over the
    whole vocabulary, so every token tied with it survives, also those that are not candidates
    (bf16 logits often have several tokens tied at the k-th).
    """
    kmax = min(kmax, logits.shape[-1])
    vals = logits.topk(kmax, dim=-1).values  # descending
    k = top_k.to(device=logits.device, dtype=torch.int64)
    k = torch.where((k <= 0) | (k > kmax), torch.full_like(k, kmax), k)
    threshold = vals.gather(1, (k - 1).unsqueeze(1))
    if top_p is None:
        masked = logits.masked_fill(logits < threshold, float("-inf"))
    else:
        masked = _top_k_top_p_of_candidates(logits, vals, threshold, top_p)
    return exponential_race(masked.softmax(dim=-1), generators)


def _top_k_top_p_of_candidates(
    logits: torch.Tensor, vals: torch.Tensor, threshold: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """``logits`` [N, V] with everything outside each row's top-k (``threshold``, ties kept) and
    then top-p nucleus masked, from the row's best candidates ``vals`` [N, kmax] (descending).

    The full path's order: by probability, ties by decreasing id (its stable ascending sort,
    reversed). Every token above the threshold is a candidate; ties with it may lie beyond.
    """
    neg_inf = float("-inf")
    p = top_p.to(device=logits.device, dtype=torch.float32).unsqueeze(1)
    p = p.masked_fill(p >= 1.0, float("inf"))  # a top-p of 1 drops nothing, whatever the rounding
    cand = vals >= threshold
    n_beyond = (logits >= threshold).sum(dim=-1, keepdim=True) - cand.sum(dim=-1, keepdim=True)
    vals = vals.masked_fill(~cand, neg_inf)
    # Log of the top-k survivors' total weight: the candidates and the ties beyond them.
    lse = torch.logaddexp(vals.logsumexp(dim=-1, keepdim=True), threshold + n_beyond.log())
    probs = (vals - lse).exp()
    mass_before = torch.nn.functional.pad(probs.cumsum(dim=-1)[:, :-1], (1, 0))
    # A token survives while the mass of the better ones is below p; the best always does.
    n_kept = ((mass_before < p) & cand).sum(dim=-1, keepdim=True).clamp_(min=1)
    cut = vals.gather(1, n_kept - 1)  # the least likely survivor's logit
    # The tokens tied with the cut follow the mass above them, each with the cut's probability
    # (some may lie beyond the candidates); count those that start below p (at least one).
    n_above = (vals > cut).sum(dim=-1, keepdim=True)
    n_cut = ((p - mass_before.gather(1, n_above)) / (cut - lse).exp()).ceil()
    at_cut = logits == cut
    rank = at_cut.cumsum(dim=-1, dtype=torch.int32)
    # Of the tokens tied with the cut, the n_cut largest ids survive.
    drop = (logits < cut) | (at_cut & (rank <= rank[:, -1:] - n_cut))
    return logits.masked_fill(drop, neg_inf)
