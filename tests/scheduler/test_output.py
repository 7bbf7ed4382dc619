"""What the scheduler hands the runner: new requests whole, running ones by their new blocks."""

from __future__ import annotations

from types import SimpleNamespace

from cadence.sampling_params import SamplingParams
from cadence.scheduler.output import scheduled_request_data


def _req(req_id: str, prompt: list[int], output: list[int], computed: int) -> SimpleNamespace:
    return SimpleNamespace(request_id=req_id, prompt_token_ids=prompt, output_token_ids=output,
                           sampling_params=SamplingParams(max_tokens=8),
                           num_computed_tokens=computed)


def test_new_and_running_requests() -> None:
    resumed = _req("a", [1, 2, 3], [7, 8], 0)
    running = [_req("b", [4], [9], 5), _req("c", [5, 6], [], 2)]
    blocks = {"b": [SimpleNamespace(block_id=11), SimpleNamespace(block_id=12)], "c": []}
    new, cached = scheduled_request_data([resumed], running, blocks,
                                         lambda rid: {"a": [3, 4]}[rid])
    assert [(n.req_id, n.prompt_token_ids, n.output_token_ids, n.block_ids,
             n.num_computed_tokens) for n in new] == [("a", [1, 2, 3], [7, 8], [3, 4], 0)]
    assert cached.req_ids == ["b", "c"] and cached.num_reqs == 2
    assert cached.new_block_ids == [[11, 12], None]  # None: no block added this step
    assert cached.num_computed_tokens == [5, 2]


def test_a_new_requests_output_is_a_snapshot() -> None:
    """Tokens sampled after the step was scheduled are not in the step's copy (with async
    scheduling the runner reads it after the scheduler has appended them)."""
    req = _req("a", [1, 2], [7], 0)
    new, _ = scheduled_request_data([req], [], {}, lambda rid: [0])
    req.output_token_ids.append(8)
    assert new[0].output_token_ids == [7]
