"""vLLM's response-shaping flags (--response-role, --enable-prompt-tokens-details,
--enable-force-include-usage, --return-tokens-as-token-ids, --enable-request-id-headers), the
X-Request-Id header, and the request fields whose meanings follow vLLM's: chat echo and role
without a generation prompt, top_logprobs / logprobs -1, a null max_tokens, empty tools and
stream_options."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import openai
import pytest

from cadence.server.settings import ResponseOptions

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
GREEDY = {"temperature": 0, "ignore_eos": True}


def _chunks(http: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_the_x_request_id_header_names_the_response(http: httpx.Client) -> None:
    """vLLM: the header's id wins over the body's request_id; streamed chunks carry it too."""
    r = http.post(CHAT, headers={"X-Request-Id": "trace-42"},
                  json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                        "request_id": "body-id"})
    assert r.status_code == 200 and r.json()["id"] == "chatcmpl-trace-42"
    assert "x-request-id" not in r.headers  # only with --enable-request-id-headers
    r = http.post(COMPLETIONS, headers={"X-Request-Id": "trace-43"},
                  json={"prompt": "hi", "max_tokens": 2})
    assert r.json()["id"] == "cmpl-trace-43"
    chunks = _chunks(http, COMPLETIONS, {"prompt": "hi", "max_tokens": 2, "request_id": "b-7"})
    assert {c["id"] for c in chunks} == {"cmpl-b-7"}
    with http.stream("POST", CHAT, headers={"X-Request-Id": "s-1"},
                     json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                           "stream": True}) as r:
        ids = {json.loads(x[6:])["id"] for x in r.iter_lines() if x.startswith("data: {")}
    assert ids == {"chatcmpl-s-1"}
    long = http.post(COMPLETIONS, headers={"X-Request-Id": "x" * 257},
                     json={"prompt": "hi", "max_tokens": 2})
    assert long.status_code == 400 and long.json()["error"]["param"] == "X-Request-Id"


def test_a_null_max_tokens_on_completions_is_sixteen(http: httpx.Client) -> None:
    """vLLM's completions read an explicit null as the field's default (16), as an absent one."""
    for body in ({"max_tokens": None}, {}):
        r = http.post(COMPLETIONS, json={"prompt": "hi", **GREEDY, **body}).json()
        assert r["usage"]["completion_tokens"] == 16, body


def test_empty_tools_and_stream_options(http: httpx.Client) -> None:
    msg = [{"role": "user", "content": "hi"}]
    r = http.post(CHAT, json={"messages": msg, "tools": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    # {} asks for nothing: accepted without stream (vLLM); options that say something are not.
    assert http.post(CHAT, json={"messages": msg, "max_tokens": 1,
                                 "stream_options": {}}).status_code == 200
    r = http.post(CHAT, json={"messages": msg, "max_tokens": 1,
                              "stream_options": {"include_usage": True}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"


def test_without_a_generation_prompt_the_answer_has_the_last_role(http: httpx.Client) -> None:
    """vLLM: without the generation prompt the answer continues the last message in its role;
    echo repeats that message, streamed or not, and continuing a user's message is allowed."""
    body = {"messages": [{"role": "user", "content": "Once upon"}], "max_tokens": 4,
            "add_generation_prompt": False, **GREEDY}
    plain = http.post(CHAT, json=body).json()["choices"][0]["message"]
    assert plain["role"] == "user"
    echoed = http.post(CHAT, json={**body, "echo": True}).json()["choices"][0]["message"]
    assert echoed == {**plain, "content": "Once upon" + plain["content"]}
    chunks = _chunks(http, CHAT, {**body, "echo": True})
    assert chunks[0]["choices"][0]["delta"] == {"role": "user", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Once upon" + plain["content"]
    cont = http.post(CHAT, json={**body, "continue_final_message": True})
    assert cont.status_code == 200 and cont.json()["choices"][0]["message"]["role"] == "user"
    # With the generation prompt the answer is the assistant's, and a user's text is no echo.
    gen = {**body, "add_generation_prompt": True}
    a = http.post(CHAT, json=gen).json()["choices"][0]["message"]
    b = http.post(CHAT, json={**gen, "echo": True}).json()["choices"][0]["message"]
    assert a["role"] == b["role"] == "assistant" and a["content"] == b["content"]


def test_the_echo_chunk_carries_continuous_usage(http: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "Tell me"},
                         {"role": "assistant", "content": "Once"}],
            "add_generation_prompt": False, "continue_final_message": True, "echo": True,
            "max_tokens": 3, **GREEDY,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = _chunks(http, CHAT, body)
    with_choices = [c for c in chunks if c["choices"]]
    assert with_choices[1]["choices"][0]["delta"] == {"content": "Once"}
    assert all(c["usage"] is not None for c in chunks)
    assert with_choices[1]["usage"]["completion_tokens"] == 0


def test_an_answer_without_calls_has_no_tool_calls(server, http: httpx.Client) -> None:
    r = http.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 2}).json()
    assert "tool_calls" not in r["choices"][0]["message"]
    assert "prompt_tokens_details" not in r["usage"]  # only with the flag and a cache hit
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(model="tiny", max_tokens=2,
                                           messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.tool_calls is None


def test_minus_one_logprobs_are_the_vocabulary(server_factory) -> None:
    """vLLM: top_logprobs / logprobs -1 ask for every token's; allowed when --max-logprobs is
    -1 (the vocabulary), a 400 naming the field under a smaller cap."""
    msg = [{"role": "user", "content": "hi"}]
    uncapped = server_factory(max_logprobs=-1)
    vocab = uncapped.engine.tokenizer.vocab_size
    with httpx.Client(base_url=uncapped.base_url, timeout=60) as http:
        r = http.post(CHAT, json={"messages": msg, "max_tokens": 2, "logprobs": True,
                                  "top_logprobs": -1})
        assert r.status_code == 200, r.text
        content = r.json()["choices"][0]["logprobs"]["content"]
        assert len(content) == 2
        assert all(len(c["top_logprobs"]) >= vocab for c in content)
        ranks = [t["logprob"] for t in content[0]["top_logprobs"]]
        assert ranks == sorted(ranks, reverse=True)
        # The legacy rows are keyed by text: tokens of the same text share a key.
        texts = len({t["token"] for t in content[0]["top_logprobs"]})
        assert texts > 100
        r = http.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 1, "logprobs": -1})
        assert r.status_code == 200
        assert len(r.json()["choices"][0]["logprobs"]["top_logprobs"][0]) == texts
        # echo: the prompt's rows are whole too
        r = http.post(COMPLETIONS, json={"prompt": "hi there", "max_tokens": 1, "logprobs": -1,
                                         "echo": True})
        rows = r.json()["choices"][0]["logprobs"]["top_logprobs"]
        assert rows[0] is None and all(len(row) == texts for row in rows[1:])
    capped = server_factory(max_logprobs=5)
    with httpx.Client(base_url=capped.base_url, timeout=60) as http:
        r = http.post(CHAT, json={"messages": msg, "max_tokens": 2, "logprobs": True,
                                  "top_logprobs": -1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"
        r = http.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 1, "logprobs": -1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
        r = http.post(CHAT, json={"messages": msg, "top_logprobs": -2, "logprobs": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"


@pytest.fixture(scope="module")
def shaped(request) -> Any:
    from cadence.engine.async_llm import AsyncLLM
    from tests.server.conftest import start_server, tiny_args

    options = ResponseOptions(response_role="narrator", enable_prompt_tokens_details=True,
                              enable_force_include_usage=True, return_tokens_as_token_ids=True,
                              enable_request_id_headers=True)
    running = start_server(AsyncLLM(tiny_args(enable_prefix_caching=True)), responses=options,
                           api_key="k")
    yield running
    running.stop()


def test_the_response_flags(shaped) -> None:
    auth = {"Authorization": "Bearer k"}
    prompt = "The same long prompt, to be served from the prefix cache the second time. " * 3
    msg = [{"role": "user", "content": prompt}]
    with httpx.Client(base_url=shaped.base_url, timeout=60, headers=auth) as http:
        first = http.post(CHAT, json={"messages": msg, "max_tokens": 2})
        assert first.json()["choices"][0]["message"]["role"] == "narrator"
        # A fresh id on every response, and the request's own where it gave one.
        assert re.fullmatch(r"[0-9a-f]{32}", first.headers["x-request-id"])
        second = http.post(CHAT, json={"messages": msg, "max_tokens": 2},
                           headers={"X-Request-Id": "mine"})
        assert second.headers["x-request-id"] == "mine"
        assert second.json()["id"] == "chatcmpl-mine"
        # A repeated header: the first one names the request and its response alike.
        twice = http.post(CHAT, json={"messages": msg, "max_tokens": 1},
                          headers=[("X-Request-Id", "aaa"), ("X-Request-Id", "bbb")])
        assert twice.headers["x-request-id"] == "aaa" and twice.json()["id"] == "chatcmpl-aaa"
        block = shaped.engine.block_size
        n_prompt = second.json()["usage"]["prompt_tokens"]
        cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached == (n_prompt - 1) // block * block > 0
        assert "prompt_tokens_details" not in first.json()["usage"]  # nothing cached yet
        # Streams end with their usage unasked, its cached tokens included; the role chunk
        # names the response role.
        chunks = _chunks(http, CHAT, {"messages": msg, "max_tokens": 2})
        assert chunks[0]["choices"][0]["delta"]["role"] == "narrator"
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": cached}
        assert all(c["usage"] is None for c in chunks[:-1])  # no continuous usage unasked
        done = _chunks(http, COMPLETIONS, {"prompt": prompt, "max_tokens": 2,
                                           "stream_options": {"include_usage": False}})
        assert done[-1]["choices"] == [] and done[-1]["usage"]["completion_tokens"] == 2
        # Logprobs name tokens by id unless the request says otherwise.
        lp = http.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 2, "logprobs": 1})
        assert all(re.fullmatch(r"token_id:\d+", t)
                   for t in lp.json()["choices"][0]["logprobs"]["tokens"])
        lp = http.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 2, "logprobs": 1,
                                          "return_tokens_as_token_ids": False})
        assert not any(t.startswith("token_id:")
                       for t in lp.json()["choices"][0]["logprobs"]["tokens"])
        # The 401 of a request without the key carries an id too.
        bare = httpx.post(shaped.base_url + CHAT, json={"messages": msg})
        assert bare.status_code == 401 and "x-request-id" in bare.headers


def test_the_flags_reach_the_settings() -> None:
    import argparse

    from cadence.server.cli import add_serve_args, settings_from

    parser = add_serve_args(argparse.ArgumentParser())
    ns = parser.parse_args(["--response-role", "bot", "--enable-prompt-tokens-details",
                            "--enable-force-include-usage", "--return-tokens-as-token-ids",
                            "--enable-request-id-headers"])
    assert settings_from(ns).responses == ResponseOptions(
        response_role="bot", enable_prompt_tokens_details=True,
        enable_force_include_usage=True, return_tokens_as_token_ids=True,
        enable_request_id_headers=True)
    assert settings_from(parser.parse_args([])).responses == ResponseOptions()
    for flag in ("prompt-tokens-details", "force-include-usage", "request-id-headers"):
        alone = settings_from(parser.parse_args([f"--enable-{flag}"])).responses
        field = f"enable_{flag.replace('-', '_')}"
        assert alone == ResponseOptions(**{field: True}), flag  # that one, no other
    alone = settings_from(parser.parse_args(["--return-tokens-as-token-ids"])).responses
    assert alone == ResponseOptions(return_tokens_as_token_ids=True)
    with pytest.raises(ValueError, match="response_role"):
        ResponseOptions(response_role=" ")


def test_requests_sharing_a_client_id_run_side_by_side(server) -> None:
    """vLLM: the client's id names each response, the engine's ids stay unique: two streams
    with one X-Request-Id at once, then another after them (a closed stream's abort must not
    end it), all complete."""
    import asyncio

    async def run() -> list[tuple[int, set[str], str]]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
            async def one() -> tuple[int, set[str], str]:
                body = {"prompt": "Hello", "max_tokens": 6, "stream": True, **GREEDY}
                async with http.stream("POST", COMPLETIONS, json=body,
                                       headers={"X-Request-Id": "fan-out"}) as r:
                    lines = [x async for x in r.aiter_lines() if x.startswith("data: ")]
                chunks = [json.loads(x[6:]) for x in lines if x != "data: [DONE]"]
                return r.status_code, {c["id"] for c in chunks}, lines[-1]

            both = await asyncio.gather(one(), one())
            return [*both, await one()]

    for status, ids, last in asyncio.run(run()):
        assert (status, ids, last) == (200, {"cmpl-fan-out"}, "data: [DONE]")


def test_cached_token_details_in_streams_as_in_whole_answers(shaped) -> None:
    """vLLM shows prompt_tokens_details only where some tokens were cached, streamed or not;
    a streamed request of several prompts adds their cached tokens up, as its whole answer."""
    auth = {"Authorization": "Bearer k"}
    fresh = "A prompt seen once only, for the streamed usage of nothing cached. " * 2
    warm = "Another long prompt that the second request finds in the prefix cache. " * 3
    with httpx.Client(base_url=shaped.base_url, timeout=60, headers=auth) as http:
        chunks = _chunks(http, COMPLETIONS, {"prompt": fresh, "max_tokens": 2,
                                             "stream_options": {"include_usage": True}})
        assert "prompt_tokens_details" not in chunks[-1]["usage"]
        http.post(COMPLETIONS, json={"prompt": warm, "max_tokens": 1})
        body = {"prompt": [warm, "A fresh second prompt."], "max_tokens": 2}
        whole = http.post(COMPLETIONS, json=body).json()["usage"]
        streamed = _chunks(http, COMPLETIONS, {**body, "stream_options": {
            "include_usage": True}})[-1]["usage"]
    assert whole["prompt_tokens_details"]["cached_tokens"] > 0
    assert streamed["prompt_tokens_details"] == whole["prompt_tokens_details"]
