"""A step's outputs for requests the runner refused (``update_from_output``'s failed requests):
the refused request ends with an error and no token; a request that took its id since is left
alone."""

from __future__ import annotations

from cadence.scheduler.request import FinishReason, RequestStatus
from tests.scheduler.factories import create_requests, create_scheduler, runner_output


def test_a_refused_request_ends_with_an_error_and_no_token() -> None:
    scheduler = create_scheduler()
    refused, fine = create_requests(2, req_ids=["refused", "fine"])
    for request in (refused, fine):
        scheduler.add_request(request)
    so = scheduler.schedule()
    out = runner_output(["refused", "fine"], [[9], [7]])  # the refused row's token: garbage
    out.failed_requests["refused"] = "ValueError: bad row"
    outputs = scheduler.update_from_output(so, out).outputs
    mine = [o for o in outputs if o.request_id == "refused"]
    assert len(mine) == 1
    assert mine[0].new_token_ids == [] and mine[0].finish_reason == FinishReason.ERROR
    assert refused.status == RequestStatus.FINISHED_ERROR and refused.output_token_ids == []
    assert [o.new_token_ids for o in outputs if o.request_id == "fine"] == [[7]]


def test_a_refusal_of_an_aborted_id_spares_the_request_that_took_it() -> None:
    """Async scheduling: "x" is scheduled, aborted and added again before the step's output
    comes; that output refuses the old "x". The new one waits on, untouched."""
    scheduler = create_scheduler(async_scheduling=True)
    (old,) = create_requests(1, req_ids=["x"])
    scheduler.add_request(old)
    so = scheduler.schedule()
    scheduler.finish_requests(["x"], RequestStatus.FINISHED_ABORTED)
    (new,) = create_requests(1, req_ids=["x"], starting_idx=5)
    scheduler.add_request(new)
    out = runner_output(["x"], [[9]])
    out.failed_requests["x"] = "ValueError: bad row"
    outputs = scheduler.update_from_output(so, out).outputs
    assert outputs == []
    assert new.status == RequestStatus.WAITING and scheduler.requests["x"] is new
