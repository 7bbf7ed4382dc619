"""/tokenize, /detokenize, /ping and /openapi.json, against a real server; expected ids come
from the tiny model's tokenizer loaded here, independently of the server."""

from __future__ import annotations

import httpx
import pytest
from transformers import AutoTokenizer

from cadence.model.tiny import ensure_tiny_model

TEXT = "Hello my name is Robert and I like tea."
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"}]


@pytest.fixture(scope="module")
def hf_tokenizer():
    return AutoTokenizer.from_pretrained(str(ensure_tiny_model()))


@pytest.fixture
def http(server) -> httpx.Client:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


def test_tokenize_a_prompt(http: httpx.Client, hf_tokenizer, server) -> None:
    for specials in (True, False):
        resp = http.post("/tokenize", json={"model": "tiny", "prompt": TEXT,
                                            "add_special_tokens": specials,
                                            "return_token_strs": True})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        expected = hf_tokenizer.encode(TEXT, add_special_tokens=specials)
        assert body["tokens"] == expected and body["count"] == len(expected)
        assert body["max_model_len"] == server.engine.max_model_len
        assert body["token_strs"] == hf_tokenizer.convert_ids_to_tokens(expected)
    plain = http.post("/tokenize", json={"prompt": TEXT}).json()
    assert "token_strs" not in plain and plain["tokens"] == hf_tokenizer.encode(TEXT)


def test_tokenize_a_conversation_as_chat_completions_renders_it(
    http: httpx.Client, hf_tokenizer
) -> None:
    text = hf_tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    expected = hf_tokenizer.encode(text, add_special_tokens=False)
    body = http.post("/tokenize", json={"messages": CHAT}).json()
    assert body["tokens"] == expected
    # The chat endpoint counts the same prompt.
    chat = http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1}).json()
    assert chat["usage"]["prompt_tokens"] == body["count"]
    no_prompt = http.post("/tokenize", json={"messages": CHAT, "add_generation_prompt": False})
    text2 = hf_tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=False)
    assert no_prompt.json()["tokens"] == hf_tokenizer.encode(text2, add_special_tokens=False)


def test_tokenize_a_conversation_with_the_tokenizers_special_tokens(
    http: httpx.Client, hf_tokenizer
) -> None:
    # vLLM: the rendered conversation is tokenized with add_special_tokens as asked (a 500
    # once: the ids were wrapped by a tokenizer method this tokenizer does not have).
    text = hf_tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    resp = http.post("/tokenize", json={"messages": CHAT, "add_special_tokens": True})
    assert resp.status_code == 200, resp.text
    expected = hf_tokenizer.encode(text, add_special_tokens=True)
    assert resp.json()["tokens"] == expected and resp.json()["count"] == len(expected)
    assert http.get("/health").status_code == 200


def test_detokenize_inverts_tokenize(http: httpx.Client, hf_tokenizer) -> None:
    ids = hf_tokenizer.encode(TEXT, add_special_tokens=False)
    resp = http.post("/detokenize", json={"model": "tiny", "tokens": ids})
    assert resp.status_code == 200 and resp.json() == {"prompt": hf_tokenizer.decode(ids)}
    assert resp.json()["prompt"] == TEXT


def test_detokenize_accepts_the_whole_vocabulary_and_nothing_past_it(
    http: httpx.Client, hf_tokenizer
) -> None:
    vocab = len(hf_tokenizer)  # the tokenizer's own count, added tokens included
    last = http.post("/detokenize", json={"tokens": [0, vocab - 1]})
    assert last.status_code == 200, last.text
    assert last.json()["prompt"] == hf_tokenizer.decode([0, vocab - 1])
    past = http.post("/detokenize", json={"tokens": [0, vocab]})
    assert past.status_code == 400 and past.json()["error"]["param"] == "tokens"
    assert str(vocab) in past.json()["error"]["message"]


@pytest.mark.parametrize(
    ("route", "body", "status", "param"),
    [
        ("/tokenize", {"model": "tiny"}, 400, "prompt"),
        ("/tokenize", {"prompt": 3}, 400, "prompt"),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/tokenize", {"messages": CHAT, "chat_template_kwargs": {"tokenize": True}}, 400,
         "chat_template_kwargs"),
        ("/tokenize", {"prompt": "x", "model": "other"}, 404, "model"),
        ("/tokenize", [1, 2], 400, None),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
        ("/detokenize", {"tokens": [10**12]}, 400, "tokens"),
        ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
        ("/detokenize", {}, 400, "tokens"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_parameter(
    http: httpx.Client, route: str, body: object, status: int, param: str | None
) -> None:
    resp = http.post(route, json=body)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and err["message"]
    assert http.get("/health").status_code == 200


def test_ping(http: httpx.Client) -> None:
    assert http.get("/ping").status_code == 200
    assert http.post("/ping").status_code == 200


def test_openapi_document_describes_every_route(http: httpx.Client) -> None:
    resp = http.get("/openapi.json")
    assert resp.status_code == 200
    doc = resp.json()
    assert doc["openapi"].startswith("3.")
    routes = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize",
              "/detokenize", "/health", "/ping", "/version", "/metrics"}
    assert routes <= set(doc["paths"])
    schemas = doc["components"]["schemas"]
    assert {"CompletionRequest", "ChatCompletionRequest", "TokenizeResponse"} <= set(schemas)
    assert "max_tokens" in schemas["CompletionRequest"]["properties"]

    def refs(node: object) -> list[str]:
        if isinstance(node, dict):
            return [v for k, v in node.items() if k == "$ref"] + [
                r for v in node.values() for r in refs(v)]
        if isinstance(node, list):
            return [r for v in node for r in refs(v)]
        return []

    found = refs(doc)
    assert found and all(r.split("/")[-1] in schemas for r in found)
    post = doc["paths"]["/v1/completions"]["post"]
    assert "text/event-stream" in post["responses"]["200"]["content"]


def test_unknown_fields_are_ignored_and_logged_once_per_name(
    http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    caplog.set_level(logging.WARNING, logger="cadence.server.app")
    body = {"prompt": "Hi", "max_tokens": 2, "frobnicate": 1, "zzz_unknown": True}
    for _ in range(3):
        assert http.post("/v1/completions", json=body).status_code == 200
    logged = [r.getMessage() for r in caplog.records if "unknown field" in r.getMessage()]
    assert len(logged) == 1 and "frobnicate, zzz_unknown" in logged[0]
    assert "CompletionRequest" in logged[0]
    chat = {"messages": CHAT, "max_tokens": 1, "frobnicate": 2, "another_one": 3}
    assert http.post("/v1/chat/completions", json=chat).status_code == 200
    logged = [r.getMessage() for r in caplog.records if "unknown field" in r.getMessage()]
    assert len(logged) == 2 and logged[1].endswith("another_one (logged once per name).")


def test_client_text_cannot_forge_a_log_line(
    http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A field name holding a newline and a fake log line is logged escaped, on one line."""
    import logging

    caplog.set_level(logging.WARNING, logger="cadence.server.app")
    forged = "zz\n2026-12-04 23:59:59,000 ERROR cadence.engine.core: Engine died"
    body = {"prompt": "Hi", "max_tokens": 1, forged: 1}
    assert http.post("/v1/completions", json=body).status_code == 200
    (logged,) = [r.getMessage() for r in caplog.records if "zz" in r.getMessage()]
    assert "\n" not in logged and "zz\\n2026" in logged


def test_unknown_field_names_kept_and_logged_are_bounded(
    http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A client sending ever new field names grows neither the server's memory nor its log:
    256 names are remembered at most, and a warning names 8 of a request's (each cut at 64
    characters)."""
    import logging

    from cadence.server.app import UNKNOWN_FIELDS_KEPT, UNKNOWN_FIELDS_NAMED

    caplog.set_level(logging.WARNING, logger="cadence.server.app")

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "unknown field" in r.getMessage()]

    names = {f"{'x' * 100}{i:04d}": i for i in range(UNKNOWN_FIELDS_KEPT + 50)}
    body = {"prompt": "Hi", "max_tokens": 1, **names}
    assert http.post("/v1/completions", json=body).status_code == 200
    (logged,) = warnings()
    assert logged.count("x" * 64 + ",") == UNKNOWN_FIELDS_NAMED - 1  # names cut at 64
    assert f"and {len(names) - UNKNOWN_FIELDS_NAMED} more" in logged
    assert logged.endswith("no more names are remembered).") and len(logged) < 1000
    fresh = {"prompt": "Hi", "max_tokens": 1, "never_seen_before": 1}
    assert http.post("/v1/completions", json=fresh).status_code == 200
    assert len(warnings()) == 1  # full: nothing more is remembered or logged


def test_chat_return_token_ids(http: httpx.Client, hf_tokenizer) -> None:
    prompt_ids = http.post("/tokenize", json={"messages": CHAT}).json()["tokens"]
    body = {"messages": CHAT, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    full = http.post("/v1/chat/completions", json=body).json()
    ids = full["choices"][0]["token_ids"]
    assert full["prompt_token_ids"] == prompt_ids and len(ids) == 6
    assert full["choices"][0]["message"]["content"] == hf_tokenizer.decode(ids)
    plain = http.post("/v1/chat/completions", json={**body, "return_token_ids": False}).json()
    assert plain["choices"][0]["token_ids"] is None and plain["prompt_token_ids"] is None
    # Streamed: the prompt's ids in the first chunk, each chunk's own ids after it.
    import json

    chunks = []
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    assert chunks[0]["prompt_token_ids"] == prompt_ids
    assert all(c["prompt_token_ids"] is None for c in chunks[1:])
    streamed = [t for c in chunks[1:] for t in (c["choices"][0]["token_ids"] or [])]
    assert streamed == ids


def test_completions_return_the_prompt_token_ids(http: httpx.Client, hf_tokenizer) -> None:
    import json

    prompts = [TEXT, "Once upon a time"]
    body = {"prompt": prompts, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    full = http.post("/v1/completions", json=body).json()
    by_index = {c["index"]: c for c in full["choices"]}
    for i, p in enumerate(prompts):
        assert by_index[i]["prompt_token_ids"] == hf_tokenizer.encode(p)
        assert len(by_index[i]["token_ids"]) == 4
    plain = http.post("/v1/completions", json={**body, "return_token_ids": False}).json()
    assert all(c["prompt_token_ids"] is None for c in plain["choices"])
    # Streamed: each choice's first chunk carries its prompt's ids, later ones do not.
    seen: dict[int, list] = {}
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                seen.setdefault(choice["index"], []).append(choice["prompt_token_ids"])
    for i, p in enumerate(prompts):
        assert seen[i][0] == hf_tokenizer.encode(p)
        assert all(x is None for x in seen[i][1:])


@pytest.mark.parametrize("form", ["prompt", "messages"])
def test_a_text_that_cannot_fit_the_context_is_refused_before_tokenizing(
    http: httpx.Client, server, form: str
) -> None:
    """Megabytes of text would hold the engine's input thread for seconds: the route refuses
    a text longer than the context can hold by the characters-per-token bound alone (the
    "at least" count is that bound's, not a tokenizer's)."""
    text = "ab c" * 200_000  # 800 KB: under the test server's body limit
    body = ({"prompt": text} if form == "prompt"
            else {"messages": [{"role": "user", "content": text}]})
    resp = http.post("/tokenize", json=body)
    assert resp.status_code == 400, resp.text[:200]
    err = resp.json()["error"]
    assert err["param"] == form
    assert f"maximum context length is {server.engine.max_model_len} tokens" in err["message"]
    assert "at least" in err["message"]
    assert http.post("/tokenize", json={"prompt": TEXT}).status_code == 200


def test_openapi_request_bodies_name_each_model_a_route_takes() -> None:
    """One model: a reference to it; several (/tokenize takes a prompt or a conversation):
    anyOf a reference to each."""
    from cadence.server.api_operations import API_OPERATIONS
    from cadence.server.openapi import openapi_document

    doc = openapi_document("cadence", "0", API_OPERATIONS)

    def body(path: str) -> dict:
        return doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]

    ref = "#/components/schemas/"
    assert body("/v1/completions") == {"$ref": ref + "CompletionRequest"}
    assert body("/tokenize") == {"anyOf": [{"$ref": ref + "TokenizeCompletionRequest"},
                                           {"$ref": ref + "TokenizeChatRequest"}]}
    assert {"TokenizeCompletionRequest", "TokenizeChatRequest"} <= set(
        doc["components"]["schemas"])


def _tokenization(hf_tokenizer, chat_template: str | None = None):
    """The routes' work over a stand-in engine holding the tiny model's tokenizer."""
    from types import SimpleNamespace

    from cadence.server.tokenization import Tokenization

    engine = SimpleNamespace(tokenizer=hf_tokenizer, max_model_len=64,
                             input_processor=SimpleNamespace(check_prompt_text=lambda t: None))
    return Tokenization(engine, chat_template=chat_template)


def test_tokenize_continues_the_final_message_when_asked(hf_tokenizer) -> None:
    partial = [*CHAT, {"role": "assistant", "content": "Hello, I am"}]
    text = hf_tokenizer.apply_chat_template(partial, tokenize=False, add_generation_prompt=False,
                                            continue_final_message=True)
    assert text.endswith("Hello, I am")
    got = _tokenization(hf_tokenizer).tokenize({"messages": partial,
                                                "add_generation_prompt": False,
                                                "continue_final_message": True})
    assert got.tokens == hf_tokenizer.encode(text, add_special_tokens=False)


def test_tokenize_renders_the_tools_and_the_servers_template_kwargs(hf_tokenizer) -> None:
    template = ("{{ greeting }}|{% for t in tools or [] %}{{ t.function.name }};{% endfor %}|"
                "{% for m in messages %}{{ m.content }}{% endfor %}")
    tok = _tokenization(hf_tokenizer, chat_template=template)
    tok.default_chat_template_kwargs = {"greeting": "Howdy"}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    got = tok.tokenize({"messages": CHAT, "tools": tools})
    expected = hf_tokenizer.encode("Howdy|get_weather;|Be brief.Hi there!",
                                   add_special_tokens=False)
    assert got.tokens == expected and got.count == len(expected) and got.max_model_len == 64
    # The request's own kwargs win over the server's.
    mine = tok.tokenize({"messages": CHAT, "chat_template_kwargs": {"greeting": "Hi"}})
    assert mine.tokens == hf_tokenizer.encode("Hi||Be brief.Hi there!", add_special_tokens=False)
