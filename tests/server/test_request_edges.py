"""Request fields at the edges vLLM and OpenAI accept, usage counted once per prompt, salts
that keep tenants' prefix caches apart on both endpoints, and the Responses API's sampling
fields reaching the engine."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from cadence.server.errors import BadRequestError

PROMPT = "Once upon a time"
CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("route", "body"), [
    ("/v1/completions", {"prompt": PROMPT, "logit_bias": {"0": 5}}),  # token 0 is a token
    ("/v1/completions", {"prompt": PROMPT, "stream": True, "prompt_logprobs": 0}),
    ("/v1/completions", {"prompt": PROMPT, "stream_options": {}}),  # {}: nothing asked
    ("/v1/chat/completions", {"messages": CHAT, "tool_choice": "none"}),  # none needs no tools
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "text"},
                              "structured_outputs": {"choice": ["a", "b"]}}),
])
def test_values_vllm_accepts_are_accepted(http: httpx.Client, route: str, body: dict) -> None:
    resp = http.post(route, json={**body, "max_tokens": 2})
    assert resp.status_code == 200, resp.text


def test_a_bad_grammar_beside_a_text_format_names_structured_outputs(http) -> None:
    resp = http.post("/v1/chat/completions", json={
        "messages": CHAT, "max_tokens": 2, "response_format": {"type": "text"},
        "structured_outputs": {"regex": "("}})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "structured_outputs"


def test_request_id_header_up_to_its_bound_and_an_empty_one(http: httpx.Client) -> None:
    body = {"prompt": PROMPT, "max_tokens": 1}
    longest = "x" * 256
    resp = http.post("/v1/completions", json=body, headers={"X-Request-Id": longest})
    assert resp.status_code == 200 and resp.json()["id"] == "cmpl-" + longest
    resp = http.post("/v1/completions", json=body, headers={"X-Request-Id": longest + "y"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "X-Request-Id"
    # An empty header is no id: the body's request_id stands.
    resp = http.post("/v1/completions", json={**body, "request_id": "mine"},
                     headers={"X-Request-Id": ""})
    assert resp.status_code == 200 and resp.json()["id"] == "cmpl-mine"


def test_prompt_tokens_are_counted_once_per_prompt_whatever_n(http: httpx.Client) -> None:
    """OpenAI's usage: n choices of one prompt read it once."""
    one = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}).json()
    prompt_tokens = one["usage"]["prompt_tokens"]
    body = {"prompt": PROMPT, "max_tokens": 2, "n": 3, "temperature": 1.0, "seed": 1,
            "ignore_eos": True}
    usage = http.post("/v1/completions", json=body).json()["usage"]
    assert usage["prompt_tokens"] == prompt_tokens
    assert usage["total_tokens"] == prompt_tokens + 6
    with http.stream("POST", "/v1/completions", json={
            **body, "stream": True, "stream_options": {"include_usage": True}}) as resp:
        frames = [line[6:] for line in resp.iter_lines() if line.startswith("data: {")]
    assert json.loads(frames[-1])["usage"]["prompt_tokens"] == prompt_tokens


def test_chat_logprobs_true_alone_gives_each_tokens_logprob(client: openai.OpenAI) -> None:
    """OpenAI: logprobs true without top_logprobs is the chosen tokens' logprobs, with empty
    top lists (not null)."""
    kw = dict(model="tiny", messages=CHAT, max_tokens=3, logprobs=True,
              extra_body={"ignore_eos": True})
    content = client.chat.completions.create(**kw).choices[0].logprobs.content
    assert len(content) == 3 and all(t.top_logprobs == [] for t in content)
    streamed = [t for chunk in client.chat.completions.create(**kw, stream=True)
                for c in chunk.choices if c.logprobs and c.logprobs.content
                for t in c.logprobs.content]
    assert len(streamed) == 3 and all(t.top_logprobs == [] for t in streamed)


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_cache_salt_keeps_the_prefix_cache_apart_on_both_endpoints(server, route) -> None:
    from tests.server.waiting import metric, scrape

    text = f"A long and unique text about salts on {route} and tenants. " * 6
    body = ({"prompt": text} if route == "/v1/completions"
            else {"messages": [{"role": "user", "content": text}]})
    body = {**body, "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        def hits_of(salt: str) -> float:
            before = metric(scrape(http), "cadence:prefix_cache_hits_total", model_name="tiny")
            resp = http.post(route, json={**body, "cache_salt": salt})
            assert resp.status_code == 200, resp.text
            return metric(scrape(http), "cadence:prefix_cache_hits_total",
                          model_name="tiny") - before

        assert hits_of("alice") == 0
        assert hits_of("bob") == 0  # alice's blocks are not bob's
        assert hits_of("alice") >= 4 * server.engine.block_size


def test_responses_api_passes_top_p_and_stop(client: openai.OpenAI) -> None:
    plain = client.responses.create(model="tiny", input="hi", max_output_tokens=12,
                                    temperature=0)
    text = plain.output_text
    assert len(text) > 6
    stopped = client.responses.create(model="tiny", input="hi", max_output_tokens=12,
                                      temperature=0, extra_body={"stop": [text[3:6]]})
    assert stopped.output_text == text[:3]
    shown = client.responses.create(model="tiny", input="hi", max_output_tokens=2, top_p=0.5)
    assert shown.top_p == 0.5


def test_an_error_event_is_a_whole_sse_event() -> None:
    """An SSE event ends with a blank line: the error frame and the [DONE] after it are two
    events to a spec-following client."""
    frame = BadRequestError("bad", "x").sse_frame()
    assert frame.startswith("data: {") and frame.endswith("}\n\n")


def test_max_logprobs_zero_allows_only_the_chosen_token(server_factory) -> None:
    """--max-logprobs 0: no alternatives (0 is a cap, not "all"; -1 is all)."""
    srv = server_factory(max_logprobs=0)
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        ok = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "logprobs": 0})
        assert ok.status_code == 200, ok.text
        resp = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1,
                                                  "logprobs": 3})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "logprobs"


def test_a_streamed_request_of_several_prompts_ends_with_the_last(server_factory) -> None:
    """One sequence at a time: the second prompt runs after the first has finished; the stream
    carries both to their finish reasons (not only the first's)."""
    srv = server_factory(max_num_seqs=1)
    body = {"prompt": ["a b", "c d"], "max_tokens": 3, "ignore_eos": True, "stream": True}
    finish: dict[int, str] = {}
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=body) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        if choice["finish_reason"]:
                            finish[choice["index"]] = choice["finish_reason"]
    assert finish == {0: "length", 1: "length"}


def test_responses_truncation_auto_fits_a_long_input(http: httpx.Client) -> None:
    """OpenAI's truncation "auto": an input past the context is cut (its oldest part) to fit,
    not refused; "disabled" (the default) refuses it."""
    body = {"model": "tiny", "input": "word " * 700, "max_output_tokens": 4}
    refused = http.post("/v1/responses", json=body)
    assert refused.status_code == 400
    resp = http.post("/v1/responses", json={**body, "truncation": "auto"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["input_tokens"] <= 512 - 4
