"""The OpenAI API through the official ``openai`` client, against a real uvicorn server."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import openai
import pytest

from tests.gated_core import GatedCore
from tests.server.waiting import wait_until

PROMPT = "Hello my name is Robert and"


def prompt_len(server, text: str) -> int:
    return len(server.engine.tokenizer.encode(text))


def test_models_health_version(server, client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].max_model_len == 512  # type: ignore[attr-defined]
    card = httpx.get(server.base_url + "/v1/models").json()["data"][0]
    # vLLM's card: the root model, no parent, one permission entry.
    assert card["root"] == "tiny" and card["parent"] is None
    (perm,) = card["permission"]
    assert perm["object"] == "model_permission" and perm["id"].startswith("modelperm-")
    assert perm["allow_sampling"] and perm["allow_logprobs"] and perm["organization"] == "*"
    assert httpx.get(server.base_url + "/health").status_code == 200
    version = httpx.get(server.base_url + "/version").json()["version"]
    assert version and isinstance(version, str)


def test_completion_greedy_stream_equals_non_stream(server, client: openai.OpenAI) -> None:
    kw = dict(
        model="tiny", prompt=PROMPT, max_tokens=24, temperature=0.0, extra_body={"ignore_eos": True}
    )
    full = client.completions.create(**kw)
    choice = full.choices[0]
    assert choice.finish_reason == "length"
    assert full.usage is not None
    n_prompt = prompt_len(server, PROMPT)
    assert (full.usage.prompt_tokens, full.usage.completion_tokens) == (n_prompt, 24)
    assert full.usage.total_tokens == n_prompt + 24
    assert full.id.startswith("cmpl-") and full.object == "text_completion"

    chunks = list(
        client.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == choice.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    # The usage chunk comes last, with no choices; the others carry no usage.
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (n_prompt, 24)
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_completion_token_prompt_and_batch(server, client: openai.OpenAI) -> None:
    ids = server.engine.tokenizer.encode(PROMPT)
    by_text = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0)
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    batch = client.completions.create(
        model="tiny", prompt=[PROMPT, "The capital of France"], max_tokens=5, temperature=0
    )
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == by_text.choices[0].text[: len(batch.choices[0].text)]
    assert batch.usage is not None and batch.usage.completion_tokens == 10


def test_completion_stop_seed_and_logprobs(server, client: openai.OpenAI) -> None:
    base = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=30, temperature=0, extra_body={"ignore_eos": True}
    )
    text = base.choices[0].text
    stop = text[8:11]
    stopped = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=30,
        temperature=0,
        stop=[stop],
        extra_body={"ignore_eos": True},
    )
    assert stopped.choices[0].text == text[: text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].stop_reason == stop  # type: ignore[attr-defined]

    seeded = [
        client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=7
        )
        .choices[0]
        .text
        for _ in range(2)
    ]
    assert seeded[0] == seeded[1]

    lp = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        logprobs=3,
        extra_body={"ignore_eos": True},
    )
    logprobs = lp.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert len(logprobs.tokens) == 6 and "".join(logprobs.tokens) == lp.choices[0].text
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(6)]
    for tok, tok_lp, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        # Greedy: the sampled token is the most likely one, listed among the top 3.
        assert 3 <= len(top) <= 4 and tok in top and top[tok] == pytest.approx(tok_lp)
        assert tok_lp == pytest.approx(max(top.values()))


def test_completion_top_logprobs_list_the_sampled_token_first(server, client) -> None:
    """A sampled token outside the most likely ones (a bias picks it) leads each position's
    top_logprobs, before the ``logprobs`` most likely, as vLLM orders them."""
    tok = server.engine.tokenizer
    favourite = tok.encode(" zebra", add_special_tokens=False)[0]
    lp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0,
                                   logprobs=2, logit_bias={str(favourite): 100},
                                   extra_body={"ignore_eos": True})
    logprobs = lp.choices[0].logprobs
    for shown, shown_lp, top in zip(logprobs.tokens, logprobs.token_logprobs,
                                    logprobs.top_logprobs, strict=True):
        assert shown == tok.decode([favourite])
        keys = list(top)
        assert keys[0] == shown and top[shown] == pytest.approx(shown_lp)
        others = list(top.values())[1:]
        assert len(keys) == 3 and others == sorted(others, reverse=True)
        assert shown_lp < others[-1]  # raw logprobs: the bias made it, not the model


def test_chat_stream_equals_non_stream_with_logprobs(server, client: openai.OpenAI) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say something."},
    ]
    kw = dict(
        model="tiny",
        messages=messages,
        temperature=0.0,
        max_completion_tokens=20,
        extra_body={"ignore_eos": True},
    )
    full = client.chat.completions.create(**kw, logprobs=True, top_logprobs=2)
    msg = full.choices[0].message
    assert msg.role == "assistant" and msg.content
    assert full.choices[0].finish_reason == "length"
    ids = server.engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    n_prompt = len(server.engine.tokenizer.encode(ids, add_special_tokens=False))
    assert full.usage is not None
    assert (full.usage.prompt_tokens, full.usage.completion_tokens) == (n_prompt, 20)
    assert full.usage.total_tokens == n_prompt + 20
    content = full.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 20
    assert "".join(c.token for c in content) == msg.content
    for c in content:
        assert len(c.top_logprobs) == 2 and c.top_logprobs[0].token == c.token
        assert c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob
        assert bytes(c.bytes or []) == c.token.encode()

    chunks = list(
        client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == msg.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.total_tokens) == (n_prompt,
                                                                               n_prompt + 20)
    # The deprecated max_tokens works too; max_completion_tokens wins when both are given.
    legacy = client.chat.completions.create(
        model="tiny",
        messages=messages,
        temperature=0.0,
        max_tokens=5,
        extra_body={"ignore_eos": True},
    )
    assert legacy.usage is not None and legacy.usage.completion_tokens == 5
    both = client.chat.completions.create(
        model="tiny",
        messages=messages,
        temperature=0.0,
        max_tokens=5,
        max_completion_tokens=7,
        extra_body={"ignore_eos": True},
    )
    assert both.usage is not None and both.usage.completion_tokens == 7


def test_streamed_logprobs_equal_the_non_streamed_ones(server) -> None:
    """Each streamed chunk carries the logprobs of its own tokens; put together they are the
    non-streamed answer's, for both endpoints."""
    greedy = {"model": "tiny", "temperature": 0, "ignore_eos": True, "max_tokens": 12}
    cases = [
        ("/v1/completions", {**greedy, "prompt": PROMPT, "logprobs": 3}),
        ("/v1/chat/completions", {**greedy, "messages": [{"role": "user", "content": "Hi"}],
                                  "logprobs": True, "top_logprobs": 3}),
    ]
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        for route, body in cases:
            full = http.post(route, json=body).json()["choices"][0]["logprobs"]
            with http.stream("POST", route, json={**body, "stream": True}) as r:
                chunks = [json.loads(line[6:]) for line in r.iter_lines()
                          if line.startswith("data: {")]
            parts = [c["choices"][0]["logprobs"] for c in chunks
                     if c["choices"] and c["choices"][0].get("logprobs")]
            if route == "/v1/completions":
                assert len(full["tokens"]) == 12
                for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                    streamed = [x for p in parts for x in p[key]]
                    if key == "token_logprobs":
                        assert streamed == pytest.approx(full[key], abs=1e-5)
                    elif key == "top_logprobs":
                        assert [sorted(t) for t in streamed] == [sorted(t) for t in full[key]]
                    else:
                        assert streamed == full[key], key
                texts = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
                assert "".join(full["tokens"]) == texts
            else:
                streamed = [x for p in parts for x in p["content"]]
                assert len(full["content"]) == len(streamed) == 12
                for got, want in zip(streamed, full["content"], strict=True):
                    assert got["token"] == want["token"]
                    assert got["logprob"] == pytest.approx(want["logprob"], abs=1e-5)
                    assert [t["token"] for t in got["top_logprobs"]] == [
                        t["token"] for t in want["top_logprobs"]]
                    assert len(got["top_logprobs"]) == 3


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_stats(server, route: str) -> None:
    body = {
        "model": "tiny",
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if route == "/v1/completions":
        body["prompt"] = PROMPT
    else:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    with httpx.stream("POST", server.base_url + route, json=body) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    final = chunks[-1]["usage"]
    assert final["completion_tokens"] == 6 and final["prompt_tokens"] > 6
    usages = [c["usage"] for c in chunks if c["choices"] and c.get("usage")]
    counts = [u["completion_tokens"] for u in usages]
    assert counts == sorted(counts) and counts[-1] == 6
    # Each chunk's usage: the prompt's tokens, the completion's so far, and their sum.
    for u in usages:
        assert u["prompt_tokens"] == final["prompt_tokens"], u
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u


@pytest.mark.parametrize("truncate", [4, -1])
def test_chat_prompt_ids_are_the_truncated_prompt_streamed_or_not(server, truncate) -> None:
    """return_token_ids with truncate_prompt_tokens: the prompt ids shown are those the engine
    ran (the rendered prompt's last tokens), in the stream's first chunk as in the whole
    answer, and as many as the usage counts."""
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": PROMPT}],
            "return_token_ids": True}
    full = httpx.post(server.base_url + "/v1/chat/completions", json=body).json()
    whole = httpx.post(server.base_url + "/v1/chat/completions",
                       json={**body, "truncate_prompt_tokens": truncate}).json()
    kept = whole["usage"]["prompt_tokens"]
    assert kept == (4 if truncate == 4 else len(full["prompt_token_ids"]))
    assert whole["prompt_token_ids"] == full["prompt_token_ids"][-kept:]
    with httpx.stream("POST", server.base_url + "/v1/chat/completions",
                      json={**body, "truncate_prompt_tokens": truncate, "stream": True,
                            "stream_options": {"include_usage": True}}) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines()
                  if ln.startswith("data: ") and ln != "data: [DONE]"]
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert chunks[-1]["usage"]["prompt_tokens"] == kept


@pytest.mark.parametrize("truncate", [None, 3])
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_counts_each_choice_of_n(server, route: str, truncate) -> None:
    # vLLM: a chunk's completion_tokens are its own choice's so far; the final usage is the sum.
    body = {"model": "tiny", "max_tokens": 5, "n": 3, "seed": 1, "ignore_eos": True,
            "stream": True, "truncate_prompt_tokens": truncate,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if route == "/v1/completions":
        body["prompt"] = PROMPT
    else:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    with httpx.stream("POST", server.base_url + route, json=body) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines()
                  if ln.startswith("data: ") and ln != "data: [DONE]"]
    assert chunks[-1]["usage"]["completion_tokens"] == 15
    assert truncate is None or chunks[-1]["usage"]["prompt_tokens"] == truncate
    seen = {0: 0, 1: 0, 2: 0}
    for c in chunks:
        if not c["choices"]:
            continue
        (choice,) = c["choices"]
        usage = c["usage"]  # every chunk, the chat role chunks too (with 0 tokens)
        assert usage["prompt_tokens"] == chunks[-1]["usage"]["prompt_tokens"], c
        count = usage["completion_tokens"]
        assert seen[choice["index"]] <= count <= 5, (seen, c)  # its own count, never another's
        seen[choice["index"]] = count
    assert seen == {0: 5, 1: 5, 2: 5}


def test_api_key_protects_v1_routes(server_factory) -> None:
    srv = server_factory(app_kwargs={"api_key": "sesame"})
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
            resp = http.get("/v1/models", headers=headers)
            assert resp.status_code == 401
            assert resp.headers["www-authenticate"] == "Bearer"  # RFC 9110: a 401 names it
            err = resp.json()["error"]
            assert err["code"] == 401 and err["type"] == "AuthenticationError"
            resp = http.post("/v1/completions", json={"prompt": "x"}, headers=headers)
            assert resp.status_code == 401
        # Health and metrics stay open, as in vLLM.
        assert http.get("/health").status_code == 200
        assert http.get("/metrics").status_code == 200
    good = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="sesame", max_retries=0)
    out = good.completions.create(model="tiny", prompt=PROMPT, max_tokens=3)
    assert out.usage is not None and out.usage.completion_tokens == 3
    bad = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="tiny", prompt=PROMPT, max_tokens=3)



def test_any_of_several_api_keys_is_accepted(server_factory) -> None:
    """``--api-key A B`` (vLLM's, for key rotation): either key opens the routes, nothing else;
    a key of one is no prefix or part of the other's."""
    srv = server_factory(app_kwargs={"api_key": ["old-key", "new-key"]})
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        for key, status in (("old-key", 200), ("new-key", 200), ("old", 401),
                            ("old-keynew-key", 401), ("old-key new-key", 401)):
            resp = http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert resp.status_code == status, (key, resp.text)
        # The scheme in any case (RFC 9110, vLLM); the token exactly.
        for value, status in (("bearer new-key", 200), ("BEARER old-key", 200),
                              ("Bearer NEW-KEY", 401), ("Bearer  new-key", 401),
                              ("Basic new-key", 401), ("Bearernew-key", 401)):
            resp = http.get("/v1/models", headers={"Authorization": value})
            assert resp.status_code == status, (value, resp.text)
        # Of two Authorization headers the first counts, as Starlette and proxies read it.
        for values, status in ((["Bearer new-key", "Bearer wrong"], 200),
                               (["Bearer wrong", "Bearer new-key"], 401)):
            headers = [("Authorization", v) for v in values]
            assert http.get("/v1/models", headers=headers).status_code == status, values

def metric_values(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_metrics_speak_openmetrics_and_gzip_when_asked(server) -> None:
    """prometheus_client's exposition rules (vLLM mounts its ASGI app): OpenMetrics for an
    Accept that asks for it, gzip for an Accept-Encoding that takes it, plain text otherwise."""
    import gzip

    url = server.base_url + "/metrics"
    plain = httpx.get(url, headers={"accept-encoding": "identity"})
    assert plain.headers["content-type"].startswith("text/plain")
    assert "content-encoding" not in plain.headers
    om = httpx.get(url, headers={"accept": "application/openmetrics-text; version=1.0.0",
                                 "accept-encoding": "identity"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF") and "cadence:num_requests_running" in om.text
    with httpx.stream("GET", url, headers={"accept-encoding": "gzip"}) as zipped:
        assert zipped.headers["content-encoding"] == "gzip"
        raw = b"".join(zipped.iter_raw())
    assert gzip.decompress(raw).decode().startswith("# HELP")


def test_metrics_count_exactly(server, client: openai.OpenAI) -> None:
    before = metric_values(httpx.get(server.base_url + "/metrics").text)
    outs = [
        client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=n,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        for n in (3, 7)
    ]
    resp = httpx.get(server.base_url + "/metrics")
    assert resp.headers["content-type"].startswith("text/plain")
    after = metric_values(resp.text)
    label = '{engine="0",model_name="tiny"}'

    def delta(name: str) -> float:
        return after[name + label] - before.get(name + label, 0.0)

    assert delta("cadence:prompt_tokens_total") == sum(o.usage.prompt_tokens for o in outs)
    assert delta("cadence:generation_tokens_total") == 10
    assert delta("cadence:time_to_first_token_seconds_count") == 2
    assert delta("cadence:e2e_request_latency_seconds_count") == 2
    # One inter-token gap per token after the first.
    assert delta("cadence:inter_token_latency_seconds_count") == (3 - 1) + (7 - 1)
    # Per-request phases and parameters (vLLM's set), one observation per request.
    for phase in ("queue", "prefill", "decode", "inference"):
        assert delta(f"cadence:request_{phase}_time_seconds_count") == 2
    assert delta("cadence:request_prompt_tokens_sum") == sum(o.usage.prompt_tokens for o in outs)
    assert delta("cadence:request_generation_tokens_sum") == 10
    assert delta("cadence:request_params_max_tokens_sum") == 10
    assert delta("cadence:request_params_n_sum") == 2
    assert delta("cadence:request_max_num_generation_tokens_sum") == 10
    assert delta("cadence:request_time_per_output_token_seconds_count") == 2
    assert after["cadence:num_requests_running" + label] == 0
    assert after["cadence:num_requests_waiting" + label] == 0
    assert after["cadence:kv_cache_usage_perc" + label] == 0
    success = 'cadence:request_success_total{engine="0",finished_reason="length",model_name="tiny"}'
    assert after[success] - before.get(success, 0.0) == 2


def test_n_is_observed_once_per_request(server) -> None:
    """request_params_n and request_max_num_generation_tokens: one observation per request as
    sent (vLLM), with n and the most tokens one of its choices generated."""
    label = '{engine="0",model_name="tiny"}'
    before = metric_values(httpx.get(server.base_url + "/metrics").text)
    body = {"prompt": "Hello", "n": 3, "max_tokens": 6, "temperature": 1.0, "seed": 5,
            "stop": ["e"]}
    out = httpx.post(server.base_url + "/v1/completions", json=body, timeout=60).json()
    after = metric_values(httpx.get(server.base_url + "/metrics").text)

    def delta(name: str) -> float:
        return after[name + label] - before.get(name + label, 0.0)

    assert delta("cadence:request_params_n_count") == 1
    assert delta("cadence:request_params_n_sum") == 3
    assert delta("cadence:request_max_num_generation_tokens_count") == 1
    generated = delta("cadence:generation_tokens_total")
    assert generated == out["usage"]["completion_tokens"]
    # The most of one choice: at most 6, at least a third of all three's.
    assert generated / 3 <= delta("cadence:request_max_num_generation_tokens_sum") <= 6
    if any(c["finish_reason"] == "length" for c in out["choices"]):
        assert delta("cadence:request_max_num_generation_tokens_sum") == 6
    assert delta("cadence:e2e_request_latency_seconds_count") == 3  # per choice, as in vLLM


class BrokenStatLogger:
    def record(self, scheduler_stats: object, iteration_stats: object) -> None:
        raise RuntimeError("metrics backend down")


def test_a_failing_stat_logger_takes_neither_serving_nor_metrics_down(server_factory) -> None:
    srv = server_factory()
    srv.engine.stat_loggers.insert(0, BrokenStatLogger())  # ahead of the server's own logger
    label = '{engine="0",model_name="tiny"}'
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        for stream in (False, True):
            body = {"prompt": PROMPT, "max_tokens": 3, "ignore_eos": True, "stream": stream}
            resp = http.post("/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
        assert resp.text.rstrip().endswith("data: [DONE]")
        values = metric_values(http.get("/metrics").text)
        assert http.get("/health").status_code == 200
    assert values["cadence:generation_tokens_total" + label] == 6
    assert values['cadence:request_success_total{engine="0",finished_reason="length",model_name="tiny"}'] == 2
    assert values["cadence:num_requests_running" + label] == 0


def test_metrics_gauges_while_busy(server_factory) -> None:
    # The engine is held after the first token: the scrape sees the request running.
    srv = server_factory(core_factory=GatedCore)
    core: GatedCore = srv.engine.engine_core.proc.engine_core
    body = {"prompt": PROMPT, "max_tokens": 64, "temperature": 0, "ignore_eos": True,
            "stream": True}
    try:
        with httpx.Client(base_url=srv.base_url, timeout=30) as http:
            core.allow(2)  # the prefill and one more step: the request holds its blocks
            with http.stream("POST", "/v1/completions", json=body) as r:
                # Keep the iterator: a dropped one is closed, and so is the connection (abort).
                lines = r.iter_lines()
                for line in lines:
                    if line.startswith("data: "):
                        break
                core.wait_at_gate()
                # The engine is held between two steps: the scrape serves the stats the last
                # step's outputs brought, without asking the engine (which would wait).
                ask = srv.engine.do_log_stats
                asked = []
                srv.engine.do_log_stats = lambda: asked.append(1) or ask()
                try:
                    values = metric_values(http.get("/metrics").text)
                    stats = http.get("/stats").json()
                finally:
                    del srv.engine.do_log_stats
                assert asked == []
                core.open()
                assert any(ln == "data: [DONE]" for ln in lines)  # it ran to the end
    finally:
        core.open()
    label = '{engine="0",model_name="tiny"}'
    assert values["cadence:num_requests_running" + label] == 1, values
    assert 0 < values["cadence:kv_cache_usage_perc" + label] < 1
    assert stats["status"] == "serving"


def test_scrapes_do_not_wait_long_for_a_busy_engine(server_factory, monkeypatch) -> None:
    """With no request of its own in the engine a scrape asks for fresh scheduler stats; an
    engine that does not answer (a long step, other front ends' work) holds /metrics and
    /stats for STATS_WAIT_S at most, then the last figures are served. The question is asked
    once while unanswered (a second scrape waits on it rather than asking again)."""
    from cadence.server import app as app_module

    srv = server_factory()
    asked = []

    async def never_answered() -> None:
        asked.append(1)
        await asyncio.Event().wait()

    monkeypatch.setattr(app_module, "STATS_WAIT_S", 0.05)
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        resp = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2,
                                                  "ignore_eos": True})
        assert resp.status_code == 200, resp.text
        monkeypatch.setattr(srv.engine, "do_log_stats", never_answered)
        text = http.get("/metrics").text
        assert http.get("/stats").json()["status"] == "serving"
    assert len(asked) == 1
    label = '{engine="0",model_name="tiny"}'
    assert metric_values(text)["cadence:generation_tokens_total" + label] == 2


def test_priority_through_http(server_factory) -> None:
    """With one sequence slot, queued requests run by priority (lower first), then arrival."""
    srv = server_factory(core_factory=GatedCore, scheduling_policy="priority", max_num_seqs=1)
    core: GatedCore = srv.engine.engine_core.proc.engine_core
    ids: dict[str, str] = {}

    def run(name: str, priority: int, max_tokens: int) -> None:
        with httpx.Client(base_url=srv.base_url, timeout=60) as http:
            resp = http.post(
                "/v1/completions",
                json={
                    "prompt": PROMPT,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                    "priority": priority,
                },
            )
        assert resp.status_code == 200, resp.text
        ids[resp.json()["id"]] = name

    def unfinished() -> int:
        return srv.engine.output_processor.get_num_unfinished_requests()

    threads = []
    try:
        # The blocker takes the slot; the engine then waits at its gate while the others arrive,
        # one after the other, so none can run before all are queued.
        for name, prio, max_tokens in [("blocker", 0, 20), ("low", 5, 4), ("high", -3, 4),
                                       ("mid", 1, 4), ("high2", -3, 4)]:
            threads.append(threading.Thread(target=run, args=(name, prio, max_tokens)))
            threads[-1].start()
            wait_until(lambda: unfinished() == len(threads), f"request {name} in the engine")
            if name == "blocker":
                core.allow()
                core.wait_at_gate()
        core.open()
        for t in threads:
            t.join(60)
    finally:
        core.open()
    assert [ids[rid] for rid in core.finished] == ["blocker", "high", "high2", "mid", "low"]


def test_batched_prompts_stream(server, client: openai.OpenAI) -> None:
    prompts = [PROMPT, "The capital of France"]
    kw = dict(
        model="tiny", prompt=prompts, max_tokens=6, temperature=0.0, extra_body={"ignore_eos": True}
    )
    full = client.completions.create(**kw)
    chunks = list(
        client.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    texts = ["", ""]
    finished = [0, 0]
    for c in chunks[:-1]:
        (choice,) = c.choices
        texts[choice.index] += choice.text
        finished[choice.index] += choice.finish_reason is not None
    assert texts == [c.text for c in full.choices]
    assert finished == [1, 1]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens  # type: ignore[union-attr]


def test_without_tokenizer_token_prompts_only(server_factory) -> None:
    srv = server_factory(skip_tokenizer_init=True)
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        ok = http.post(
            "/v1/completions",
            json={"prompt": [72, 101, 278], "max_tokens": 3, "logprobs": 1, "ignore_eos": True},
        )
        assert ok.status_code == 200, ok.text
        choice = ok.json()["choices"][0]
        assert choice["text"] == "" and len(choice["logprobs"]["tokens"]) == 3
        assert all(t.startswith("token_id:") for t in choice["logprobs"]["tokens"])
        assert len(choice["token_ids"]) == 3
        # Streaming without a tokenizer still sends one chunk per token, carrying its id.
        body = {"prompt": [72, 101, 278], "max_tokens": 5, "ignore_eos": True, "stream": True}
        ids: list[int] = []
        chunks = 0
        with http.stream("POST", "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    ids += json.loads(line[6:])["choices"][0]["token_ids"]
                    chunks += 1
        assert len(ids) == 5 and chunks >= 2
        text = http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 3})
        assert text.status_code == 400 and text.json()["error"]["param"] == "prompt"
        chat = http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"


def test_cache_salt_is_accepted_and_keeps_the_tokens(server) -> None:
    """vLLM's cache_salt on both endpoints: the same greedy tokens as without it (the salt only
    keeps the prompt's cached blocks apart), one prompt or several."""
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        for route, body in (
            ("/v1/completions", {"prompt": ["Hello there", "Bye now"], "max_tokens": 5}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                      "max_tokens": 5}),
        ):
            body = {**body, "temperature": 0, "ignore_eos": True}
            plain = http.post(route, json=body).json()["choices"]
            for salt in ("a", "a", "b"):
                salted = http.post(route, json={**body, "cache_salt": salt})
                assert salted.status_code == 200, salted.text
                assert salted.json()["choices"] == plain


def test_chat_cache_salt_keeps_the_prefix_cache_apart(server) -> None:
    """Two chats with the same long conversation share its cached blocks only under the same
    cache_salt: a different salt (or none) finds nothing cached (prefix-cache hits in
    /metrics, refreshed with every scrape)."""
    from tests.server.waiting import metric, scrape

    content = "A long and unique conversation about cache salts and tenants. " * 6
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 2,
            "temperature": 0, "ignore_eos": True}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        def hits_of(salt: str | None) -> float:
            before = metric(scrape(http), "cadence:prefix_cache_hits_total", model_name="tiny")
            resp = http.post("/v1/chat/completions",
                             json=body if salt is None else {**body, "cache_salt": salt})
            assert resp.status_code == 200, resp.text
            after = metric(scrape(http), "cadence:prefix_cache_hits_total", model_name="tiny")
            return after - before

        prompt_tokens = http.post("/v1/chat/completions", json={**body, "cache_salt": "t0"}
                                  ).json()["usage"]["prompt_tokens"]
        assert prompt_tokens >= 4 * server.engine.block_size  # several full blocks
        assert hits_of("tenant-a") == 0
        assert hits_of("tenant-b") == 0
        assert hits_of(None) == 0
        assert hits_of("tenant-a") >= 4 * server.engine.block_size
        assert hits_of(None) >= 4 * server.engine.block_size


def test_truncation_side_right_keeps_the_prompts_head(server) -> None:
    """vLLM's truncation_side "right": the prompt's first k tokens (completions and a streamed
    chat's prompt ids); any other side is a 400 naming the field."""
    ids = list(range(10, 40))
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        out = http.post("/v1/completions", json={
            "prompt": ids, "max_tokens": 1, "truncate_prompt_tokens": 2,
            "truncation_side": "right", "return_token_ids": True}).json()
        assert out["choices"][0]["prompt_token_ids"] == [10, 11]
        body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1,
                "return_token_ids": True}
        full = http.post("/v1/chat/completions", json=body).json()["prompt_token_ids"]
        cut = {**body, "truncate_prompt_tokens": 3, "truncation_side": "right"}
        assert http.post("/v1/chat/completions", json=cut).json()["prompt_token_ids"] == full[:3]
        with http.stream("POST", "/v1/chat/completions", json={**cut, "stream": True}) as r:
            first = next(json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: "))
        assert first["prompt_token_ids"] == full[:3]
        bad = http.post("/v1/completions", json={"prompt": "x", "truncation_side": "middle"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "truncation_side"


def test_truncate_prompt_tokens_serves_the_prompts_tail(server) -> None:
    """vLLM's truncate_prompt_tokens: only the prompt's last k tokens count (usage says k), and
    the answer is the one for that tail; on chat, the rendered conversation's tail."""
    text = "The quick brown fox jumps over the lazy dog. " * 30
    ids = server.engine.tokenizer.encode(text)
    greedy = {"temperature": 0, "ignore_eos": True, "max_tokens": 6}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        cut = http.post("/v1/completions", json={"prompt": text, "truncate_prompt_tokens": 12,
                                                 **greedy}).json()
        tail = http.post("/v1/completions", json={"prompt": ids[-12:], **greedy}).json()
        assert cut["usage"]["prompt_tokens"] == 12
        assert cut["choices"][0]["text"] == tail["choices"][0]["text"]
        chat = http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": text}], "truncate_prompt_tokens": 9,
            **greedy}).json()
        assert chat["usage"]["prompt_tokens"] == 9
        # A conversation far past the context is refused before tokenizing, unless truncated.
        huge = {"messages": [{"role": "user", "content": "word " * 40000}], **greedy}
        refused = http.post("/v1/chat/completions", json=huge)
        assert refused.status_code == 400, refused.text
        cut = http.post("/v1/chat/completions", json={**huge, "truncate_prompt_tokens": 20})
        assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == 20
        # -1 keeps what leaves room for max_tokens (vLLM: max_model_len - max_tokens).
        for route, body in (("/v1/chat/completions", huge),
                            ("/v1/completions", {"prompt": "word " * 40000, **greedy})):
            cut = http.post(route, json={**body, "truncate_prompt_tokens": -1})
            assert cut.status_code == 200, cut.text
            assert cut.json()["usage"]["prompt_tokens"] == server.engine.max_model_len - 6


def test_return_tokens_as_token_ids_in_logprobs(server) -> None:
    """vLLM's return_tokens_as_token_ids: every logprobs token (sampled, top, echoed prompt) is
    "token_id:N", with N the id; the offsets and the text are those of the plain answer."""
    import re

    as_id = re.compile(r"token_id:\d+")
    greedy = {"temperature": 0, "ignore_eos": True, "max_tokens": 6}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        body = {"prompt": "Hello there", "logprobs": 2, "return_token_ids": True, **greedy}
        plain = http.post("/v1/completions", json=body).json()["choices"][0]
        for stream in (False, True):
            got_body = {**body, "return_tokens_as_token_ids": True}
            if not stream:
                choice = http.post("/v1/completions", json=got_body).json()["choices"][0]
                ids, tokens = choice["token_ids"], choice["logprobs"]["tokens"]
                offsets, tops = choice["logprobs"]["text_offset"], choice["logprobs"]["top_logprobs"]
                assert choice["text"] == plain["text"]
            else:
                with http.stream("POST", "/v1/completions",
                                 json={**got_body, "stream": True}) as r:
                    chunks = [json.loads(line[6:]) for line in r.iter_lines()
                              if line.startswith("data: {")]
                parts = [c["choices"][0] for c in chunks if c["choices"]]
                ids = [t for p in parts for t in p.get("token_ids") or []]
                lps = [p["logprobs"] for p in parts if p.get("logprobs")]
                tokens = [t for lp in lps for t in lp["tokens"]]
                offsets = [o for lp in lps for o in lp["text_offset"]]
                tops = [t for lp in lps for t in lp["top_logprobs"]]
            assert tokens == [f"token_id:{t}" for t in ids] == [
                f"token_id:{t}" for t in plain["token_ids"]]
            assert offsets == plain["logprobs"]["text_offset"]
            assert all(tok in top and all(as_id.fullmatch(k) for k in top)
                       for tok, top in zip(tokens, tops, strict=True))
        echoed = http.post("/v1/completions", json={**body, "echo": True, "max_tokens": 2,
                                                    "return_tokens_as_token_ids": True}).json()
        assert all(as_id.fullmatch(t) for t in echoed["choices"][0]["logprobs"]["tokens"])
        chat = http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 2,
            "return_tokens_as_token_ids": True, "return_token_ids": True, **greedy}).json()
        choice = chat["choices"][0]
        content = choice["logprobs"]["content"]
        assert [c["token"] for c in content] == [f"token_id:{t}" for t in choice["token_ids"]]
        assert all(as_id.fullmatch(t["token"]) for c in content for t in c["top_logprobs"])
        assert all(bytes(c["bytes"]) == c["token"].encode() for c in content)


def test_chat_echo_returns_a_continued_message_whole(server) -> None:
    """vLLM's chat echo: when the last message is the assistant's (continue_final_message),
    the answer's content starts with it, streamed or not; otherwise echo adds nothing."""
    greedy = {"temperature": 0, "ignore_eos": True, "max_tokens": 5}
    cont = {"messages": [{"role": "user", "content": "Tell me"},
                         {"role": "assistant", "content": "Once upon"}],
            "add_generation_prompt": False, "continue_final_message": True, **greedy}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        plain = http.post("/v1/chat/completions", json=cont).json()["choices"][0]["message"]
        echoed = http.post("/v1/chat/completions", json={**cont, "echo": True}).json()
        assert echoed["choices"][0]["message"]["content"] == "Once upon" + plain["content"]
        with http.stream("POST", "/v1/chat/completions",
                         json={**cont, "echo": True, "stream": True}) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text == "Once upon" + plain["content"]
        # n = 2 (sampled: greedy n > 1 is refused): each choice starts with the echo.
        two = {**cont, "n": 2, "temperature": 1.0, "seed": 7}
        plain2 = [c["message"]["content"] for c in
                  http.post("/v1/chat/completions", json=two).json()["choices"]]
        with http.stream("POST", "/v1/chat/completions",
                         json={**two, "echo": True, "stream": True}) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        texts = {0: "", 1: ""}
        for c in chunks:
            for ch in c["choices"]:
                texts[ch["index"]] += ch["delta"].get("content") or ""
        assert texts == {0: "Once upon" + plain2[0], 1: "Once upon" + plain2[1]}
        user_last = {"messages": [{"role": "user", "content": "Hi"}], **greedy}
        a = http.post("/v1/chat/completions", json=user_last).json()["choices"][0]["message"]
        b = http.post("/v1/chat/completions", json={**user_last, "echo": True}).json()
        assert b["choices"][0]["message"]["content"] == a["content"]


def test_add_special_tokens_false_leaves_the_bos_out(tmp_path, server_factory) -> None:
    """vLLM's add_special_tokens on completions: by default a text prompt gets the tokenizer's
    special tokens (here a BOS its post-processor adds); false tokenizes the text alone.
    Token-id prompts are never changed."""
    from tests.tiny import tiny_copy_adding_a_bos

    model, bos_id = tiny_copy_adding_a_bos(tmp_path / "tiny-bos")
    srv = server_factory(model=str(model))
    body = {"prompt": "hello", "max_tokens": 2, "temperature": 0, "ignore_eos": True,
            "echo": True, "logprobs": 0, "return_token_ids": True}
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        with_bos = http.post("/v1/completions", json=body).json()
        alone = http.post("/v1/completions", json={**body, "add_special_tokens": False}).json()
        ids = http.post("/v1/completions", json={**body, "prompt": [5, 6],
                                                 "add_special_tokens": False}).json()
        salted = http.post("/v1/completions", json={**body, "cache_salt": "s"}).json()
        tokenized = http.post("/tokenize", json={"prompt": "hello"}).json()["tokens"]
        chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 1,
                "return_token_ids": True}
        chat_ids = http.post("/v1/chat/completions", json=chat).json()["prompt_token_ids"]
        chat_tokenized = http.post("/tokenize", json={"messages": chat["messages"]}).json()
    # A prompt that goes to the engine as a dict (a salt) gets the default special tokens too;
    # /tokenize reads a prompt as completions do, and a chat as the chat endpoint (whose
    # template writes its own specials: none added, vLLM's default there).
    assert salted["choices"][0]["prompt_token_ids"] == with_bos["choices"][0]["prompt_token_ids"]
    assert tokenized == with_bos["choices"][0]["prompt_token_ids"]
    assert chat_ids[:2] != [bos_id, bos_id]
    assert chat_tokenized["tokens"] == chat_ids
    assert with_bos["choices"][0]["prompt_token_ids"][0] == bos_id
    assert alone["choices"][0]["prompt_token_ids"] == with_bos["choices"][0]["prompt_token_ids"][1:]
    assert alone["usage"]["prompt_tokens"] == with_bos["usage"]["prompt_tokens"] - 1
    assert alone["choices"][0]["text"].startswith("hello")  # echo: the prompt's text
    assert ids["choices"][0]["prompt_token_ids"] == [5, 6]


def test_a_given_request_id_names_the_response(server) -> None:
    """vLLM's request_id field: the response (and every streamed chunk) is "cmpl-<id>" /
    "chatcmpl-<id>"; an empty one is a 400 naming request_id."""
    greedy = {"temperature": 0, "ignore_eos": True, "max_tokens": 3}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        out = http.post("/v1/completions", json={"prompt": "Hi", "request_id": "trace-1",
                                                 **greedy}).json()
        assert out["id"] == "cmpl-trace-1"
        chat = http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "request_id": "trace-2",
            "stream": True, **greedy})
        ids = {json.loads(line[6:])["id"] for line in chat.text.splitlines()
               if line.startswith("data: {")}
        assert ids == {"chatcmpl-trace-2"}
        empty = http.post("/v1/completions", json={"prompt": "Hi", "request_id": "", **greedy})
        assert empty.status_code == 400 and empty.json()["error"]["param"] == "request_id"
        assert http.get("/health").status_code == 200


def test_models_retrieve_through_the_openai_client(server) -> None:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    card = client.models.retrieve("tiny")
    assert card.id == "tiny" and card.object == "model"
    assert [m.id for m in client.models.list().data] == ["tiny"]
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-4")
    assert info.value.body["param"] == "model" and "gpt-4" in info.value.body["message"]


def test_request_count_bounds_accept_their_limit_and_streams_are_not_cached(server) -> None:
    """Exactly 1024 prompts, or prompts x n exactly 1024, are served (one more is a 400, see
    test_errors); tool_choice "none" needs no tools (OpenAI); a stream may ask for
    prompt_logprobs=0 (vLLM refuses only more); SSE responses are marked no-cache."""
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        many = http.post("/v1/completions", json={"prompt": [[5]] * 1024, "max_tokens": 1})
        assert many.status_code == 200, many.text
        assert len(many.json()["choices"]) == 1024
        times_n = http.post("/v1/completions", json={"prompt": [[5]] * 8, "n": 128,
                                                     "max_tokens": 1})
        assert times_n.status_code == 200, times_n.text
        none = http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "tool_choice": "none",
            "max_tokens": 1})
        assert none.status_code == 200, none.text
        with http.stream("POST", "/v1/completions", json={
                "prompt": "Hi", "max_tokens": 2, "stream": True, "prompt_logprobs": 0}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            assert "no-cache" in r.headers["cache-control"]
            assert any(line == "data: [DONE]" for line in r.iter_lines())


def test_streamed_prompt_token_ids_come_once_and_only_when_asked(server) -> None:
    def chunks(http, route, body):
        with http.stream("POST", route, json={**body, "stream": True}) as r:
            return [json.loads(line[6:]) for line in r.iter_lines()
                    if line.startswith("data: {")]

    greedy = {"temperature": 0, "ignore_eos": True, "max_tokens": 4}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        got = chunks(http, "/v1/completions", {"prompt": "Hi there", "n": 2,
                                               "return_token_ids": True,
                                               **greedy, "temperature": 1.0})
        seen: dict[int, list[bool]] = {}
        for c in got:
            for ch in c["choices"]:
                seen.setdefault(ch["index"], []).append(ch.get("prompt_token_ids") is not None)
        assert sorted(seen) == [0, 1]
        assert all(flags[0] and not any(flags[1:]) for flags in seen.values()), seen
        chat = chunks(http, "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "Hi"}], **greedy})
        assert chat and all(c.get("prompt_token_ids") is None for c in chat)
        asked = chunks(http, "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "Hi"}],
                        "return_token_ids": True, **greedy})
        assert asked[0].get("prompt_token_ids")


def test_the_output_handler_runs_from_start_up_before_any_request(server_factory) -> None:
    """Each server collects the core's outputs from start-up: with several API servers, front
    end 0 records the engine-wide metrics from every step, also when no request of its own
    ever comes (it used to start collecting at its first request, and then read 0)."""
    running = server_factory()
    handler = running.engine.output_handler
    assert handler is not None and not handler.done()
    assert not running.engine.has_unfinished_requests()
