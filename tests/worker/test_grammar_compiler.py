"""Grammar compilation off the engine thread: each distinct spec compiles once, on the
compiler's thread; errors come back through the future; the cache is bounded."""

from __future__ import annotations

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
