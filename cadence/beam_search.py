"""Beam search over the engine (vLLM's ``LLM.beam_search`` and ``use_beam_search``).

Each step asks the engine for one token of every live beam, with the ``2 * beam_width`` most
likely next tokens as logprobs (transformers' candidate count); a candidate ending in the end
token goes to the finished list, the others compete, and the ``beam_width`` best by score
(``beam_score``: the cumulative logprob over the length, prompt included, to the power
``length_penalty``) live on. After ``max_tokens`` steps, or when no beam is left, the best
``beam_width`` of the finished and the live are the answer. Nothing here touches the engine:
``LLM.beam_search`` and the server drive a ``BeamSearch`` per prompt, and the prefix cache makes
each step's prompts (a beam and one more token) cheap to run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from cadence.outputs import Logprob, RequestOutput
from cadence.sampling_params import BeamSearchParams

__all__ = ["BeamSearch", "BeamSearchOutput", "BeamSearchParams", "BeamSearchSequence",
           "beam_score", "beam_width_problem", "check_beam_search_params", "penalized",
           "step_candidates"]


@dataclass
class BeamSearchSequence:
    """A beam: ``tokens`` holds the prompt's and then the generated ones (vLLM's layout);
    ``logprobs`` one candidate dict per generated token."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None  # "stop" (the end token), "length"
    stop_reason: int | None = None  # the end token, where it stopped the beam


@dataclass
class BeamSearchOutput:
    """The ``beam_width`` best sequences of one prompt, best first."""

    sequences: list[BeamSearchSequence]


def beam_score(tokens: Sequence[int], cum_logprob: float, eos_token_id: int | None,
               length_penalty: float = 1.0) -> float:
    """A beam's rank: its cumulative logprob over its length (the prompt counted, a final end
    token not) to the power ``length_penalty`` (transformers' and vLLM's)."""
    length = len(tokens)
    if eos_token_id is not None and tokens and tokens[-1] == eos_token_id:
        length -= 1
    return penalized(cum_logprob, length, length_penalty)


def penalized(cum_logprob: float, length: int, length_penalty: float) -> float:
    """``cum_logprob / max(length, 1) ** length_penalty``, without the float errors of extreme
    penalties: a power past the float range ranks as infinitely long (the score 0), one below
    it as infinitely short (the score's sign times infinity)."""
    try:
        denominator = float(max(length, 1)) ** length_penalty
    except OverflowError:
        denominator = math.inf
    if denominator == 0.0:
        return math.copysign(math.inf, cum_logprob) if cum_logprob else 0.0
    return cum_logprob / denominator


def beam_width_problem(width: int, max_logprobs: int) -> str | None:
    """Why the engine cannot keep ``width`` beams (each step asks 2 x width logprobs, within
    --max-logprobs; -1: no bound), or None."""
    if 0 <= max_logprobs < 2 * width:
        return (f"each step asks 2 x {width} logprobs, past --max-logprobs "
                f"({max_logprobs}); at most {max_logprobs // 2} beams.")
    return None


def check_beam_search_params(params: object, max_logprobs: int) -> None:
    """An offline or async search's ``params`` (ValueError naming them): a
    ``BeamSearchParams`` whose width the engine can keep (``beam_width_problem``)."""
    if not isinstance(params, BeamSearchParams):
        raise ValueError(f"params: a BeamSearchParams, got {type(params).__name__}.")
    problem = beam_width_problem(params.beam_width, max_logprobs)
    if problem is not None:
        raise ValueError(f"beam_width: {problem}")


def step_candidates(output: RequestOutput) -> dict[int, Logprob] | None:
    """A beam's candidates from its one-token step request (None: the step returned none)."""
    logprobs = output.outputs[0].logprobs
    return logprobs[0] if logprobs else None


class BeamSearch:
    """One prompt's search. Per step: ``pending()`` names the beams to extend, the caller runs
    one token of each with ``params.step_params()`` and hands back each beam's candidate dict
    (None where the engine returned none) to ``advance``; ``best()`` at the end."""

    def __init__(self, prompt_token_ids: Sequence[int], params: BeamSearchParams,
                 eos_token_id: int | None, max_model_len: int) -> None:
        self.params = params
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len
        self.prompt_len = len(prompt_token_ids)
        self.beams = [BeamSearchSequence(list(prompt_token_ids))]
        self.completed: list[BeamSearchSequence] = []
        self.steps = 0

    def _score(self, beam: BeamSearchSequence) -> float:
        return beam_score(beam.tokens, beam.cum_logprob, self.eos_token_id,
                          self.params.length_penalty)

    @property
    def done(self) -> bool:
        return not self.beams or self.steps >= self.params.max_tokens

    def pending(self) -> list[BeamSearchSequence]:
        """The beams to extend this step; a beam that fills the context ends ("length")."""
        if self.done:
            return []
        full = [b for b in self.beams if len(b.tokens) >= self.max_model_len]
        if full:
            for beam in full:
                beam.finish_reason = "length"
            self._finish([(self._score(b), b) for b in full])
            self.beams = [b for b in self.beams if len(b.tokens) < self.max_model_len]
        return list(self.beams)

    def _finish(self, done: list[tuple[float, BeamSearchSequence]]) -> None:
        """Add finished sequences, keeping the best ``beam_width`` (no other can be among the
        answer; equal scores keep the earlier)."""
        pool = [(self._score(b), b) for b in self.completed] + done
        width = self.params.beam_width
        if len(pool) > width:
            keep = sorted(range(len(pool)), key=lambda i: (-pool[i][0], i))[:width]
            pool = [pool[i] for i in sorted(keep)]
        self.completed = [b for _, b in pool]

    def advance(self, candidates: Sequence[dict[int, Logprob] | None]) -> None:
        """Each pending beam's candidates (token -> logprob) from this step, in order. Only the
        children that survive are built (a step has up to 2 x width^2 candidates)."""
        beams = self.beams
        assert len(candidates) == len(beams), "one candidate dict per pending beam"
        eos, ignore_eos = self.eos_token_id, self.params.ignore_eos
        penalty, width = self.params.length_penalty, self.params.beam_width
        grown: list[tuple[float, BeamSearchSequence, dict[int, Logprob], int, float]] = []
        ended: list[tuple[float, BeamSearchSequence, dict[int, Logprob], int, float]] = []
        for beam, row in zip(beams, candidates):
            if row is None:
                continue
            n = len(beam.tokens) + 1
            for token_id, lp in row.items():
                cum = beam.cum_logprob + lp.logprob
                # beam_score of the child: a final end token is not counted
                score = penalized(cum, n - (token_id == eos), penalty)
                stops = token_id == eos and not ignore_eos
                (ended if stops else grown).append((score, beam, row, token_id, cum))
        # NOTE: stable sorts: equal scores keep the beams' order, then the candidates'.
        grown.sort(key=lambda c: -c[0])
        self.beams = [BeamSearchSequence(b.tokens + [t], b.logprobs + [row], cum)
                      for _, b, row, t, cum in grown[:width]]
        if ended:
            ended.sort(key=lambda c: -c[0])
            done = []
            for score, b, row, t, cum in ended[:width]:
                child = BeamSearchSequence(b.tokens + [t], b.logprobs + [row], cum,
                                           finish_reason="stop", stop_reason=t)
                done.append((score, child))
            self._finish(done)
        self.steps += 1

    def best(self) -> list[BeamSearchSequence]:
        """The ``beam_width`` best of the finished and the live beams, best first; a live one
        ends with "length"."""
        for beam in self.beams:
            beam.finish_reason = "length"
        ranked = sorted(self.completed + self.beams, key=self._score, reverse=True)
        return ranked[:self.params.beam_width]

    def generated(self, beam: BeamSearchSequence, keep_end: bool | None = None) -> list[int]:
        """``beam``'s generated tokens as a served answer's token ids hold them (vLLM's
        ``EngineClient.beam_search``): a final end token only with ``keep_end``, by default
        ``include_stop_str_in_output`` (its text never shows it: ``keep_end=False``)."""
        if keep_end is None:
            keep_end = self.params.include_stop_str_in_output
        tokens = beam.tokens[self.prompt_len:]
        if beam.finish_reason == "stop" and not keep_end:
            tokens = tokens[:-1]
        return tokens
