"""The trace's loads: their sizes, the engine each one gets, and the measured steps' window."""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace

import pytest

import cadence.engine.core as core_mod
from cadence.cli import main as cadence_main
from cadence.core_types import EngineCoreOutput
from cadence.trace import load as load_mod
from cadence.trace.load import Load, make_engine, run_steps


def test_decoders_output_and_context_of_each_load() -> None:
    decode = Load("decode", batch=4, input_len=10, steps=6, warmup_steps=2)
    prefill = Load("prefill", batch=4, input_len=10, steps=6, warmup_steps=2)
    mixed = Load("mixed", batch=4, input_len=10, steps=6, warmup_steps=2)
    assert (decode.decoders, prefill.decoders, mixed.decoders) == (4, 0, 4)
    assert decode.output_len == 2 + 6 + 2
    # Four decoders of 10 prompt + 2 warm-up tokens, 3 more on average over 6 steps: 4 * 15;
    # a prefill step reads its own 10-token prompt.
    assert decode.context_tokens() == 60
    assert prefill.context_tokens() == 10
    assert mixed.context_tokens() == 70


@pytest.mark.parametrize("bad", [dict(kind="bogus"), dict(batch=0), dict(input_len=0),
                                 dict(steps=0), dict(warmup_steps=-1)])
def test_a_bad_load_is_refused(bad: dict) -> None:
    given = dict(kind="decode", batch=1, input_len=1, steps=1, warmup_steps=0) | bad
    with pytest.raises(ValueError):
        Load(**given)


def _args(**kw) -> SimpleNamespace:
    return SimpleNamespace(**({"max_model_len": None, "max_num_batched_tokens": None} | kw))


@pytest.mark.parametrize(("kind", "seqs", "budget"), [
    ("decode", 6, 12000), ("mixed", 6, 12000), ("prefill", 2, 3000)])
def test_each_load_sizes_its_engine(monkeypatch, kind: str, seqs: int, budget: int) -> None:
    monkeypatch.setattr(core_mod, "EngineCore", lambda args: args)
    load = Load(kind, batch=4, input_len=3000, steps=5, warmup_steps=1)
    args = make_engine(_args(), load)
    # Decoders plus two (a finished prompt holds its slot one more step); 3000 + 8 + 16.
    assert args.max_num_seqs == seqs and args.max_model_len == 3024
    assert args.max_num_batched_tokens == budget and args.skip_tokenizer_init
    small = make_engine(_args(max_model_len=100), Load("decode", 2, 5, 3, 0))
    assert small.max_model_len == 100 and small.max_num_batched_tokens == 8192


class _FakeCore:
    """Steps with the given new-token counts per output, then no work."""

    vocab_size = 50

    def __init__(self, steps: list[list[int]]) -> None:
        self.steps = list(steps)
        self.added: list[str] = []

    def add_request(self, req) -> None:
        self.added.append(req.request_id)

    def has_work(self) -> bool:
        return bool(self.steps)

    def step_fn(self):
        counts = self.steps.pop(0)
        outs = [EngineCoreOutput(f"r{i}", list(range(n))) for i, n in enumerate(counts)]
        return SimpleNamespace(outputs=outs), None


def test_the_window_counts_steps_and_new_tokens() -> None:
    marks: list[str] = []

    @contextlib.contextmanager
    def mark(name: str):
        marks.append(name)
        yield

    core = _FakeCore([[1, 1, 0], [2, 2], [1]])
    window = run_steps(core, Load("decode", 3, 4, 5, 0), 5, mark, "m")
    assert (window.steps, window.tokens) == (3, 7) and marks == ["engine_step"] * 3
    core = _FakeCore([[1], [1], [1]])
    window = run_steps(core, Load("mixed", 1, 4, 2, 0), 2, mark, "t")
    assert window.steps == 2 and core.added == ["t-p0-0", "t-p1-0"]


def test_host_time_per_step_is_milliseconds(tmp_path, monkeypatch) -> None:
    """A clock that moves 6 ms between the window's two readings: 2 ms a step over 3 steps."""
    clock = iter(range(0, 6000, 6))

    monkeypatch.setattr(load_mod, "time",
                        SimpleNamespace(perf_counter=lambda: next(clock) / 1000))
    figures = tmp_path / "r.json"
    argv = ["trace", "--model", "tiny", "--device", "cpu", "--input-len", "4", "--batch-size",
            "2", "--steps", "3", "--warmup-steps", "1", "--out", str(tmp_path / "r.html"),
            "--json-out", str(figures)]
    assert cadence_main(argv) == 0
    info = json.loads(figures.read_text())["run"]
    assert info["host_ms_per_step"] == pytest.approx(2.0)
    assert info["context_tokens"] == 2 * (4 + 1 + 1.5)
