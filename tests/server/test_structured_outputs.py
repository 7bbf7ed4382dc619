"""Structured outputs through the official openai client: response_format (json_object,
json_schema) and vLLM's structured_outputs field, on both endpoints, streamed or not."""

from __future__ import annotations

import json

import pytest

jsonschema = pytest.importorskip("jsonschema")

from tests.engine.test_structured_outputs import CHOICES, REGEX, SCHEMA  # noqa: E402
from tests.server.waiting import wait_released  # noqa: E402

MSG = [{"role": "user", "content": "data please"}]


pytestmark = pytest.mark.cpu_engine  # seeded JSON that must end within max_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_chat_json_schema_and_json_object(client, stream) -> None:
    formats = [({"type": "json_schema", "json_schema": {"name": "data", "schema": SCHEMA,
                                                         "strict": True}}, SCHEMA),
               ({"type": "json_object"}, {"type": "object"})]
    for fmt, schema in formats:
        for seed in range(3):
            kw = dict(model="tiny", messages=MSG, max_tokens=200, temperature=1.0, seed=seed,
                      response_format=fmt)
            if stream:
                text = "".join(c.choices[0].delta.content or "" for c in
                               client.chat.completions.create(**kw, stream=True) if c.choices)
            else:
                text = client.chat.completions.create(**kw).choices[0].message.content
            jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_completions_structured_outputs_field(client, stream) -> None:
    import re

    for so, check in (({"choice": CHOICES}, lambda t: t in CHOICES),
                      ({"regex": REGEX}, lambda t: re.fullmatch(REGEX, t))):
        kw = dict(model="tiny", prompt="Answer:", max_tokens=40, temperature=1.0, seed=5,
                  extra_body={"structured_outputs": so})
        if stream:
            text = "".join(c.choices[0].text for c in
                           client.completions.create(**kw, stream=True) if c.choices)
        else:
            text = client.completions.create(**kw).choices[0].text
        assert check(text), text


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_structural_tags_in_both_forms(client, stream) -> None:
    """vLLM's structural_tag response_format, in xgrammar's current form (here a forced tag)
    and the older structures-and-triggers form, and as structured_outputs' JSON text."""
    from tests.engine.test_structured_outputs import TAGGED, _check_tagged

    legacy = {"type": "structural_tag", "triggers": ["<f="],
              "structures": [{"begin": "<f=a>", "schema": SCHEMA, "end": "</f>"}]}
    for extra in ({"response_format": TAGGED},
                  {"extra_body": {"structured_outputs": {"structural_tag": json.dumps(TAGGED)}}}):
        for seed in range(2):
            kw = dict(model="tiny", messages=MSG, max_tokens=200, temperature=1.0, seed=seed,
                      **extra)
            if stream:
                text = "".join(c.choices[0].delta.content or "" for c in
                               client.chat.completions.create(**kw, stream=True) if c.choices)
            else:
                text = client.chat.completions.create(**kw).choices[0].message.content
            _check_tagged(text)
    # The older form: free text until a trigger; whatever the model wrote, each tag it opened
    # holds SCHEMA's JSON.
    text = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=60, seed=1,
                                          response_format=legacy).choices[0].message.content
    for part in text.split("<f=a>")[1:]:
        if "</f>" in part:
            jsonschema.validate(json.loads(part.split("</f>")[0]), SCHEMA)


def _deep_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


@pytest.mark.parametrize(("body", "param", "fragment"), [
    # Nesting past the bound: refused before anything recursive walks it (it was a 500).
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                  "schema": _deep_schema(300)}}},
     "response_format", "nests deeper"),
    ({"structured_outputs": {"json": _deep_schema(40)}}, "structured_outputs", "nests deeper"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                  "schema": {"type": "nope"}}}},
     "response_format", "invalid json_schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type", ""),
    ({"structured_outputs": {"regex": "(open"}}, "structured_outputs", "invalid regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs",
     "exactly one"),
    ({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
     "structured_outputs", "not both"),
    # Numbers past a double's range and lone surrogate escapes are no JSON schema.
    ({"structured_outputs": {"json": '{"type": "number", "maximum": 1e400}'}},
     "structured_outputs", "not finite"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "number", "maximum": "@INF@"}}}},
     "response_format", "not finite"),
    ({"structured_outputs": {"json": '{"type": "string", "pattern": "\\ud800"}'}},
     "structured_outputs", "lone surrogate"),
    # Structural tags: one of the two forms, each whole; a tag xgrammar refuses, in its words.
    ({"response_format": {"type": "structural_tag"}}, "response_format", "needs its format"),
    ({"response_format": {"type": "structural_tag", "format": {"type": "any_text"},
                          "triggers": ["<"]}}, "response_format", "needs its format"),
    ({"response_format": {"type": "structural_tag", "structures": [
        {"begin": "<a>", "schema": {}, "end": "</a>"}]}}, "response_format", "triggers"),
    ({"response_format": {"type": "structural_tag", "format": {"type": "bogus"}}},
     "response_format", "invalid structural_tag"),
    ({"structured_outputs": {"structural_tag": "not json"}}, "structured_outputs",
     "invalid structural_tag"),
])
def test_bad_specs_are_400s_naming_the_field(http, body, param, fragment) -> None:
    raw = json.dumps({"messages": MSG, "max_tokens": 4, **body}).replace('"@INF@"', "1e400")
    resp = http.post("/v1/chat/completions", content=raw,
                     headers={"Content-Type": "application/json"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and fragment in error["message"]
    if param.startswith("response_format"):  # the message speaks of the field it used
        assert "structured_outputs" not in error["message"], error["message"]
    assert http.get("/health").status_code == 200


# Past the engine's cap on a grammar's characters (65536, param_checks.MAX_GRAMMAR_CHARS).
_HUGE = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "d" * 100}
                                          for i in range(700)}}


@pytest.mark.parametrize(("route", "body", "param"), [
    ("/v1/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": _HUGE}}}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": _HUGE}}}, "response_format"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": _HUGE}}], "tool_choice": "required"}, "tools"),
    ("/v1/completions", {"structured_outputs": {"json": _HUGE}, "stream": True},
     "structured_outputs"),
    ("/v1/completions", {"structured_outputs": {"structural_tag": {"format": {
        "type": "json_schema", "json_schema": _HUGE}}}}, "structured_outputs"),
    ("/v1/chat/completions", {"response_format": {"type": "structural_tag", "format": {
        "type": "json_schema", "json_schema": _HUGE}}}, "response_format"),
])
def test_a_grammar_over_the_cap_names_the_field_the_request_used(http, route, body,
                                                                 param) -> None:
    # The engine's refusal named structured_outputs, a field these requests did not send.
    prompt = {"prompt": "x"} if route == "/v1/completions" else {"messages": MSG}
    resp = http.post(route, json={**prompt, "max_tokens": 4, **body})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and "65536" in error["message"], error
    assert error["message"].startswith(param), error
    assert http.get("/health").status_code == 200


@pytest.mark.parametrize("extra", [{"ignore_eos": True}, {"min_tokens": 5}])
def test_the_grammar_ends_the_output(http, extra) -> None:
    """ignore_eos and min_tokens cannot push a structured output past its grammar's end (they
    gave unconstrained tokens, or token 0 where every token was masked)."""
    for stream in (False, True):
        body = {"prompt": "x", "max_tokens": 10, "structured_outputs": {"regex": "ab"},
                "stream": stream, **extra}
        resp = http.post("/v1/completions", json=body)
        assert resp.status_code == 200, resp.text
        if stream:
            chunks = [json.loads(line[6:]) for line in resp.text.splitlines()
                      if line.startswith("data: {")]
            text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
            reason = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
        else:
            choice = resp.json()["choices"][0]
            text, reason = choice["text"], choice["finish_reason"]
        assert (text, reason) == ("ab", "stop")


def test_constraints_that_leave_no_token_are_400s(http, server) -> None:
    """Constraints that exclude every token: allowed_token_ids against bad_words is refused up
    front; against a grammar it is found at the first masked step: a 400 naming
    structured_outputs (a streamed response ends with that error frame). The server stays up
    and every KV block comes back."""
    x = http.post("/tokenize", json={"prompt": "x", "add_special_tokens": False}).json()["tokens"]
    body = {"prompt": "x", "max_tokens": 8, "allowed_token_ids": x}
    resp = http.post("/v1/completions", json={**body, "bad_words": ["x"]})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "allowed_token_ids"
    grammar = {**body, "structured_outputs": {"regex": "ab"}}
    resp = http.post("/v1/completions", json=grammar)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "structured_outputs" and "no token fits" in error["message"]
    resp = http.post("/v1/completions", json={**grammar, "stream": True})
    frames = [json.loads(line[6:]) for line in resp.text.splitlines()
              if line.startswith("data: {")]
    assert frames[-1]["error"]["param"] == "structured_outputs", frames[-1]
    # Named as the request gave it: OpenAI's response_format.
    chat = {"messages": MSG, "max_tokens": 8, "allowed_token_ids": x,
            "response_format": {"type": "json_object"}}
    for stream in (False, True):
        resp = http.post("/v1/chat/completions", json={**chat, "stream": stream})
        if stream:
            error = [json.loads(line[6:]) for line in resp.text.splitlines()
                     if line.startswith("data: {")][-1]["error"]
        else:
            assert resp.status_code == 400, resp.text
            error = resp.json()["error"]
        assert error["param"] == "response_format", error
        assert error["message"].startswith("response_format: no token fits"), error
    assert http.get("/health").status_code == 200
    ok = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
    wait_released(server.engine)
