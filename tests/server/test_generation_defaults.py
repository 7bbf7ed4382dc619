"""Server requests that leave temperature / top_p / top_k unset take the model's
generation-config defaults; fields a request sets win."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.tiny import tiny_copy_with_generation_config


def _token_ids(http: httpx.Client, fields: dict) -> list[int]:
    """The token ids of a completion of the test prompt with ``fields``."""
    body = {"prompt": "Once upon a time", "ignore_eos": True, "return_token_ids": True,
            **fields}
    resp = http.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["token_ids"]


@pytest.fixture
def greedy_by_default(tmp_path: Path) -> Path:
    """The tiny model whose generation config makes it greedy unless a request says otherwise."""
    return tiny_copy_with_generation_config(tmp_path / "tiny-greedy", temperature=0.0)


def test_server_requests_without_sampling_fields_use_the_defaults(
    greedy_by_default: Path, server_factory
) -> None:
    srv = server_factory(model=str(greedy_by_default))
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        def tokens(extra: dict) -> list[int]:
            return _token_ids(http, {"max_tokens": 12, **extra})

        greedy = tokens({"temperature": 0.0})
        assert tokens({}) == greedy and tokens({}) == greedy  # greedy by default
        hot = {tuple(tokens({"temperature": 1.5, "seed": s})) for s in range(4)}
        assert len(hot) > 1  # an explicit temperature still wins


def test_penalty_defaults_and_the_max_new_tokens_cap(tmp_path: Path, server_factory) -> None:
    model = tiny_copy_with_generation_config(tmp_path / "tiny-penalised", temperature=0.0,
                                             repetition_penalty=1.5, max_new_tokens=20)
    srv = server_factory(model=str(model))
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        def completion(extra: dict) -> dict:
            body = {"prompt": "Once upon a time", "ignore_eos": True, "return_token_ids": True,
                    **extra}
            resp = http.post("/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
            return resp.json()

        def tokens(extra: dict) -> list[int]:
            return completion({"max_tokens": 16, **extra})["choices"][0]["token_ids"]

        assert tokens({}) == tokens({"repetition_penalty": 1.5})
        assert tokens({}) != tokens({"repetition_penalty": 1.0})
        # max_new_tokens caps requests that ask for more, and fills in for those that ask none.
        assert completion({"max_tokens": 100})["usage"]["completion_tokens"] == 20
        chat = http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True})
        assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 20


def test_completions_without_max_tokens_get_16(server_factory) -> None:
    """An absent max_tokens is the field's default, 16, and so is an explicit null (vLLM's
    normalize_null_max_tokens), streamed or not."""
    srv = server_factory(max_model_len=96)
    with httpx.Client(base_url=srv.base_url, timeout=60) as http:
        body = {"prompt": "Once upon a time", "ignore_eos": True}
        resp = http.post("/v1/completions", json=body)
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 16
        resp = http.post("/v1/completions", json={**body, "max_tokens": None})
        assert resp.status_code == 200, resp.text
        usage = resp.json()["usage"]
        assert usage["completion_tokens"] == 16
        assert resp.json()["choices"][0]["finish_reason"] == "length"
        stream = http.post("/v1/completions", json={
            **body, "max_tokens": None, "stream": True,
            "stream_options": {"include_usage": True}})
        frames = [line[6:] for line in stream.text.splitlines() if line.startswith("data: ")]
        assert frames[-1] == "[DONE]"
        assert json.loads(frames[-2])["usage"] == usage


def test_the_override_reaches_server_requests(server_factory) -> None:
    # vLLM's --override-generation-config: greedy by default without a generation_config.json.
    srv = server_factory(override_generation_config={"temperature": 0.0})
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        def tokens(extra: dict) -> list[int]:
            return _token_ids(http, {"max_tokens": 10, **extra})

        greedy = tokens({"temperature": 0.0})
        assert tokens({}) == greedy and tokens({"seed": 3}) == greedy
        assert len({tuple(tokens({"temperature": 1.5, "seed": s})) for s in range(4)}) > 1
