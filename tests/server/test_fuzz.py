"""Property-based fuzzing of both generation endpoints: whatever the body, the answer is never a
5xx, errors have the OpenAI shape, and afterwards the server is healthy and holds no KV block.

Seeded (``derandomize``) and bounded: the server's context is small, so an accepted request
generates a few dozen tokens at most.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cadence.engine.async_llm import AsyncLLM
from tests.server.conftest import RunningServer, start_server, tiny_args
from tests.server.waiting import wait_until

MAX_MODEL_LEN = 40
EXAMPLES_PER_ENDPOINT = 150
STATUSES: Counter[int] = Counter()

leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
wild = st.recursive(
    leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
token_id = st.integers(min_value=0, max_value=639) | st.sampled_from([-1, 640, 1 << 40])
text = st.text(max_size=60) | st.sampled_from(["Hello", "the", "\u00e9\U0001f600", "a\x00b", ""])


def mostly(*rare: Any, common: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``common`` nine times in ten; otherwise one of the ``rare`` (usually invalid) values."""
    if not rare:
        return common
    return weighted((9, common), (1, st.sampled_from(rare)))


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of the strategies, chosen in proportion to its weight."""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(min_value=0, max_value=len(table) - 1).flatmap(
        lambda i: table[(i * 7 + 3) % len(table)]  # spread: small draws are the common ones
    )


COMMON: dict[str, st.SearchStrategy[Any]] = {
    "model": mostly("gpt-4", "", common=st.just("tiny")),
    "max_tokens": mostly(0, -1, 10**9, common=st.integers(min_value=1, max_value=12)),
    "min_tokens": mostly(-1, 50, common=st.integers(min_value=0, max_value=4)),
    "temperature": mostly(-0.5, 1e308, common=st.floats(min_value=0, max_value=2)),
    "top_p": mostly(0.0, 1.5, common=st.floats(min_value=0.01, max_value=1)),
    "top_k": mostly(-2, 1 << 70, common=st.integers(min_value=-1, max_value=1000)),
    "seed": mostly(1 << 64, -(1 << 63) - 1, common=st.integers(-(1 << 63), (1 << 63) - 1)),
    "stop": mostly([""], ["x"] * 70, common=text.filter(bool) | st.lists(text.filter(bool), max_size=4)),
    "stop_token_ids": mostly([-1], [1 << 64], common=st.lists(token_id, max_size=4)),
    "stream": st.booleans(),
    "stream_options": mostly({"include_usage": "x"}, common=st.fixed_dictionaries({}, optional={
        "include_usage": st.booleans(), "continuous_usage_stats": st.booleans()})),
    "ignore_eos": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "skip_special_tokens": st.booleans(),
    "priority": mostly(1, -(1 << 63), common=st.just(0)),
    "n": mostly(0, 2, common=st.just(1)),
    "presence_penalty": mostly(0.5, common=st.just(0.0)),
    "logit_bias": mostly({"1": 5.0}, common=st.just({})),
    "user": text,
    "unknown_field": wild,
}
COMPLETION = {
    **COMMON,
    "prompt": mostly([], "", [[]], common=text.filter(bool) | st.lists(token_id, min_size=1, max_size=12)
                     | st.lists(text.filter(bool), min_size=1, max_size=3)
                     | st.lists(st.lists(token_id, min_size=1, max_size=6), min_size=1, max_size=3)),
    "logprobs": mostly(-1, 21, common=st.integers(min_value=0, max_value=5)),
    "echo": mostly(True, common=st.just(False)),
    "best_of": mostly(2, 0, common=st.just(1)),
    "suffix": mostly("x", common=st.just("")),
    "return_token_ids": st.booleans(),
}
roles = mostly("wizard", 3, common=st.sampled_from(["system", "user", "assistant", "tool"]))
message = st.fixed_dictionaries(
    {"role": roles},
    optional={
        "content": text | st.none() | st.lists(st.fixed_dictionaries(
            {"type": mostly("image", common=st.just("text")), "text": text}), max_size=2),
        "name": text,
    },
)
CHAT = {
    **COMMON,
    "messages": mostly([], "hi", common=st.lists(message, min_size=1, max_size=3)),
    "max_completion_tokens": mostly(0, 10**6, common=st.integers(min_value=1, max_value=12)),
    "logprobs": st.booleans(),
    "top_logprobs": mostly(-1, 21, common=st.integers(min_value=0, max_value=5)),
    "add_generation_prompt": st.booleans(),
    "continue_final_message": mostly(True, common=st.just(False)),
    "chat_template_kwargs": mostly({"tokenize": True}, common=st.dictionaries(
        st.sampled_from(["enable_thinking", "x"]), leaf, max_size=2)),
    "tools": mostly([{"type": "function"}], common=st.just([])),
    "response_format": mostly({"type": "json_object"}, common=st.just({"type": "text"})),
}


part = st.fixed_dictionaries({"type": mostly("input_image", common=st.sampled_from(
    ["input_text", "output_text"])), "text": text})
item = weighted(
    (6, st.fixed_dictionaries({"role": roles}, optional={"content": text | st.lists(part,
                                                                                    max_size=2)})),
    (1, st.fixed_dictionaries({"type": st.just("function_call"), "call_id": text,
                               "name": text, "arguments": mostly("{", common=st.just("{}"))})),
    (1, st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": text,
                               "output": text})),
    (1, st.fixed_dictionaries({"type": mostly("web_search_call", common=st.just("reasoning"))})),
)
RESPONSES = {
    **{k: v for k, v in COMMON.items() if k not in ("n", "max_tokens", "stream_options")},
    "input": mostly([], common=text.filter(bool) | st.lists(item, min_size=1, max_size=3)),
    "instructions": text,
    "max_output_tokens": mostly(0, 10**6, common=st.integers(min_value=1, max_value=12)),
    "tools": mostly([{"type": "web_search"}], common=st.just([])),
    "text": mostly({"format": {"type": "xml"}}, common=st.just({"format": {"type": "text"}})),
    "include": mostly(["x"], common=st.just(["message.output_text.logprobs"])),
    "top_logprobs": mostly(-1, 21, common=st.integers(min_value=0, max_value=5)),
    "store": st.booleans(),
}


def bodies(fields: dict[str, st.SearchStrategy[Any]], required: str) -> st.SearchStrategy[bytes]:
    """Plausible bodies (each field usually valid), bodies with one field replaced by anything
    at all or left out, and bodies that are not a JSON object or not JSON."""
    optional = {k: v for k, v in fields.items() if k != required}
    plausible = st.fixed_dictionaries({required: fields[required]}, optional=optional)
    names = sorted(fields)
    one_wild = st.tuples(plausible, st.sampled_from(names), wild).map(
        lambda t: {**t[0], t[1]: t[2]})
    missing = plausible.map(lambda d: {k: v for k, v in d.items() if k != required})
    as_json = weighted((6, plausible), (2, one_wild), (1, missing))
    encoded = as_json.map(lambda d: json.dumps(d).encode())
    not_an_object = wild.map(lambda v: json.dumps(v).encode())
    return weighted((14, encoded), (1, not_an_object), (1, st.binary(max_size=40)))


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[RunningServer]:
    engine = AsyncLLM(tiny_args(max_model_len=MAX_MODEL_LEN, num_gpu_blocks_override=64))
    running = start_server(engine, max_request_body_bytes=64 * 1024)
    yield running
    running.stop()


def post(srv: RunningServer, route: str, raw: bytes) -> None:
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=srv.base_url, timeout=60) as http:
        with http.stream("POST", route, content=raw, headers=headers) as resp:
            payload = resp.read()
    STATUSES[resp.status_code] += 1
    assert resp.status_code < 500, (route, raw, payload)
    if resp.status_code >= 400:
        err = json.loads(payload)["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == resp.status_code
        return
    if route == "/v1/responses":  # typed events, no [DONE]; an error is an "error" event
        frames = [ln[6:] for ln in payload.decode().split("\n") if ln.startswith("data: ")]
        body = json.loads(frames[-1]) if frames else json.loads(payload)
        assert body.get("type") in ("response.completed", None), body
        assert (body.get("response") or body)["object"] == "response"
        return
    if resp.headers["content-type"].startswith("text/event-stream"):
        frames = [ln[6:] for ln in payload.decode().split("\n") if ln.startswith("data: ")]
        assert frames[-1] == "[DONE]"
        for frame in frames[:-1]:
            data = json.loads(frame)
            assert "error" not in data or data["error"]["code"] < 500, data
    else:
        assert "choices" in json.loads(payload)


FUZZ = settings(
    max_examples=EXAMPLES_PER_ENDPOINT,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(raw=bodies(COMPLETION, "prompt"))
def test_fuzz_completions(fuzz_server, raw: bytes) -> None:
    post(fuzz_server, "/v1/completions", raw)


@FUZZ
@given(raw=bodies(CHAT, "messages"))
def test_fuzz_chat_completions(fuzz_server, raw: bytes) -> None:
    post(fuzz_server, "/v1/chat/completions", raw)


@FUZZ
@given(raw=bodies(RESPONSES, "input"))
def test_fuzz_responses(fuzz_server, raw: bytes) -> None:
    post(fuzz_server, "/v1/responses", raw)


def test_server_is_healthy_and_idle_after_fuzzing(fuzz_server) -> None:
    print(f"\nfuzz status histogram: {dict(sorted(STATUSES.items()))}")
    engine = fuzz_server.engine
    with httpx.Client(base_url=fuzz_server.base_url, timeout=30) as http:
        assert http.get("/health").status_code == 200
        ok = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3

    def idle() -> bool:
        stats = engine.engine_core.call_utility("make_stats")
        return (stats.num_running_reqs, stats.num_waiting_reqs) == (0, 0)

    wait_until(idle, "an idle engine")
    core = engine.engine_core.proc.engine_core
    assert core.num_free_kv_blocks == core.num_kv_blocks - 1
    assert not engine.output_processor.has_unfinished_requests()
    assert all(status < 500 for status in STATUSES)
