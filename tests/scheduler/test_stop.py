"""Token-level stop conditions (vLLM's check_stop; test_check_stop_min_tokens ported)."""

from __future__ import annotations

from cadence.sampling_params import SamplingParams
from cadence.scheduler.request import FinishReason, Request, RequestStatus
from cadence.scheduler.stop import check_stop

EOS = 50256


def _request(**params) -> Request:
    return Request("0", [0, 1, 2], SamplingParams(**params), eos_token_id=EOS)


def test_check_stop_min_tokens():
    # Fewer outputs than min_tokens: EOS does not stop.
    request = _request(max_tokens=20, min_tokens=5)
    request.append_output_token_ids([10, 11, EOS])
    assert check_stop(request, max_model_len=100) is False
    # min_tokens met: EOS stops.
    request.append_output_token_ids([10, 11, 12, 13, 14, EOS])
    assert check_stop(request, max_model_len=100) is True
    assert request.status == RequestStatus.FINISHED_STOPPED
    assert request.get_finished_reason() == FinishReason.STOP
    assert request.stop_reason is None

    request = _request(max_tokens=20, min_tokens=0)
    request.append_output_token_ids([10, EOS])
    assert check_stop(request, max_model_len=100) is True
    assert request.status == RequestStatus.FINISHED_STOPPED

    # A stop token before min_tokens does not stop; after it does, with stop_reason.
    request = _request(max_tokens=20, min_tokens=5, stop_token_ids=[42])
    request.append_output_token_ids([10, 11, 42])
    assert check_stop(request, max_model_len=100) is False
    request.append_output_token_ids([10, 11, 12, 13, 14, 42])
    assert check_stop(request, max_model_len=100) is True
    assert request.status == RequestStatus.FINISHED_STOPPED
    assert request.stop_reason == 42


def test_ignore_eos_and_max_tokens():
    request = _request(max_tokens=3, ignore_eos=True)
    request.append_output_token_ids(EOS)
    assert check_stop(request, max_model_len=100) is False
    request.append_output_token_ids(EOS)
    assert check_stop(request, max_model_len=100) is False
    request.append_output_token_ids(7)
    assert check_stop(request, max_model_len=100) is True
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert request.get_finished_reason() == FinishReason.LENGTH


def test_max_model_len_stops_even_before_min_tokens():
    request = _request(max_tokens=50, min_tokens=10)
    request.append_output_token_ids([5, 6])
    assert check_stop(request, max_model_len=6) is False
    request.append_output_token_ids(7)  # 3 prompt + 3 output = max_model_len
    assert check_stop(request, max_model_len=6) is True
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_no_eos_id_never_stops_on_eos():
    request = Request("0", [1], SamplingParams(max_tokens=5), eos_token_id=None)
    request.append_output_token_ids(EOS)
    assert check_stop(request, max_model_len=100) is False


def test_eos_ends_structured_output_whatever_ignore_eos_and_min_tokens_say():
    """A grammar allows EOS only where it is complete: the request ends there."""
    from cadence.sampling_params import StructuredOutputsParams

    for params in ({"ignore_eos": True}, {"min_tokens": 5}):
        request = _request(max_tokens=20, structured_outputs=StructuredOutputsParams(regex="ab"),
                           **params)
        request.append_output_token_ids([10, 11, EOS])
        assert check_stop(request, max_model_len=100) is True
        assert request.get_finished_reason() == FinishReason.STOP
        # Without a grammar the same tokens go on.
        plain = _request(max_tokens=20, **params)
        plain.append_output_token_ids([10, 11, EOS])
        assert check_stop(plain, max_model_len=100) is False
