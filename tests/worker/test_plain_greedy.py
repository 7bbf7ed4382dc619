"""Greedy steps without extras skip the per-row sampling metadata: the shortcut must build
exactly what the per-row path builds, and only for rows where that holds."""

from __future__ import annotations

import itertools
from dataclasses import fields

import numpy as np
import torch

from cadence.sampling_params import SamplingParams, StructuredOutputsParams
from cadence.worker.input_batch import InputBatch, StepInputs
from cadence.worker.request_sampling import RequestSampling
from cadence.worker.sampler import SamplingMetadata, SamplingRows, plain_greedy_row

_EXTRAS = {  # one departure from a plain greedy request each
    "temperature": dict(temperature=0.7),
    "tiny temperature": dict(temperature=1e-6),  # samples at 0.01, as vLLM's (not greedy)
    "top_p": dict(top_p=0.9),
    "top_k": dict(top_k=5),
    "min_p": dict(min_p=0.1),
    "top_k, hot": dict(temperature=0.5, top_k=5),
    "logprobs": dict(logprobs=2),
    "min_tokens with stop ids": dict(min_tokens=3, stop_token_ids=[7]),
    "min_tokens, eos ignored": dict(min_tokens=3, ignore_eos=True),
    "presence penalty": dict(presence_penalty=0.5),
    "logit bias": dict(logit_bias={3: 1.0}),
    "allowed ids": dict(allowed_token_ids=[1, 2]),
    "grammar": dict(structured_outputs=StructuredOutputsParams(regex="a+")),
    "seed": dict(seed=11),
    "prompt logprobs": dict(prompt_logprobs=1),
}


def _same(a: SamplingMetadata, b: SamplingMetadata) -> bool:
    for f in fields(SamplingMetadata):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            return False  # the greedy metadata holds no tensor
        if x != y:
            return False
    return True


def _plain(p: SamplingParams) -> bool:
    rows = SamplingRows.of([p])
    return plain_greedy_row(p, float(rows.temperature[0]), float(rows.top_p[0]),
                            int(rows.top_k[0]), float(rows.min_p[0]))


def test_the_rule_agrees_with_the_per_row_metadata():
    """Every combination of up to two extras: a row the rule calls plain gets from_rows'
    metadata equal to greedy() (at every output count, min_tokens' window included); the
    others are left to from_rows, and a greedy one among them does differ."""
    seen_plain = seen_other = 0
    for a, b in itertools.combinations_with_replacement([None, *_EXTRAS], 2):
        kwargs = {**_EXTRAS.get(a, {}), **_EXTRAS.get(b, {})}
        p = SamplingParams(max_tokens=8, **{"temperature": 0.0, **kwargs})
        for n_out in (0, 2, 5):
            built = SamplingMetadata.from_params([p], [n_out])
            if _plain(p):
                seen_plain += 1
                assert _same(built, SamplingMetadata.greedy()), kwargs
            else:
                seen_other += 1
    assert seen_plain and seen_other
    # Nor stricter than it needs to be: alone on a greedy request, only the extras that
    # change what its sampling reads are refused (greedy requests drop top-p, top-k and min-p,
    # as vLLM's do).
    harmless = {"seed", "prompt logprobs", "min_tokens, eos ignored",
                "top_p", "top_k", "min_p"}
    for name, kwargs in _EXTRAS.items():
        assert _plain(SamplingParams(**{"temperature": 0.0, **kwargs})) == (name in harmless), name
    assert not _plain(SamplingParams())  # the default temperature is 1


def _step(batch: InputBatch) -> StepInputs:
    n = len(batch)
    slots = np.arange(n, dtype=np.int32)
    return StepInputs(req_ids=[batch.slot_req_ids[s] for s in range(n)], slots=slots,
                      input_ids=np.zeros(n, np.int64), positions=np.zeros(n, np.int64),
                      slot_mapping=np.zeros(n, np.int64),
                      query_start_loc=np.arange(n + 1, dtype=np.int32),
                      seq_lens=np.ones(n, np.int32), block_tables=np.zeros((n, 1), np.int32),
                      last_token_index=np.arange(n, dtype=np.int32),
                      use_sampled=np.zeros(n, np.int32),
                      sample_rows=np.arange(n, dtype=np.int32), max_query_len=1, max_seq_len=1)


def test_a_step_takes_the_shortcut_only_when_every_sampling_row_is_plain():
    batch = InputBatch(8, 64, 4, 16)
    sampling = RequestSampling(batch, vocab_size=32, device=torch.device("cpu"))
    last = torch.zeros(8, dtype=torch.int64)
    for i in range(3):
        batch.add(f"g{i}", [1, 2, 3], [], SamplingParams(temperature=0.0), [1])
    md = sampling.metadata(_step(batch), last, dict)
    assert _same(md, SamplingMetadata.greedy())
    batch.add("t", [1, 2], [], SamplingParams(temperature=0.8, top_k=4), [2])
    md = sampling.metadata(_step(batch), last, dict)
    assert not md.all_greedy and md.top_k is not None and md.temperature is not None
    # The sampled row leaves; the last row moves into its place and keeps its flag.
    batch.remove("g0")
    assert batch.plain_greedy[: len(batch)].tolist() == [False, True, True]
    batch.remove("t")
    md = sampling.metadata(_step(batch), last, dict)
    assert _same(md, SamplingMetadata.greedy())


def test_only_the_sampling_rows_decide():
    """A row that does not sample this step (a prompt chunk) does not keep the others from
    the shortcut; once it samples, it does."""
    batch = InputBatch(8, 64, 4, 16)
    sampling = RequestSampling(batch, vocab_size=32, device=torch.device("cpu"))
    last = torch.zeros(8, dtype=torch.int64)
    batch.add("g", [1, 2, 3], [], SamplingParams(temperature=0.0), [1])
    batch.add("t", [1, 2], [], SamplingParams(temperature=0.9, logprobs=1), [2])
    step = _step(batch)
    step.sample_rows = np.array([0], dtype=np.int32)  # "t" runs a chunk and samples nothing
    assert _same(sampling.metadata(step, last, dict), SamplingMetadata.greedy())
    step.sample_rows = np.array([0, 1], dtype=np.int32)
    md = sampling.metadata(step, last, dict)
    assert md.max_num_logprobs == 1 and md.temperature is not None
