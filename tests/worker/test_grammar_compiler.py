"""Grammar compilation off the engine thread: each distinct spec compiles once, on the
compiler's thread; errors come back through the future; the cache is bounded."""

from __future__ import annotations

import json
import threading

import pytest

from cadence.sampling_params import StructuredOutputsParams
from cadence.worker import grammar_compiler
from cadence.worker.grammar_compiler import GrammarCompilerService

pytest.importorskip("xgrammar")


@pytest.fixture
def service():
    from cadence.model.tiny import ensure_tiny_model

    svc = GrammarCompilerService(str(ensure_tiny_model()))
    yield svc
    svc.close()


def test_each_spec_compiles_once_on_the_compilers_thread(service, monkeypatch) -> None:
    threads: list[str] = []
    original = GrammarCompilerService._compile

    def spy(self, spec):
        threads.append(threading.current_thread().name)
        return original(self, spec)

    monkeypatch.setattr(GrammarCompilerService, "_compile", spy)
    regex = StructuredOutputsParams(regex="[ab]+")
    first = service.submit(regex)
    again = service.submit(StructuredOutputsParams(regex="[ab]+"))
    other = service.submit(StructuredOutputsParams(choice=["x", "y"]))
    assert first is again
    assert first.result() is service.get(regex)
    other.result()
    assert len(threads) == 2
    assert all(name.startswith("grammar-compile") for name in threads)
    assert threading.current_thread().name not in threads


def test_a_failing_spec_raises_from_its_future(service) -> None:
    fut = service.submit(StructuredOutputsParams(regex="(unclosed"))
    with pytest.raises(ValueError, match="invalid regex"):
        fut.result()


def test_the_cache_is_bounded(service, monkeypatch) -> None:
    monkeypatch.setattr(grammar_compiler, "MAX_CACHED_GRAMMARS", 2)
    specs = [StructuredOutputsParams(choice=[str(i)]) for i in range(3)]
    futures = [service.submit(s) for s in specs]
    for f in futures:
        f.result()
    assert service.submit(specs[2]) is futures[2]
    assert service.submit(specs[0]) is not futures[0]  # evicted, compiled again


def test_not_json_value_finds_what_json_text_cannot_carry() -> None:
    from cadence.worker.grammar_compiler import not_json_value

    assert not_json_value({"type": "number", "enum": [1.5, 2, "a\u00e9"]}) is None
    deep = {"properties": {"a": {"items": [{"maximum": float("-inf")}]}}}
    assert "not finite" in not_json_value(deep)
    assert "not finite" in not_json_value([float("nan")])
    assert "\\ud800" in not_json_value({"pattern": "x\ud800"})
    assert "\\udc00" in not_json_value({"\udc00": 1})  # keys too


def test_a_wordless_grammar_engine_error_still_says_something(monkeypatch) -> None:
    from types import SimpleNamespace

    def refuse(*args):
        raise RuntimeError("")  # as xgrammar raised for some inputs

    fake = SimpleNamespace(Grammar=SimpleNamespace(from_regex=refuse))
    monkeypatch.setattr(grammar_compiler, "xgrammar_module", lambda: fake)
    with pytest.raises(ValueError, match="invalid regex: the grammar engine"):
        grammar_compiler.grammar_of(StructuredOutputsParams(regex="a+"))


# Structural tags (vLLM's structural_tag, xgrammar's format) ---------------------------------
A_INT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _takes(grammar, text: str) -> bool:
    """Whether ``grammar`` takes ``text`` whole (and may end there), over a vocabulary of single
    characters (printable ASCII and newline)."""
    xgr = grammar_compiler.xgrammar_module()
    vocab = [chr(i) for i in range(32, 127)] + ["\n"]
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo(vocab)).compile_grammar(grammar)
    matcher = xgr.GrammarMatcher(compiled)
    return bool(matcher.accept_string(text)) and matcher.is_completed()


def test_the_older_structural_tag_is_the_triggered_tags_it_means() -> None:
    legacy = {"type": "structural_tag", "triggers": ["<f="],
              "structures": [{"begin": "<f=a>", "schema": A_INT, "end": "</f>"},
                             {"begin": "<f=b>", "schema": json.dumps({"type": "string"}),
                              "end": "</f>"}]}
    assert grammar_compiler.structural_tag_of(json.dumps(legacy)) == {
        "type": "structural_tag", "format": {
            "type": "triggered_tags", "triggers": ["<f="], "tags": [
                {"type": "tag", "begin": "<f=a>", "end": "</f>",
                 "content": {"type": "json_schema", "json_schema": A_INT,
                             "max_whitespace_cnt": 4}},
                {"type": "tag", "begin": "<f=b>", "end": "</f>",
                 "content": {"type": "json_schema", "json_schema": {"type": "string"},
                             "max_whitespace_cnt": 4}}]}}


def test_each_json_schema_in_a_structural_tag_is_checked_and_made_exact() -> None:
    dated = {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}}
    tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
        {"type": "const_string", "value": "x"},
        {"type": "tag", "begin": "<d>", "end": "</d>",
         "content": {"type": "json_schema", "json_schema": dated, "max_whitespace_cnt": 1}}]}}
    got = grammar_compiler.structural_tag_of(tag)
    inner = got["format"]["elements"][1]["content"]
    assert inner["max_whitespace_cnt"] == 1  # the tag's own bound is kept
    assert inner["json_schema"]["properties"]["d"].get("pattern")  # the exact date pattern
    assert tag["format"]["elements"][1]["content"]["json_schema"] is dated  # not mutated
    assert "pattern" not in dated["properties"]["d"]
    unenforced = {"type": "structural_tag", "format": {
        "type": "tag", "begin": "<", "end": ">",
        "content": {"type": "json_schema", "json_schema": {"type": "array",
                                                           "uniqueItems": True}}}}
    with pytest.raises(ValueError, match="uniqueItems"):
        grammar_compiler.structural_tag_of(unenforced)


@pytest.mark.parametrize(("tag", "fragment"), [
    ("[1, 2]", "is a JSON object"),
    ({"type": "structural_tag"}, "needs its format"),
    ({"structures": [{"begin": "<a>", "end": "</a>"}], "triggers": ["<a"]}, "structures must"),
    ({"structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}], "triggers": []},
     "triggers must"),
    ({"structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}], "triggers": [""]},
     "triggers must"),
    ('{"format": {"type": "const_string", "value": NaN}}', "not finite"),
])
def test_malformed_structural_tags_say_what_is_wrong(tag, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        grammar_compiler.structural_tag_of(tag)


def test_a_structural_tag_grammar_holds_free_text_and_each_tags_json() -> None:
    legacy = {"triggers": ["<f="], "structures": [
        {"begin": "<f=a>", "schema": A_INT, "end": "</f>"},
        {"begin": "<f=b>", "schema": {"type": "object", "properties": {
            "b": {"type": "string", "maxLength": 3}}, "required": ["b"]}, "end": "</f>"}]}
    grammar = grammar_compiler.grammar_of(StructuredOutputsParams(structural_tag=legacy))
    for text, ok in [
        ('hello <f=a>{"a": 1}</f> bye', True),
        ('<f=b>{"b": "xyz"}</f> and <f=a>{"a": -2}</f>', True),
        ("free text only", True),
        ('hi <f=a>{"a": "x"}</f>', False),  # the schema's type
        ('hi <f=b>{"b": "long"}</f>', False),  # its maxLength
        ('<f=a>{"a":      1}</f>', False),  # a run of whitespace past the bound
        ('<f=c>{"a": 1}</f>', False),  # a trigger that starts no tag
        ('<f=a>{"a": 1}', False),  # a tag left open
    ]:
        assert _takes(grammar, text) is ok, text


def test_an_invalid_structural_tag_is_the_specs_error() -> None:
    bad = {"type": "structural_tag", "format": {"type": "no_such_format"}}
    with pytest.raises(ValueError, match="invalid structural_tag"):
        grammar_compiler.grammar_of(StructuredOutputsParams(structural_tag=bad))
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(structural_tag=bad, regex="a")
    with pytest.raises(ValueError, match="JSON text or a dict"):
        StructuredOutputsParams(structural_tag=["x"])


@pytest.mark.parametrize("fmt", [
    {"type": "token", "token": 999999},
    {"type": "token", "token": "<|im_end|>"},
    {"type": "any_tokens", "exclude_tokens": [1]},
    {"type": "tag", "begin": {"type": "token", "token": 5}, "end": "x",
     "content": {"type": "any_text"}},
    {"type": "token_triggered_tags", "trigger_tokens": [3], "tags": []},
])
def test_formats_that_name_tokens_are_refused(fmt) -> None:
    """Token ids would be checked only when the engine compiles (a 500 past the vocabulary),
    and the special tokens they name are never let through as text here: refused at once."""
    with pytest.raises(ValueError, match="names tokens"):
        grammar_compiler.structural_tag_of({"type": "structural_tag", "format": fmt})


def test_a_structural_tags_schema_text_is_depth_bounded_before_it_parses() -> None:
    deep = "[" * 200 + "]" * 200
    legacy = {"triggers": ["<a"], "structures": [{"begin": "<a>", "schema": deep,
                                                  "end": "</a>"}]}
    with pytest.raises(ValueError, match="nests deeper"):
        grammar_compiler.structural_tag_of(legacy)


def test_every_schema_format_is_checked_and_bounded() -> None:
    def content(node):
        tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<", "end": ">",
                                                    "content": node}}
        return grammar_compiler.structural_tag_of(tag)["format"]["content"]

    # A schema of true (any JSON) gets the whitespace bound; an explicit null too.
    assert content({"type": "json_schema", "json_schema": True})["max_whitespace_cnt"] == 4
    assert content({"type": "json_schema", "json_schema": {},
                    "max_whitespace_cnt": None})["max_whitespace_cnt"] == 4
    # The Qwen XML parameter format's schema is checked as a JSON schema's is.
    with pytest.raises(ValueError, match="unknown string format|format"):
        content({"type": "qwen_xml_parameter",
                 "json_schema": {"type": "string", "format": "foo"}})
    grammar = grammar_compiler.grammar_of(StructuredOutputsParams(structural_tag={
        "format": {"type": "json_schema", "json_schema": True}}))
    assert _takes(grammar, '{"a":    1}') and not _takes(grammar, '{"a":      1}')


def test_a_structural_tags_own_nesting_is_bounded_by_the_spec() -> None:
    deep: dict = {"type": "any_text"}
    for _ in range(80):
        deep = {"type": "optional", "content": deep}
    for given in ({"format": deep}, json.dumps({"format": deep})):
        with pytest.raises(ValueError, match="nests deeper"):
            StructuredOutputsParams(structural_tag=given)


def test_a_choice_grammar_takes_each_choice_literally_without_warnings(capfd) -> None:
    """Every printable ASCII character, blanks and newlines stand for themselves in a choice
    (regex metacharacters included), and the grammar engine is given no escape it warns of."""
    punct = [chr(i) for i in range(32, 127) if not chr(i).isalnum()]
    choices = ["".join(punct), "beta gamma", "a.b", "a+", "x|y", "[z]", "\\d", "tab\there",
               "two\nlines", "q#r~s&t"]
    capfd.readouterr()
    grammar = grammar_compiler.grammar_of(StructuredOutputsParams(choice=choices))
    assert "Warning" not in capfd.readouterr().err
    for choice in choices:
        assert _takes(grammar, choice), choice
    # What the characters would mean as regex syntax is not taken.
    for other in ["axb", "aa", "x", "y", "z", "5", "beta", "a.b ", "tab here", ""]:
        assert not _takes(grammar, other), other


@pytest.mark.parametrize("schema", [
    {"type": "object", "patternProperties": {"^[ab]{2}$": {"type": "integer"}},
     "additionalProperties": False, "minProperties": 1},
    {"type": "object", "propertyNames": {"pattern": "^[ab]{2}$"}},
    {"type": "object", "properties": {"aa": {"type": "integer"}, "ab": {"type": "integer"}}},
    {"type": "object"},
])
def test_no_run_of_blanks_is_longer_than_four(schema) -> None:
    """docs/serving.md: JSON grammars allow at most 4 blanks in a row, between any two tokens
    of the JSON (xgrammar's patternProperties objects allowed 8 after a comma)."""
    grammar = grammar_compiler.grammar_of(StructuredOutputsParams(json=schema))
    from xgrammar.testing import _is_grammar_accept_string as accepts

    for blank in (" ", "\n", "\t"):
        for runs in ((4, 4, 4), (5, 0, 0), (0, 5, 0), (0, 0, 5)):
            before, after, colon = (blank * n for n in runs)
            text = "{" + before + '"aa": 1,' + after + '"ab"' + colon + ": 2}"
            assert accepts(grammar, text) == (max(runs) <= 4), (schema, text)
