"""``use_beam_search`` on the OpenAI endpoints (vLLM's): the search runs as a task beside the
response, and its answer reaches the response's collector or frame sink as the engine's
outputs would (a streamed response gets each beam as one chunk, best first)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

from cadence.beam_search import beam_width_problem
from cadence.engine.async_beam_search import beam_search_output
from cadence.engine.output_processor import RequestOutputCollector
from cadence.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams
from cadence.server.protocol import ParamError

if TYPE_CHECKING:
    from cadence.engine.async_llm import AsyncLLM
    from cadence.engine.output_processor import OutputSink
    from cadence.outputs import RequestOutput

__all__ = ["BeamSearches"]


class BeamSearches:
    """The running searches of one serving object, by request id (so that an abort by id
    cancels one)."""

    def __init__(self, engine: AsyncLLM) -> None:
        self.engine = engine
        self._tasks: dict[str, asyncio.Future[None]] = {}

    def check_width(self, width: int) -> None:
        """``n`` beams within --max-logprobs (``beam_width_problem``)."""
        problem = beam_width_problem(width, self.engine.input_processor.max_logprobs)
        if problem is not None:
            raise ParamError("n", f"n: beam search keeps n beams; {problem}")

    def prepare(self, params: SamplingParams, width: int) -> SamplingParams:
        """What the engine checks the prompt against: one sequence, the step's logprobs."""
        return dataclasses.replace(params, n=1, logprobs=2 * width,
                                   output_kind=RequestOutputKind.FINAL_ONLY)

    def launch(
        self, request_id: str, prompt_token_ids: list[int], prompt_text: str | None,
        params: SamplingParams, width: int, length_penalty: float, *, priority: int,
        cache_salt: str | None, sink: OutputSink | None,
    ) -> tuple[OutputSink, asyncio.Future[None]]:
        """Start the search of a checked prompt (``params``: as the engine checked it, its
        ``max_tokens`` resolved); its answer goes to ``sink``, else to a new collector."""
        beam = BeamSearchParams(
            beam_width=width, max_tokens=params.max_tokens or 1, ignore_eos=params.ignore_eos,
            temperature=params.temperature, length_penalty=length_penalty,
            include_stop_str_in_output=params.include_stop_str_in_output)
        # The request's sampling fields (temperature, top_p/k, min_p, seed) choose each step's
        # sampled token; the candidates are the raw logprobs' best.
        step = dataclasses.replace(
            params, n=1, max_tokens=1, min_tokens=0, logprobs=beam.num_candidates,
            detokenize=False, ignore_eos=True, truncate_prompt_tokens=None,
            output_kind=RequestOutputKind.FINAL_ONLY, stream_interval=None)
        collector: OutputSink = sink if sink is not None else RequestOutputCollector(
            RequestOutputKind.FINAL_ONLY, request_id)
        task = asyncio.ensure_future(self._run(
            collector, streamed=sink is not None, engine=self.engine, request_id=request_id,
            prompt_token_ids=prompt_token_ids, prompt_text=prompt_text, params=beam,
            step_params=step, priority=priority, cache_salt=cache_salt,
            skip_special_tokens=params.skip_special_tokens))
        self._tasks[request_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(request_id, None))
        return collector, task

    @staticmethod
    async def _run(collector: OutputSink, streamed: bool, **kwargs: Any) -> None:
        try:
            out = await beam_search_output(**kwargs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed step, a dead engine: the response reports it
            collector.put(exc)
            return
        if not streamed:
            collector.put(out)
            return
        for k, choice in enumerate(out.outputs):  # one chunk a beam, the last one finishes
            collector.put(_one_choice(out, choice, k == len(out.outputs) - 1))

    def cancel(self, request_ids: list[str]) -> list[str]:
        """Cancel the searches among ``request_ids``; the other ids are returned."""
        rest = []
        for request_id in request_ids:
            task = self._tasks.get(request_id)
            if task is None:
                rest.append(request_id)
            elif not task.done():
                task.cancel()
        return rest


def _one_choice(out: RequestOutput, choice: Any, finished: bool) -> RequestOutput:
    return dataclasses.replace(out, outputs=[choice], finished=finished)
