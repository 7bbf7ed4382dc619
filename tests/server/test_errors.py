"""Every bad input gets an OpenAI-style error naming the parameter; the server keeps serving."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from cadence.server.errors import BadRequestError, from_validation_error
from cadence.server.protocol_completion import CompletionRequest

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


def _deep(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value

# (route, JSON body, expected status, expected param, a fragment of the message)
CASES: list[tuple[str, Any, int, str | None, str]] = [
    (COMPLETIONS, {}, 400, "prompt", "required"),
    (COMPLETIONS, {"prompt": 5}, 400, "prompt", "(got 5)"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens", "integer"),
    (COMPLETIONS, {"prompt": "x", "temperature": "hot"}, 400, "temperature", "number"),
    (COMPLETIONS, {"prompt": "x", "stream": "maybe"}, 400, "stream", "boolean"),
    (COMPLETIONS, {"prompt": "x", "stop": 3}, 400, "stop", "(got 3)"),
    (COMPLETIONS, {"prompt": "x", "structured_outputs": {"structural_tag": "{}"}}, 400,
     "structured_outputs", "structural tag needs its format"),
    (COMPLETIONS, {"prompt": "x", "spaces_between_special_tokens": "maybe"}, 400,
     "spaces_between_special_tokens", "boolean"),
    (COMPLETIONS, {"model": "gpt-9", "prompt": "x"}, 404, "model", "does not exist"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": -3}, 400, "max_tokens", "greater than"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "only with echo"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 0, "echo": True, "min_tokens": 1}, 400,
     "min_tokens", "max_tokens is 0"),
    (
        COMPLETIONS,
        {"prompt": "x", "max_tokens": 100000},
        400,
        "max_tokens",
        "maximum context length is 512 tokens",
    ),
    (COMPLETIONS, {"prompt": "x", "temperature": -0.5}, 400, "temperature", "greater than"),
    (COMPLETIONS, {"prompt": "x", "temperature": 2.5}, 400, "temperature", "less than"),
    (COMPLETIONS, {"prompt": "x", "top_p": 0}, 400, "top_p", "greater than"),
    (COMPLETIONS, {"prompt": "x", "top_p": 1.5}, 400, "top_p", "less than"),
    (COMPLETIONS, {"prompt": "x", "top_k": -2}, 400, "top_k", "greater than"),
    (COMPLETIONS, {"prompt": "x", "seed": 1 << 64}, 400, "seed", "less than"),
    (COMPLETIONS, {"prompt": "x", "seed": -(1 << 63) - 1}, 400, "seed", "greater than"),
    (COMPLETIONS, {"prompt": "x", "priority": 1 << 63}, 400, "priority", "less than"),
    (COMPLETIONS, {"prompt": "x", "stop_token_ids": [1 << 64]}, 400, "stop_token_ids", "64-bit"),
    (COMPLETIONS, {"prompt": "x", "stop_token_ids": [-1]}, 400, "stop_token_ids", "64-bit"),
    (COMPLETIONS, {"prompt": "x", "stop": ["a"] * 65}, 400, "stop", "at most 64"),
    (COMPLETIONS, {"prompt": "x", "cache_salt": ""}, 400, "cache_salt", "non-empty"),
    (COMPLETIONS, {"prompt": "x", "truncate_prompt_tokens": 0}, 400, "truncate_prompt_tokens",
     ">= 1 or -1"),
    (COMPLETIONS, {"prompt": "x", "truncate_prompt_tokens": -2}, 400, "truncate_prompt_tokens",
     "greater than"),
    (CHAT, {"messages": MSG, "truncate_prompt_tokens": 10**6}, 400, "truncate_prompt_tokens",
     "max_model_len"),
    (COMPLETIONS, {"prompt": "x", "truncate_prompt_tokens": 500, "max_tokens": 20}, 400,
     "truncate_prompt_tokens", "max_model_len - max_tokens = 492"),
    (CHAT, {"messages": MSG, "truncate_prompt_tokens": -1, "max_completion_tokens": 512}, 400,
     "max_completion_tokens", "no room"),
    (COMPLETIONS, {"prompt": [1, 2], "cache_salt": 7}, 400, "cache_salt", "string"),
    (COMPLETIONS, {"prompt": "x", "stop": ["a" * 513]}, 400, "stop", "at most 512"),
    (
        COMPLETIONS,
        {"prompt": "x", "stop_token_ids": list(range(257))},
        400,
        "stop_token_ids",
        "at most 256",
    ),
    (COMPLETIONS, {"prompt": [[1]] * 1025}, 400, "prompt", "at most 1024"),
    (COMPLETIONS, {"prompt": "x", "use_beam_search": True, "stop_token_ids": [3]}, 400,
     "stop_token_ids", "use_beam_search"),
    (CHAT, {"messages": MSG, "use_beam_search": True, "tools": [
        {"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}, 400,
     "tool_choice", "use_beam_search"),
    (COMPLETIONS, {"prompt": "x", "guided_json": {"type": "object"}}, 400, "guided_json",
     "structured_outputs"),
    (CHAT, {"messages": MSG, "guided_regex": "a+"}, 400, "guided_regex", "structured_outputs"),
    (COMPLETIONS, {"prompt": "x", "guided_choice": ["a"]}, 400, "guided_choice", "not supported"),
    (CHAT, {"messages": MSG, "guided_grammar": "root ::= \"a\""}, 400, "guided_grammar",
     "not supported"),
    (COMPLETIONS, {"prompt": [1, 2, 1 << 80]}, 400, "prompt", "out of vocabulary"),
    (COMPLETIONS, {"prompt": "x", "min_tokens": 1 << 70}, 400, "min_tokens", "max_tokens"),
    (CHAT, {"messages": MSG, "min_tokens": 600}, 400, "min_tokens", "max_tokens"),
    (CHAT, {"messages": MSG, "cache_salt": ""}, 400, "cache_salt", "non-empty"),
    (
        CHAT,
        {"messages": MSG, "chat_template_kwargs": {"tokenize": True}},
        400,
        "chat_template_kwargs",
        "tokenize",
    ),
    # Any named argument of transformers' renderer, not only the ones cadence passes itself.
    (CHAT, {"messages": MSG, "chat_template_kwargs": {"sanitize_control_tokens": True}}, 400,
     "chat_template_kwargs", "sanitize_control_tokens"),
    # Nested past the bound (the template's renderer recursed out of stack at ~500 levels).
    (CHAT, {"messages": MSG, "chat_template_kwargs": {"x": _deep(600)}}, 400,
     "chat_template_kwargs", "deeper than 64"),
    (CHAT, {"messages": MSG, "tool_choice": "none", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": _deep(600)}}}}]},
     400, "tools", "deeper than 64"),
    (CHAT, {"messages": MSG, "chat_template_kwargs": {"self": 1}}, 400, "chat_template_kwargs",
     "cannot set self"),
    (CHAT, {"messages": MSG, "chat_template_kwargs": {"tokenizer_kwargs": {}}}, 400,
     "chat_template_kwargs", "tokenizer_kwargs"),
    (COMPLETIONS, {"prompt": "word " * 600}, 400, "prompt", "maximum context length is 512 tokens"),
    (COMPLETIONS, {"prompt": ""}, 400, "prompt", "empty"),
    (COMPLETIONS, {"prompt": []}, 400, "prompt", "empty"),
    (COMPLETIONS, {"prompt": [1, 2, 99999]}, 400, "prompt", "99999"),
    (COMPLETIONS, {"prompt": "x", "n": 0}, 400, "n", "greater than"),
    (COMPLETIONS, {"prompt": ["x", "y", "z"], "n": 400}, 400, "n", "less than"),
    (COMPLETIONS, {"prompt": ["x"] * 20, "n": 100}, 400, "n", "at most 1024 completions"),
    (COMPLETIONS, {"prompt": "x", "best_of": 3}, 400, "best_of", "best_of"),
    (COMPLETIONS, {"prompt": "x", "n": 2, "temperature": 0}, 400, "n", "greedy"),
    # OpenAI's and vLLM's required fields of response_format.
    (CHAT, {"messages": MSG, "response_format": {}}, 400, "response_format.type", "required"),
    (CHAT, {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {
        "schema": {"type": "object"}}}}, 400, "response_format.json_schema.name", "required"),
    (CHAT, {"messages": MSG, "n": 3, "temperature": 0.0}, 400, "n", "greedy"),
    (COMPLETIONS, {"prompt": "x", "prompt_logprobs": 2, "stream": True}, 400, "prompt_logprobs",
     "stream"),
    (COMPLETIONS, {"prompt": "x", "prompt_logprobs": 21}, 400, "prompt_logprobs", "logprobs"),
    (COMPLETIONS, {"prompt": "x", "prompt_logprobs": -1}, 400, "prompt_logprobs", "logprobs"),
    (CHAT, {"messages": MSG, "prompt_logprobs": -2}, 400, "prompt_logprobs", "greater than"),
    (COMPLETIONS, {"prompt": "x", "logprobs": 50}, 400, "logprobs", "max allowed: 20"),
    (COMPLETIONS, {"prompt": "x", "stop": [""]}, 400, "stop", "empty"),
    (
        COMPLETIONS,
        {"prompt": "x", "stream_options": {"include_usage": True}},
        400,
        "stream_options",
        "stream",
    ),
    (COMPLETIONS, {"prompt": "x", "presence_penalty": 2.5}, 400, "presence_penalty", "[-2, 2]"),
    (CHAT, {"messages": MSG, "frequency_penalty": -3}, 400, "frequency_penalty", "[-2, 2]"),
    (COMPLETIONS, {"prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty",
     "greater than zero"),
    (COMPLETIONS, {"prompt": "x", "repetition_penalty": 1e-40}, 400, "repetition_penalty",
     "greater than zero"),  # float32 would make it 0
    (CHAT, {"messages": MSG, "repetition_penalty": 1e308}, 400, "repetition_penalty",
     "greater than zero"),  # float32 would make it inf
    (COMPLETIONS, {"prompt": "x", "min_p": 1.5}, 400, "min_p", "[0, 1]"),
    (CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}]}]},
     400, "messages.0.content", "only text content parts"),
    # A content part's own field, not the union member it was tried as ("a valid string").
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                     {"type": "text", "text": 5}]}]},
     400, "messages.0.content.1.text", "valid string"),
    (CHAT, {"messages": [{"role": "user", "content": [5]}]},
     400, "messages.0.content.0", 'a string or an object with a "type"'),
    (CHAT, {"messages": [{"role": "user", "content": ["a", {"type": "text", "text": None},
                                                     {"type": "text", "text": ["b"]}]}]},
     400, "messages.0.content.2.text", "valid string"),
    (CHAT, {"messages": [{"role": "user", "content": [{"text": "x"}]}]},
     400, "messages.0.content.0.type", "Field required"),
    (COMPLETIONS, {"prompt": [1, 2.5]}, 400, "prompt.1", "integer"),
    # The member the input has the shape of, however many of its elements are wrong.
    (COMPLETIONS, {"prompt": [[1, 2], [3, "x"], [4, "y"]]}, 400, "prompt.1.1", "integer"),
    (CHAT, {"messages": MSG, "stop": ["a", 2, 3]}, 400, "stop.1", "valid string"),
    # A model's class name is a union member's tag, never a parameter.
    (CHAT, {"messages": MSG, "tool_choice": "any"}, 400, "tool_choice", "'auto'"),
    (CHAT, {"messages": MSG, "tool_choice": {"type": "function", "name": "f"}}, 400,
     "tool_choice.function", "Field required"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"one": 1}}, 400, "logit_bias", "token ids"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"-4": 1}}, 400, "logit_bias", "negative"),
    (CHAT, {"messages": MSG, "logit_bias": {"100000": 1}}, 400, "logit_bias",
     "out of vocabulary"),
    (CHAT, {"messages": MSG, "allowed_token_ids": [1, 100000]}, 400, "allowed_token_ids",
     "out of vocabulary"),
    (CHAT, {"messages": MSG, "allowed_token_ids": []}, 400, "allowed_token_ids", "empty"),
    (CHAT, {"messages": MSG, "bad_words": ["  "]}, 400, "bad_words", "non-empty"),
    (CHAT, {"messages": MSG, "bad_words": [f"w{i}" for i in range(200)]}, 400, "bad_words",
     "at most"),
    (COMPLETIONS, ["not", "an", "object"], 400, None, "JSON object"),
    (CHAT, {"messages": []}, 400, "messages", "at least one"),
    (CHAT, {}, 400, "messages", "required"),
    (CHAT, {"messages": "hi"}, 400, "messages", "list"),
    (CHAT, {"messages": [{"role": ["user"], "content": "hi"}]}, 400, "messages.0.role", "string"),
    (CHAT, {"messages": [{"content": "hi"}]}, 400, "messages.0.role", "required"),
    (CHAT, {"model": "other", "messages": MSG}, 404, "model", "does not exist"),
    (CHAT, {"messages": MSG, "n": 129}, 400, "n", "less than"),
    (
        CHAT,
        {"messages": MSG, "max_completion_tokens": 100000},
        400,
        "max_completion_tokens",
        "maximum context length",
    ),
    (CHAT, {"messages": MSG, "max_tokens": -1}, 400, "max_tokens", "greater than"),
    (
        CHAT,
        {"messages": [{"role": "user", "content": "word " * 600}]},
        400,
        "messages",
        "maximum context length",
    ),
    (CHAT, {"messages": MSG, "top_logprobs": 3}, 400, "top_logprobs", "logprobs must be true"),
    (
        CHAT,
        {"messages": MSG, "logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
        "max allowed: 20",
    ),
    (CHAT, {"messages": MSG, "temperature": -1}, 400, "temperature", "greater than"),
    (CHAT, {"messages": MSG, "temperature": 3}, 400, "temperature", "less than"),
    (CHAT, {"messages": MSG, "tools": [{"type": "function"}]}, 400, "tools.0.function",
     "required"),
    (
        COMPLETIONS,
        {"prompt": "x", "max_tokens": 2, "min_tokens": 5},
        400,
        "min_tokens",
        "max_tokens",
    ),
]


def check_error(resp: httpx.Response, status: int, param: str | None, fragment: str) -> None:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status
    assert err["param"] == param, err
    assert err["type"] == {400: "BadRequestError", 404: "NotFoundError"}.get(status, err["type"])
    assert fragment, "an empty fragment matches any message"
    assert fragment.lower() in err["message"].lower(), err["message"]


@pytest.mark.parametrize("route,body,status,param,fragment", CASES)
def test_bad_input(
    http: httpx.Client, route: str, body: Any, status: int, param: str | None, fragment: str
) -> None:
    payloads = [body]
    if isinstance(body, dict) and not {"stream", "stream_options"} & set(body):
        payloads.append({**body, "stream": True})  # streamed requests are refused up front too
    for payload in payloads:
        resp = http.post(route, json=payload, timeout=30)
        check_error(resp, status, param, fragment)


def test_invalid_json_and_oversized_body(http: httpx.Client) -> None:
    resp = http.post(
        COMPLETIONS,
        content=b'{"prompt": "x",',
        headers={"content-type": "application/json"},
    )
    check_error(resp, 400, None, "invalid json")
    resp = http.post(COMPLETIONS, content=b"\xff\xfe", timeout=30)
    check_error(resp, 400, None, "invalid json")
    big = {"prompt": "x" * (2 << 20)}  # the test server's limit is 1 MiB
    resp = http.post(COMPLETIONS, json=big, timeout=30)
    assert resp.status_code == 413
    assert resp.json()["error"]["type"] == "RequestTooLargeError"
    assert resp.json()["error"]["code"] == 413


def test_unknown_route_and_method(http: httpx.Client) -> None:
    # The OpenAI shape, with the type an OpenAI client maps the status to.
    resp = http.get("/v1/nothing-here")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == 404
    assert resp.json()["error"]["type"] == "NotFoundError"
    resp = http.get(COMPLETIONS)
    assert resp.status_code == 405 and resp.json()["error"]["code"] == 405
    assert resp.json()["error"]["type"] == "HTTPError"
    assert resp.headers["allow"] == "POST"  # HTTP requires a 405 to name the methods
    resp = http.put("/health")
    assert resp.status_code == 405 and set(resp.headers["allow"].split(", ")) >= {"GET"}


def test_server_keeps_serving_after_bad_inputs(server, http: httpx.Client) -> None:
    for route, body, *_ in CASES:
        http.post(route, json=body, timeout=30)
    assert http.get("/health").status_code == 200
    ok = http.post(
        COMPLETIONS,
        json={"prompt": "Hello", "max_tokens": 3, "temperature": 0},
        timeout=30,
    )
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
    stats = server.engine.engine_core.call_utility("make_stats")
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)
    assert not server.engine.output_processor.has_unfinished_requests()


def test_validation_error_names_nested_fields() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate(
            {"prompt": "x", "stream_options": {"include_usage": "often"}}
        )
    err = from_validation_error(info.value)
    assert isinstance(err, BadRequestError)
    assert err.param == "stream_options.include_usage"
    assert err.body()["error"]["code"] == 400


# Bodies that once raised inside the engine thread or the JSON parser: each must be a 400.
RAW_BODIES: list[tuple[bytes, str | None, str]] = [
    (b"[" * 100_000 + b"]" * 100_000, None, "nested too deeply"),
    (b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", None, "more than 4300 digits"),
    # 4300 digits parse, but prompt + max_tokens has more than str() may write out.
    (b'{"prompt": "x", "max_tokens": ' + b"9" * 4300 + b"}", "max_tokens",
     "requested more than 10**18 tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": '
     + b"9" * 4300 + b"}", "max_completion_tokens", "maximum context length"),
    (b'{"prompt": "x", "temperature": NaN}', None, "invalid json"),
    (b'{"prompt": "x", "top_p": Infinity}', None, "invalid json"),
    (b'{"prompt": "\\ud800 lone"}', "prompt", "surrogate"),
    (b'{"prompt": ["ok", "\\udc00"]}', "prompt.1", "surrogate"),
    (b'{"messages": [{"role": "user", "content": "\\ud83d"}]}', "messages.0.content", "surrogate"),
    (b'{"model": "\\ud800", "prompt": "x"}', "model", "surrogate"),
    (b'{"prompt": "x", "\\udfff": 1}', None, "surrogate"),
    # The same surrogates as raw UTF-8 bytes, and bodies in another encoding: not UTF-8.
    (b'{"prompt": "a\xed\xa0\x80"}', None, "not utf-8"),
    (b'{"messages": [{"role": "user", "content": "a\xed\xa0\x80"}]}', None, "not utf-8"),
    (b'{"prompt": "hi", "bad_words": ["a\xed\xb0\x80"]}', None, "not utf-8"),
    ('{"prompt": "x"}'.encode("utf-16"), None, "not utf-8"),
    (b'{"prompt": "caf\xe9"}', None, "not utf-8"),  # Latin-1
]


@pytest.mark.parametrize("raw,param,fragment", RAW_BODIES)
def test_malformed_bodies_are_400(http: httpx.Client, raw: bytes, param: str | None,
                                  fragment: str) -> None:
    route = CHAT if b"messages" in raw else COMPLETIONS
    resp = http.post(route, content=raw, headers={"content-type": "application/json"})
    check_error(resp, 400, param, fragment)


def test_raw_surrogates_never_reach_the_tokenizer_or_a_tool_name(http: httpx.Client) -> None:
    """UTF-8-encoded lone surrogates once passed the JSON parser: a 500 from the tokenizer
    (chat, /tokenize) or the response encoder (a named tool), a cut stream; a BOM is fine."""
    tool = (b'"tools": [{"type": "function", "function": {"name": "f\xed\xa0\x80", '
            b'"parameters": {"type": "object"}}}], "tool_choice": {"type": "function", '
            b'"function": {"name": "f\xed\xa0\x80"}}')
    for stream in (b"false", b"true"):
        raw = (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, '
               b'"stream": ' + stream + b", " + tool + b"}")
        resp = http.post(CHAT, content=raw, headers={"content-type": "application/json"})
        check_error(resp, 400, None, "not utf-8")
    resp = http.post("/tokenize", content=b'{"prompt": "a\xed\xa0\x80"}',
                     headers={"content-type": "application/json"})
    check_error(resp, 400, None, "not utf-8")
    resp = http.post(COMPLETIONS, content=b'\xef\xbb\xbf{"prompt": "x", "max_tokens": 1}',
                     headers={"content-type": "application/json"})
    assert resp.status_code == 200, resp.text


def test_errors_quote_at_most_a_bounded_piece_of_the_input(http: httpx.Client) -> None:
    """A megabyte model name, logit_bias key or id list comes back cut, not whole."""
    from cadence.server.errors import MAX_MESSAGE_CHARS

    big = "x" * 1_000_000
    for route, body, status, param in (
        (COMPLETIONS, {"model": big, "prompt": "a"}, 404, "model"),
        (COMPLETIONS, {"prompt": "a", "logit_bias": {big: 1}}, 400, "logit_bias"),
        (COMPLETIONS, {"prompt": "a", "allowed_token_ids": [-1] + [1] * 300_000}, 400,
         "allowed_token_ids"),
    ):
        resp = http.post(route, json=body)
        assert resp.status_code == status, resp.text[:300]
        err = resp.json()["error"]
        assert err["param"] == param
        assert len(err["message"]) <= MAX_MESSAGE_CHARS
    resp = http.get("/v1/models/" + "y" * 60_000)
    assert resp.status_code == 404 and len(resp.content) < 2 * MAX_MESSAGE_CHARS


def test_unknown_model_name_with_odd_text_is_echoed_safely(http: httpx.Client) -> None:
    name = 'é"<>\\\u2028 \U0001f600'
    resp = http.post(COMPLETIONS, json={"model": name, "prompt": "x"})
    check_error(resp, 404, "model", "does not exist")
    assert name in resp.json()["error"]["message"]


def test_out_of_range_top_k_means_no_top_k(server, http: httpx.Client) -> None:
    # Once a request killed the engine; vLLM: top_k at or above the vocabulary is no top-k.
    vocab = server.engine.input_processor.vocab_size
    for top_k in (1 << 70, vocab, vocab + 1, 0, -1):
        body = {"prompt": "Hello", "max_tokens": 3, "top_k": top_k, "seed": 7}
        resp = http.post(COMPLETIONS, json=body)
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 3
    ref = http.post(COMPLETIONS, json={"prompt": "Hello", "max_tokens": 3, "seed": 7}).json()
    same = http.post(COMPLETIONS, json={"prompt": "Hello", "max_tokens": 3, "seed": 7,
                                        "top_k": 1 << 70}).json()
    assert same["choices"][0]["text"] == ref["choices"][0]["text"]
    assert http.get("/health").status_code == 200


def test_extreme_numbers_in_every_field_never_5xx(server, http: httpx.Client) -> None:
    huge, tiny = 1 << 200, -(1 << 200)
    fields = ["max_tokens", "min_tokens", "top_k", "seed", "n", "priority", "logprobs",
              "best_of", "temperature", "top_p", "presence_penalty", "frequency_penalty"]
    for field in fields:
        for value in (huge, tiny, 1e308, -1e308, 5e-324, 2**63, 2**64 - 1, -(2**63)):
            for route, base in ((COMPLETIONS, {"prompt": "Hi"}), (CHAT, {"messages": MSG})):
                for stream in (False, True):
                    body = {**base, field: value, "max_tokens": 2, "stream": stream}
                    if field == "max_tokens":
                        body[field] = value
                    resp = http.post(route, json=body)
                    assert resp.status_code < 500, (field, value, resp.text)
    assert http.get("/health").status_code == 200
    stats = server.engine.engine_core.call_utility("make_stats")
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)
    core = server.engine.engine_core.proc.engine_core
    assert core.num_free_kv_blocks == core.num_kv_blocks - 1


def test_max_logprobs_sets_the_cap(server_factory) -> None:
    import httpx

    capped = server_factory(max_logprobs=3)
    with httpx.Client(base_url=capped.base_url, timeout=30) as http:
        ok = http.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 1, "logprobs": 3})
        assert ok.status_code == 200
        assert len(ok.json()["choices"][0]["logprobs"]["top_logprobs"][0]) >= 3
        too_many = http.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 1, "logprobs": 4})
        assert too_many.status_code == 400
        assert too_many.json()["error"]["param"] == "logprobs"
        chat = http.post(CHAT, json={"messages": MSG, "max_tokens": 1, "logprobs": True,
                                     "top_logprobs": 4})
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "top_logprobs"
    uncapped = server_factory(max_logprobs=-1)  # as many as the vocabulary has
    with httpx.Client(base_url=uncapped.base_url, timeout=30) as http:
        ok = http.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 1, "logprobs": 100})
        assert ok.status_code == 200
        assert len(ok.json()["choices"][0]["logprobs"]["top_logprobs"][0]) >= 100
        vocab = uncapped.engine.input_processor.max_logprobs
        too_many = http.post(COMPLETIONS, json={"prompt": "x", "logprobs": vocab + 1})
        assert too_many.status_code == 400


def test_neutral_values_of_sampling_fields_are_accepted(server) -> None:
    import httpx

    body = {"prompt": "x", "max_tokens": 2, "repetition_penalty": 1.0, "min_p": 0.0,
            "bad_words": [], "presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {}}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        assert http.post(COMPLETIONS, json=body).status_code == 200


def test_null_means_the_default_where_openai_allows_it(http: httpx.Client) -> None:
    """OpenAI's schema lets stream, n, echo and (chat) logprobs be null: the default; vLLM's
    return_token_ids and return_tokens_as_token_ids too (its fields are optional)."""
    plain = http.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 3, "temperature": 0})
    nulls = http.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 3, "temperature": 0,
                                         "stream": None, "n": None, "echo": None,
                                         "return_token_ids": None, "logprobs": 0,
                                         "return_tokens_as_token_ids": None})
    assert nulls.status_code == 200, nulls.text
    choice = nulls.json()["choices"][0]
    assert [c["text"] for c in nulls.json()["choices"]] == [plain.json()["choices"][0]["text"]]
    assert choice.get("token_ids") is None and choice.get("prompt_token_ids") is None
    assert not any(t.startswith("token_id:") for t in choice["logprobs"]["tokens"])
    chat = http.post(CHAT, json={"messages": MSG, "max_tokens": 3, "logprobs": None,
                                 "stream": None, "n": None, "echo": None,
                                 "return_token_ids": None})
    assert chat.status_code == 200, chat.text
    body = chat.json()
    assert len(body["choices"]) == 1 and body["choices"][0].get("logprobs") is None
    assert body["choices"][0].get("token_ids") is None
    assert http.post(COMPLETIONS, json={"prompt": "hi", "use_beam_search": False,
                                        "max_tokens": 1}).status_code == 200
