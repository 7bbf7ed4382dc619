"""Structured outputs: with the tiny model's random weights the grammar alone makes every output
valid (checked by jsonschema / re, independently of xgrammar); async on == off."""

from __future__ import annotations

import json
import re
import threading

import pytest

from cadence import LLM, SamplingParams
from cadence.sampling_params import StructuredOutputsParams
from tests.tiny import tiny_args

jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "inner": {"type": "object", "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "code": {"type": "string", "maxLength": 4}},
            "required": ["n", "code"], "additionalProperties": False},
    },
    "required": ["ok", "tags", "inner"],
    "additionalProperties": False,
}
REGEX = r"[a-c]{2,4}-[0-9]{3}"
CHOICES = ["yes", "no", "it depends"]
# Formats whose xgrammar grammar lets impossible values through (November 31st, leading zeros):
# each value is checked by Python's own parser of it.
DATES = {"type": "object", "properties": {
    "day": {"type": "string", "format": "date"},
    "at": {"type": "string", "format": "date-time"},
    "ip": {"type": "string", "format": "ipv4"}}, "required": ["day", "at", "ip"],
    "additionalProperties": False}


def _check_dates(text: str) -> None:
    import datetime
    import ipaddress

    value = json.loads(text)

    def python_year(day: str) -> str:  # RFC 3339 has year 0000 (a leap year, as 2000); Python not
        return "2000" + day[4:] if day.startswith("0000") else day

    datetime.date.fromisoformat(python_year(value["day"]))
    datetime.datetime.fromisoformat(python_year(value["at"]).replace(":60", ":59"))  # leap second
    ipaddress.IPv4Address(value["ip"])  # refuses leading zeros


# A schema pattern's optional group ending in a repeat: xgrammar once let its head be skipped.
PATTERNS = {"type": "object", "properties": {
    "v": {"type": "string", "pattern": "^v(yz+)?Z$"},
    "n": {"type": "string", "pattern": "^[0-9]{1,3}(\\.[0-9]+)?%$"}},
    "required": ["v", "n"], "additionalProperties": False}

# A structural tag whose text is forced (a sequence: fixed text, then a tag of SCHEMA's JSON).
TAGGED = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
    {"type": "const_string", "value": "Result: "},
    {"type": "tag", "begin": "<f>", "end": "</f>",
     "content": {"type": "json_schema", "json_schema": SCHEMA}}]}}


def _check_tagged(text: str) -> None:
    head, tail = "Result: <f>", "</f>"
    assert text.startswith(head) and text.endswith(tail), text
    jsonschema.validate(json.loads(text[len(head):-len(tail)]), SCHEMA)


FORMATS = {
    "json_schema": (dict(json=SCHEMA), lambda t: jsonschema.validate(json.loads(t), SCHEMA)),
    "dates": (dict(json=DATES), _check_dates),
    "patterns": (dict(json=PATTERNS), lambda t: jsonschema.validate(json.loads(t), PATTERNS)),
    "json_object": (dict(json_object=True), lambda t: isinstance(json.loads(t), dict) or 1 / 0),
    "regex": (dict(regex=REGEX), lambda t: re.fullmatch(REGEX, t) or 1 / 0),
    "choice": (dict(choice=CHOICES), lambda t: t in CHOICES or 1 / 0),
    "structural_tag": (dict(structural_tag=json.dumps(TAGGED)), _check_tagged),
}


def _args(**kw):
    # NOTE: on the CPU on any machine: the seeded outputs below must end within max_tokens,
    # which holds for the CPU generator's draws; a GPU's draws others (a random model's JSON
    # may then run on), and its bfloat16 steps differ with the batch's shape.
    return tiny_args(device="cpu", **kw)


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def llm(request):
    engine = LLM(**vars(_args(async_scheduling=request.param)))
    yield engine
    engine.shutdown()


def _run(llm, fmt: str) -> list[str]:
    spec, _ = FORMATS[fmt]
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=200,
                             structured_outputs=StructuredOutputsParams(**spec))
              for i in range(20)]
    outs = llm.generate(["Give me the data:"] * 20, params, use_tqdm=False)
    assert all(o.outputs[0].finish_reason == "stop" for o in outs)
    return [o.outputs[0].text for o in outs]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_twenty_seeded_outputs_are_valid(llm, fmt) -> None:
    _, check = FORMATS[fmt]
    texts = _run(llm, fmt)
    for text in texts:
        check(text)
    assert len(set(texts)) > 1  # sampled, not forced into one answer


def test_async_on_equals_off() -> None:
    got = []
    for async_scheduling in (False, True):
        engine = LLM(**vars(_args(async_scheduling=async_scheduling)))
        got.append([_run(engine, fmt) for fmt in FORMATS])
        engine.shutdown()
    assert got[0] == got[1]


def test_constrained_and_free_requests_share_steps() -> None:
    """Only the constrained rows are masked: the free request gives its unconstrained tokens."""
    engine = LLM(**vars(_args()))
    free = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = engine.generate(["Hello"], free, use_tqdm=False)[0].outputs[0].token_ids
    mixed = engine.generate(
        ["Hello", "Hello"],
        [free, SamplingParams(temperature=0.0, max_tokens=12,
                              structured_outputs=StructuredOutputsParams(choice=CHOICES))],
        use_tqdm=False)
    assert mixed[0].outputs[0].token_ids == alone
    assert mixed[1].outputs[0].text in CHOICES
    engine.shutdown()


@pytest.mark.parametrize(("spec", "fragment"), [
    (dict(json={"type": "nope"}), "invalid json"),
    (dict(regex="(unclosed"), "invalid regex"),
    (dict(grammar="root ::= missing_rule"), "invalid grammar"),
    (dict(structural_tag={"format": {"type": "tag", "begin": "<", "end": ">",
                                     "content": {"type": "json_schema",
                                                 "json_schema": {"type": "nope"}}}}),
     "invalid structural_tag"),
    # Past a double's range (xgrammar refused it without a word): said in words.
    (dict(json='{"type": "integer", "maximum": 1e400}'), "invalid json: the schema holds a "
                                                          "number that is not finite"),
])
def test_invalid_specs_are_the_requests_error(spec, fragment) -> None:
    engine = LLM(**vars(tiny_args()))
    with pytest.raises(ValueError, match=fragment):
        engine.generate(["x"], SamplingParams(structured_outputs=StructuredOutputsParams(**spec)),
                        use_tqdm=False)
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["b"])
    engine.shutdown()


def test_a_grammar_that_fails_in_the_runner_fails_its_request_only() -> None:
    """A spec that skipped the front end's check ends its own request with an error."""
    from cadence.core_types import EngineCoreRequest, FinishReason
    from cadence.engine.core import EngineCore

    core = EngineCore(tiny_args())
    bad = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(regex="(x"))
    good = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    core.add_request(EngineCoreRequest("bad", [5, 6, 7], bad))
    core.add_request(EngineCoreRequest("good", [5, 6, 7], good))
    finished = {}
    while core.has_work():
        outs, _ = core.step_fn()
        for o in outs.outputs if outs is not None else []:
            if o.finished:
                finished[o.request_id] = o
    assert finished["bad"].finish_reason == FinishReason.ERROR
    assert "invalid regex" in finished["bad"].error
    assert finished["good"].finish_reason == FinishReason.LENGTH
    core.shutdown()


def test_requests_run_on_while_a_grammar_compiles(monkeypatch) -> None:
    """The grammar compiles on the compiler's thread: a free request runs to the end while it
    is held; the constrained one waits (not failed, not stalled) and then runs."""
    from transformers import AutoTokenizer

    from cadence.core_types import EngineCoreRequest, FinishReason
    from cadence.engine.core import EngineCore
    from cadence.worker.grammar_compiler import GrammarCompilerService

    release = threading.Event()
    original = GrammarCompilerService._compile

    def held(self, spec):
        assert release.wait(timeout=120), "never released"
        return original(self, spec)

    monkeypatch.setattr(GrammarCompilerService, "_compile", held)
    for async_scheduling in (False, True):
        release.clear()
        core = EngineCore(tiny_args(async_scheduling=async_scheduling))
        constrained = SamplingParams(temperature=0.0, max_tokens=30,
                                     structured_outputs=StructuredOutputsParams(choice=CHOICES))
        free = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        eos = AutoTokenizer.from_pretrained(core.spec.tokenizer_path).eos_token_id
        core.add_request(EngineCoreRequest("constrained", [5, 6, 7], constrained,
                                           eos_token_id=eos))
        core.add_request(EngineCoreRequest("free", [5, 6, 7], free))
        finished: dict = {}
        tokens: dict[str, list[int]] = {"constrained": [], "free": []}
        while "free" not in finished:
            outs, _ = core.step_fn()
            for o in outs.outputs if outs is not None else []:
                tokens[o.request_id] += o.new_token_ids
                if o.finished:
                    finished[o.request_id] = o
        assert tokens["constrained"] == [] and "constrained" not in finished
        assert len(tokens["free"]) == 6
        release.set()
        while core.has_work():
            outs, _ = core.step_fn()
            for o in outs.outputs if outs is not None else []:
                tokens[o.request_id] += o.new_token_ids
                if o.finished:
                    finished[o.request_id] = o
        assert finished["constrained"].finish_reason == FinishReason.STOP
        text = AutoTokenizer.from_pretrained(core.spec.tokenizer_path).decode(
            tokens["constrained"], skip_special_tokens=True)
        assert text in CHOICES
        core.shutdown()


def test_preempted_constrained_requests_stay_valid_and_deterministic() -> None:
    """A KV cache too small for the batch preempts constrained requests mid-generation: their
    matchers are rebuilt from the outputs so far, and every output is valid and the same as
    without preemption (seeded sampling), async on and off."""
    kinds = ["json_schema", "regex", "json_schema", "choice"]

    def run(async_scheduling: bool, **kw):
        engine = LLM("tiny", device="cpu", max_model_len=256, max_num_seqs=4,
                     async_scheduling=async_scheduling, **kw)
        params = [SamplingParams(temperature=1.0, seed=i, max_tokens=90,
                                 structured_outputs=StructuredOutputsParams(**FORMATS[k][0]))
                  for i, k in enumerate(kinds)]
        outs = engine.generate(["Give me the data: " + "x" * (8 * i) for i in range(4)],
                               params, use_tqdm=False)
        stats = engine.engine_core.make_stats()
        engine.shutdown()
        return [(o.outputs[0].text, o.outputs[0].finish_reason) for o in outs], stats

    roomy, _ = run(False)
    for async_scheduling in (False, True):
        tight, stats = run(async_scheduling, num_gpu_blocks_override=9,
                           max_num_batched_tokens=64)
        assert stats.num_preemptions > 0
        assert tight == roomy
    finished = [(kind, text) for kind, (text, reason) in zip(kinds, roomy, strict=True)
                if reason == "stop"]
    assert len(finished) >= 3, roomy
    for kind, text in finished:
        FORMATS[kind][1](text)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_constraints_that_leave_no_token_fail_the_request(async_scheduling) -> None:
    """A grammar that the request's allowed_token_ids exclude entirely, or one that can never
    finish, fails its own request in the step whose row had no token left, whatever max_tokens
    (it sampled token 0 on and on); nothing of that row's token reaches the output; the free
    request beside it runs to its end and every KV block comes back."""
    from cadence.core_types import EngineCoreRequest, FinishReason
    from cadence.engine.core import EngineCore

    core = EngineCore(tiny_args(async_scheduling=async_scheduling))
    tok = core_tokenizer()
    (x,) = tok.encode("x", add_special_tokens=False)
    free_blocks = core.num_free_kv_blocks
    bad = {
        f"{name}-{max_tokens}": SamplingParams(max_tokens=max_tokens, **kw)
        for max_tokens in (1, 2, 16)
        for name, kw in (
            ("regex", dict(allowed_token_ids=[x],
                           structured_outputs=StructuredOutputsParams(regex="ab"))),
            ("choice", dict(temperature=1.0, seed=3, allowed_token_ids=[x],
                            structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))),
            ("endless", dict(structured_outputs=StructuredOutputsParams(
                grammar="root ::= root"))),
            # Token 0 (byte 0x00) fits this grammar: the masked row's token must not pass.
            ("zero", dict(allowed_token_ids=[x], structured_outputs=StructuredOutputsParams(
                regex="[^x]+"))),
        )
    }
    prompt = tok.encode("Hello")
    core.add_request(EngineCoreRequest("free", prompt, SamplingParams(
        temperature=0.0, max_tokens=16, ignore_eos=True)))
    for req_id, params in bad.items():
        core.add_request(EngineCoreRequest(req_id, prompt, params))
    tokens: dict[str, list[int]] = {}
    finished = {}
    while core.has_work():
        outs, _ = core.step_fn()
        for o in outs.outputs if outs is not None else []:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                finished[o.request_id] = o
    assert finished["free"].finish_reason == FinishReason.LENGTH and len(tokens["free"]) == 16
    for req_id in bad:
        assert finished[req_id].finish_reason == FinishReason.ERROR, req_id
        assert finished[req_id].error.startswith("structured_outputs: no token fits"), req_id
        assert tokens.get(req_id, []) == [], req_id  # the masked row's token is not output
    assert core.num_free_kv_blocks == free_blocks
    core.shutdown()


@pytest.mark.parametrize("kind", ["final", "cumulative", "delta"])
def test_an_offline_failure_keeps_what_was_generated(llm, caplog, kind) -> None:
    """Offline, a request whose grammar runs out of tokens after its first ends with
    finish_reason "error" and what it generated: the token "a" (the only one "ab" and
    allowed_token_ids both let through), its text and its logprobs, whatever the output kind
    (LLM.generate merges DELTA outputs; the failure's own adds nothing), and the reason is
    logged."""
    import logging

    from cadence.sampling_params import RequestOutputKind

    (a,) = core_tokenizer().encode("a", add_special_tokens=False)
    eos = core_tokenizer().eos_token_id
    output_kind = {"final": RequestOutputKind.FINAL_ONLY,
                   "cumulative": RequestOutputKind.CUMULATIVE,
                   "delta": RequestOutputKind.DELTA}[kind]
    params = SamplingParams(temperature=0.0, max_tokens=10, logprobs=1, output_kind=output_kind,
                            allowed_token_ids=[a, eos],
                            structured_outputs=StructuredOutputsParams(regex="ab"))
    with caplog.at_level(logging.WARNING, logger="cadence.engine.output_processor"):
        out = llm.generate(["Answer:"], params, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "error"
    assert any("no token fits the grammar" in r.getMessage() for r in caplog.records)
    assert (out.text, out.token_ids) == ("a", [a])
    assert len(out.logprobs) == 1 and a in out.logprobs[0]


def test_a_token_outside_the_grammar_fails_its_request(monkeypatch) -> None:
    """The grammar's backstop: were a mask ever broken, the token it let through fails its
    request with the grammar's error (here the masks are switched off; the request's greedy
    first token, read from an unconstrained run, is outside its one-choice grammar)."""
    from cadence.core_types import EngineCoreRequest, FinishReason
    from cadence.engine.core import EngineCore
    from cadence.worker.grammar import NO_TOKEN_FITS

    core = EngineCore(tiny_args())
    tok = core_tokenizer()
    prompt = tok.encode("Hello")
    greedy = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

    def run(req_id: str, params: SamplingParams):
        core.add_request(EngineCoreRequest(req_id, prompt, params))
        while core.has_work():
            outs, _ = core.step_fn()
            for o in outs.outputs if outs is not None else []:
                if o.finished:
                    return o
        raise AssertionError("the request never finished")

    (first,) = run("free", greedy).new_token_ids
    # A choice the greedy token cannot begin (it is not a prefix of "qqq", or else of "zzz").
    choice = "z" if "qqq".startswith(tok.decode([first])) else "q"
    monkeypatch.setattr("cadence.worker.sampler.apply_grammar_mask", lambda logits, mask: None)
    out = run("broken", SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True,
                                       structured_outputs=StructuredOutputsParams(
                                           choice=[choice * 3])))
    assert out.finish_reason == FinishReason.ERROR and out.error == NO_TOKEN_FITS
    assert core.num_free_kv_blocks == core.num_kv_blocks - 1
    core.shutdown()


def core_tokenizer():
    from transformers import AutoTokenizer

    from cadence.model.tiny import ensure_tiny_model

    return AutoTokenizer.from_pretrained(ensure_tiny_model())


@pytest.mark.parametrize("literal", ["<|im_start|>", "<|endoftext|>", "a<|im_end|>"])
def test_a_special_token_never_stands_for_its_literal(llm, literal: str) -> None:
    """The tokenizer's special tokens are not text: a grammar whose text is a special token's
    literal is spelled with ordinary tokens, even with the special ones pushed up by logit_bias
    (detokenization drops special tokens, so the text would not match the grammar)."""
    tok = llm.get_tokenizer()
    special = sorted({i for i, t in tok.added_tokens_decoder.items() if t.special})
    assert special
    params = [SamplingParams(temperature=0.0 if i == 0 else 1.0, seed=i, max_tokens=40,
                             logit_bias={t: 10.0 for t in special},
                             structured_outputs=StructuredOutputsParams(choice=[literal]))
              for i in range(6)]
    for out in llm.generate(["Say it:"] * 6, params, use_tqdm=False):
        c = out.outputs[0]
        assert c.text == literal and c.finish_reason == "stop", (c.text, c.token_ids)
        assert not set(c.token_ids[:-1]) & set(special), c.token_ids


def test_length_bounded_strings_hold_no_raw_control_characters(llm) -> None:
    """JSON text forbids raw U+0000-U+001F inside a string. With every token that decodes to
    such a character pushed up by logit_bias, strings with minLength / maxLength (a rule of
    their own in the compiled grammar) must still parse."""
    tok = llm.get_tokenizer()
    controls = [i for i in range(len(tok))
                if any(ord(c) < 0x20 for c in tok.decode([i]))]
    assert controls
    schema = {"type": "object", "properties": {
        "b": {"type": "string", "minLength": 2, "maxLength": 10},
        "c": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2}},
        "required": ["b", "c"], "additionalProperties": False}
    params = [SamplingParams(temperature=0.0 if i == 0 else 1.0, seed=i, max_tokens=120,
                             logit_bias={t: 8.0 for t in controls},
                             structured_outputs=StructuredOutputsParams(json=schema))
              for i in range(8)]
    outs = llm.generate(["Give me the data:"] * 8, params, use_tqdm=False)
    for out in outs:
        assert out.outputs[0].finish_reason == "stop"
        jsonschema.validate(json.loads(out.outputs[0].text), schema)


def test_a_grammar_under_reasoning_tags_applies_after_the_reasoning(llm) -> None:
    """reasoning_tags (the server's --reasoning-parser): the output is free until its end tag,
    then follows the grammar; a prompt whose last tag is the end tag is constrained at once.
    The end tag is made the likeliest token by logit_bias, so the reasoning ends at once."""
    tok = llm.get_tokenizer()
    start, end = tok.convert_tokens_to_ids("y"), tok.convert_tokens_to_ids("z")
    spec = StructuredOutputsParams(choice=CHOICES, reasoning_tags=(start, end))
    params = SamplingParams(max_tokens=40, structured_outputs=spec, logit_bias={end: 100.0})
    opened, closed = llm.generate([{"prompt_token_ids": [5, 6, start]},
                                   {"prompt_token_ids": [5, start, 6, end]}], params,
                                  use_tqdm=False)
    assert opened.outputs[0].token_ids[0] == end  # free: the biased end tag first
    answer = tok.decode(opened.outputs[0].token_ids[1:], skip_special_tokens=True)
    assert answer in CHOICES and opened.outputs[0].finish_reason == "stop"
    assert closed.outputs[0].text in CHOICES and end not in closed.outputs[0].token_ids
    free = SamplingParams(max_tokens=5, ignore_eos=True, structured_outputs=spec,
                          logit_bias={start: 100.0})  # the reasoning never ends
    out = llm.generate([{"prompt_token_ids": [5, 6, start]}], free, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == [start] * 5  # no grammar would allow these


def test_output_keys_follow_each_schemas_own_order(llm) -> None:
    """Two schemas that differ only in the order of their properties each get their own key
    order (the compiled-grammar cache keys on the schema as given, not sorted)."""
    def schema(names):
        return {"type": "object", "properties": {n: {"type": "boolean"} for n in names},
                "required": list(names), "additionalProperties": False}

    for names in (["zeta", "alpha"], ["alpha", "zeta"]):
        params = SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=
                                StructuredOutputsParams(json=schema(names)))
        (out,) = llm.generate(["Give me the data:"], params, use_tqdm=False)
        assert list(json.loads(out.outputs[0].text)) == names


@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    {"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}},
    {"type": "object", "properties": {"s": {"type": "string", "pattern": "[a-z]+",
                                            "maxLength": 3}}},
    {"type": "string", "format": "email", "maxLength": 8},
    {"type": "number", "multipleOf": 3},
    {"type": "string", "format": "no-such-format"},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
     "allOf": [{"required": ["a"]}]},
    {"allOf": [{"type": "string"}, {"type": "integer"}]},
    {"type": "integer", "not": {"enum": [1, 2]}},
    {"type": "integer", "if": {"minimum": 2}, "then": {"maximum": 5}},
    {"anyOf": []},
    {"type": "string", "maxLength": -1},
    {"type": "object", "properties": {"a": {"type": "integer"}},
     "dependentRequired": {"a": ["b"]}},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
     "dependencies": {"a": ["b"]}},
    {"type": "object", "required": ["name"]},
    # xgrammar keeps an anyOf's / oneOf's branches alone: the type, properties and bounds beside
    # them are lost (checked: the first allowed "x" and 5, the second -3).
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
     "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
    {"type": "integer", "minimum": 0, "oneOf": [{"maximum": 5}, {"minimum": 10}]},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True,
     "required": ["a", "b"]},
    # xgrammar compiles a oneOf as an anyOf: branches that may overlap (an integer is a number;
    # two objects any of which may lack the other's property; ranges that meet) could both match.
    {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    {"oneOf": [{"type": "null"}, {"type": "null"}]},
    {"oneOf": [{"type": "integer", "maximum": 5}, {"type": "integer", "minimum": 3}]},
    {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
               {"type": "object", "properties": {"b": {"type": "integer"}}}]},
    {"oneOf": [{"enum": [1, "x"]}, {"const": 1.0}]},
], ids=["uniqueItems", "contains", "pattern+maxLength", "format+maxLength", "multipleOf",
        "unknown-format", "allOf-beside", "allOf-two", "not", "if-then", "empty-anyOf",
        "negative-maxLength", "dependentRequired", "dependencies",
        "required-undeclared", "anyOf-beside", "oneOf-beside", "required-open-object",
        "oneOf-integer-number", "oneOf-twice-null", "oneOf-ranges-meet", "oneOf-open-objects",
        "oneOf-equal-values"])
def test_schema_keywords_the_grammar_cannot_enforce_are_refused(llm, schema) -> None:
    """xgrammar compiles these and ignores the keyword (outputs broke it): refused, naming it,
    as vLLM's xgrammar backend refuses them."""
    params = SamplingParams(structured_outputs=StructuredOutputsParams(json=schema))
    with pytest.raises(ValueError, match="cannot be enforced"):
        llm.generate(["x"], params, use_tqdm=False)
    # The same schema as JSON text, nested under another keyword, is refused too.
    nested = {"type": "object", "properties": {"x": {"anyOf": [schema]}}}
    params = SamplingParams(structured_outputs=StructuredOutputsParams(json=json.dumps(nested)))
    with pytest.raises(ValueError, match="cannot be enforced"):
        llm.generate(["x"], params, use_tqdm=False)


def test_vllms_other_options_are_taken(llm) -> None:
    """disable_any_whitespace gives compact JSON (vLLM's xgrammar backend: no optional blanks);
    the options of vLLM's other backends are accepted and change nothing; a structural tag
    without triggers is the request's clear error."""
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                     "maximum": 9},
                                               "b": {"type": "boolean"}},
              "required": ["a", "b"], "additionalProperties": False}
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=40, structured_outputs=
                             StructuredOutputsParams(json=schema, disable_any_whitespace=True,
                                                     disable_fallback=True,
                                                     disable_additional_properties=True,
                                                     whitespace_pattern=r"[ ]?"))
              for i in range(6)]
    outs = llm.generate(["Give me the data:"] * 6, params, use_tqdm=False)
    for o in outs:
        text = o.outputs[0].text
        assert o.outputs[0].finish_reason == "stop", text
        value = json.loads(text)
        assert text == json.dumps(value)  # xgrammar's compact form: ", " and ": " only
    with pytest.raises(ValueError, match="invalid structural_tag: triggers must"):
        llm.generate(["x"], SamplingParams(structured_outputs=StructuredOutputsParams(
            structural_tag='{"structures": []}')), use_tqdm=False)
    with pytest.raises(ValueError, match="disable_any_whitespace must be a bool"):
        StructuredOutputsParams(json=schema, disable_any_whitespace="yes")


def test_schema_shapes_the_grammar_follows_are_accepted() -> None:
    """A lone allOf (pydantic's wrapper of a $ref) beside annotations, and property names or
    data values that look like keywords, are not refused."""
    from cadence.worker.schema_features import unenforced_keyword

    for schema in (
        {"type": "object", "properties": {"x": {"allOf": [{"$ref": "#/$defs/X"}],
                                                "description": "d"}},
         "$defs": {"X": {"type": "integer"}}},
        {"type": "object", "properties": {"not": {"type": "string"}, "if": {"type": "integer"},
                                          "uniqueItems": {"type": "boolean"}}},
        {"enum": [{"not": 1}, {"allOf": []}]},
        {"type": "string", "default": {"anyOf": []}, "maxLength": 0},
        # A type beside branches that all keep to it loses nothing; an OpenAPI discriminator
        # beside a oneOf (pydantic's tagged unions) is an annotation.
        {"type": "object", "anyOf": [{"type": "object", "required": ["a"],
                                      "properties": {"a": {"type": "integer"}}}]},
        {"oneOf": [{"$ref": "#/$defs/A"}], "discriminator": {"propertyName": "k"},
         "$defs": {"A": {"type": "object", "properties": {"k": {"const": "a"}}}}},
        # oneOf branches shown disjoint: pydantic's tagged union (a required property with its
        # own const in each, through $refs), types that never meet, values, integer ranges.
        {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
         "discriminator": {"propertyName": "kind"},
         "$defs": {"Cat": {"type": "object", "required": ["kind", "lives"], "properties": {
             "kind": {"const": "cat", "type": "string"}, "lives": {"type": "integer"}}},
                   "Dog": {"type": "object", "required": ["kind"], "properties": {
                       "kind": {"enum": ["dog", "wolf"]}}}}},
        {"oneOf": [{"type": "string"}, {"type": ["integer", "null"]}, {"type": "boolean"}]},
        {"oneOf": [{"enum": [1, 2]}, {"const": 3}, {"type": "string"}]},
        {"oneOf": [{"type": "integer", "maximum": 2}, {"type": "integer", "exclusiveMinimum": 2}]},
    ):
        assert unenforced_keyword(schema) is None, schema


@pytest.mark.parametrize("pattern", [r"^x(yz+)?Z$", r"((a)?b+)?c", r"[)?](d)?", r"\)?(e+)?",
                                     r"(?:f[0-9]*)?g", r"[^)]?(h)??i",
                                     r"[])?](d)?", r"[^])?]+(e)?"])  # a class's leading ]
def test_counted_optional_groups_match_what_the_pattern_matches(pattern: str) -> None:
    """The rewrite of optional groups changes no match: Python's re agrees on every string
    over the patterns' alphabet up to four characters."""
    import itertools

    from cadence.worker.schema_patterns import optional_groups_counted

    counted = optional_groups_counted(pattern)
    alphabet = "xyzZabcdefghi)?0]"
    for n in range(5):
        for chars in itertools.product(alphabet, repeat=n):
            text = "".join(chars)
            assert bool(re.fullmatch(pattern, text)) == bool(re.fullmatch(counted, text)), text


def test_a_lark_grammar_is_read_as_lark(llm) -> None:
    """A grammar without '::=' rules is Lark (vLLM reads it so); EBNF still works."""
    for grammar in ('start: "yes" | "no"', '?start: item+\nitem: "a" | "b"',
                    'root ::= "yes" | "no"'):
        params = [SamplingParams(temperature=1.0, seed=i, max_tokens=20,
                                 structured_outputs=StructuredOutputsParams(grammar=grammar))
                  for i in range(4)]
        outs = llm.generate(["x"] * 4, params, use_tqdm=False)
        pattern = "[ab]+" if "item" in grammar else "yes|no"
        for o in outs:
            if o.outputs[0].finish_reason == "stop":
                assert re.fullmatch(pattern, o.outputs[0].text), o.outputs[0].text


def test_date_and_ipv4_grammars_take_exactly_the_valid_values() -> None:
    """The compiled schema accepts a date exactly when the calendar has it (leap years by the
    400-year rule) and an IPv4 address exactly when Python's ipaddress takes it."""
    import datetime
    import ipaddress

    from xgrammar.testing import _is_grammar_accept_string as accepts

    from cadence.worker.grammar_compiler import grammar_of

    def grammar(fmt: str):
        return grammar_of(StructuredOutputsParams(json={"type": "string", "format": fmt}))

    day, moment, ip = grammar("date"), grammar("date-time"), grammar("ipv4")
    for year in (1900, 2000, 2023, 2024):
        for month in range(1, 13):
            for d in range(0, 33):
                text = f"{year:04d}-{month:02d}-{d:02d}"
                try:
                    datetime.date(year, month, d)
                    valid = True
                except ValueError:
                    valid = False
                assert accepts(day, json.dumps(text)) == valid, text
                assert accepts(moment, json.dumps(text + "T12:30:00Z")) == valid, text
    for text in ("0.0.0.0", "255.255.255.255", "1.2.3.4", "01.2.3.4", "256.1.1.1", "1.2.3",
                 "1.2.3.04", "10.0.0.255", "1x2.3.4"):
        try:
            ipaddress.IPv4Address(text)
            valid = True
        except ValueError:
            valid = False
        assert accepts(ip, json.dumps(text)) == valid, text


def test_a_huge_one_of_is_decided_without_comparing_every_pair() -> None:
    """Thousands of const branches (a schema the size bound allows) are compared as one set;
    branches that need comparing pair by pair are refused past 128 (the pairs grow with the
    square: 4,000 took 11 s)."""
    from cadence.worker.schema_features import unenforced_keyword

    assert unenforced_keyword({"oneOf": [{"const": i} for i in range(5000)]}) is None
    assert unenforced_keyword({"oneOf": [{"const": i % 4999} for i in range(5000)]})
    ranges = [{"type": "integer", "minimum": 2 * i, "maximum": 2 * i} for i in range(129)]
    assert unenforced_keyword({"oneOf": ranges[:128]}) is None
    assert unenforced_keyword({"oneOf": ranges}) is not None
