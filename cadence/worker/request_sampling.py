"""The runner's per-request sampling state and each step's sampling inputs: seeded generators,
the logits processors' state, the requests that want prompt logprobs."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch

from cadence.profiling import nvtx_range
from cadence.runner_output import AsyncModelRunnerOutput
from cadence.scheduler.output import SchedulerOutput
from cadence.worker.grammar import GrammarState
from cadence.worker.input_batch import InputBatch, StepInputs
from cadence.worker.logits_processors import to_device
from cadence.worker.logits_state import LogitsState, RecordingOutput
from cadence.worker.prompt_logprobs import prompt_chunks, score_prompt
from cadence.worker.sampler import SamplingMetadata, SamplingRows, seed_generator


class RequestSampling:
    def __init__(self, batch: InputBatch, vocab_size: int, device: torch.device,
                 tokenizer_path: str | None = None) -> None:
        self.batch = batch
        self.device = device
        self.generators: dict[str, torch.Generator] = {}  # by request id
        self.logits_state = LogitsState(batch.max_num_reqs, vocab_size, device)
        self.grammar = GrammarState(tokenizer_path, vocab_size, batch.max_num_reqs,
                                    device)  # structured outputs
        self.prompt_logprob_reqs: set[str] = set()  # requests that want prompt logprobs

    def update(self, so: SchedulerOutput, src: list[int], dst: list[int]) -> None:
        """After the batch applied ``so`` and moved rows ``src`` to ``dst``: move the device
        state of penalised rows, forget what left, set up what was (re)admitted."""
        batch, state = self.batch, self.logits_state
        counted = [i for i, d in enumerate(dst) if batch.params[d].has_penalties]
        if counted:
            state.token_counts.move(self._index([src[i] for i in counted]),
                                    self._index([dst[i] for i in counted]))
        live = batch.req_id_to_slot
        for req_id in [r for r in self.generators if r not in live]:
            del self.generators[req_id]
        state.retain(live)
        if self.grammar.active:
            self.grammar.retain(live)
        if self.prompt_logprob_reqs:
            self.prompt_logprob_reqs &= live.keys()
        for new in so.scheduled_new_reqs:
            # NOTE: an id ended in this output may come back in it as a new request (ids are
            # the client's, reused once a request has finished): the batch holds it, so the
            # retains above kept the old one's state. None of it may carry over.
            state.forget(new.req_id)
            self.grammar.forget(new.req_id)
            self.prompt_logprob_reqs.discard(new.req_id)
            params = new.sampling_params
            if params.prompt_logprobs is not None:
                self.prompt_logprob_reqs.add(new.req_id)
            slot = live.get(new.req_id)
            if slot is not None and params.needs_logits_processing:
                state.admit(slot, new.req_id, new.prompt_token_ids, new.output_token_ids, params)
            if slot is not None and params.structured_outputs is not None:
                try:
                    self.grammar.admit(new.req_id, params, new.output_token_ids,
                                       new.prompt_token_ids)
                except Exception as exc:  # the request's grammar, not the engine, is at fault
                    batch.fail(new.req_id, f"structured outputs: {exc}")

    def _index(self, values: list[int]) -> torch.Tensor:
        return to_device(torch.tensor(values, dtype=torch.int64), self.device)

    def metadata(self, inp: StepInputs, last_sampled: torch.Tensor,
                 in_flight: Callable[[], Mapping[str, int]]) -> SamplingMetadata:
        """The sampling inputs of the step's sampling rows (``in_flight()``: the previous
        step's tokens by request, for grammars)."""
        batch = self.batch
        slot_array = inp.slots[inp.sample_rows]
        if slot_array.size and not self.grammar.active and batch.plain_greedy[slot_array].all():
            return SamplingMetadata.greedy()  # what the rows below would build, per row
        slots = slot_array.tolist()
        params = [batch.params[s] for s in slots]
        # Index of the token being sampled among each request's outputs.
        out_index = (batch.num_tokens[slots] - 1 - batch.num_prompt[slots]).tolist()
        generators: dict[int, torch.Generator] = {}
        for row, (slot, p) in enumerate(zip(slots, params)):
            if p.seed is not None and not p.greedy:
                req_id = batch.slot_req_ids[slot]
                gen = self.generators.get(req_id)
                if gen is None:
                    gen = self.generators[req_id] = torch.Generator(device=self.device)
                seed_generator(gen, p.seed, out_index[row])
                generators[row] = gen
        rows = SamplingRows(batch.temperature[slots], batch.top_p[slots], batch.top_k[slots],
                            batch.min_p[slots])
        md = SamplingMetadata.from_rows(params, rows, out_index, generators, device="cpu")
        if self.device.type == "cuda":
            for name in ("temperature", "top_p", "top_k"):
                t = getattr(md, name)
                if t is not None:
                    setattr(md, name, to_device(t, self.device))
            if md.min_p is not None:
                md.min_p = (to_device(md.min_p[0], self.device),
                            to_device(md.min_p[1], self.device))
            if md.tracked is not None:
                md.tracked = (to_device(md.tracked[0], self.device),
                              to_device(md.tracked[1], self.device))
        processed = np.nonzero(batch.processed[slots])[0]
        if processed.size:
            md.processors, bans = self.logits_state.step_inputs(
                processed, [batch.slot_req_ids[slots[r]] for r in processed],
                np.asarray(slots, dtype=np.int64), params, out_index, last_sampled)
            for row, ids in bans.items():
                md.banned_token_ids[row] = md.banned_token_ids.get(row, []) + ids
        if self.grammar.active:
            md.grammar = self.grammar.bitmask(
                [batch.slot_req_ids[s] for s in slots], out_index, in_flight)
        return md

    def after_sampling(self, md: SamplingMetadata, sampled: torch.Tensor) -> None:
        self.logits_state.after_sampling(md.processors, sampled)

    def score_prompts(self, inp: StepInputs, hidden: torch.Tensor,
                      compute_logits: Callable[[torch.Tensor], torch.Tensor]) -> dict:
        """Prompt logprobs of the requests that want them, for this step's prompt chunks."""
        if not self.prompt_logprob_reqs:
            return {}
        with nvtx_range("prompt_logprobs"):
            return {c.req_id: (c.first, score_prompt(hidden, c, compute_logits))
                    for c in prompt_chunks(inp, self.batch)}

    def record_history(self, out: AsyncModelRunnerOutput,
                       inp: StepInputs) -> AsyncModelRunnerOutput:
        """Have the outputs of requests with bad words, thinking budgets or grammars recorded
        once they reach the host."""
        batch = self.batch
        for state in (self.logits_state, self.grammar):
            if not state.active:
                continue
            tracked = []
            for row in inp.sample_rows.tolist():
                req_id = inp.req_ids[row]
                admission = state.wants(req_id)
                if admission is not None:
                    slot = batch.req_id_to_slot[req_id]
                    index = int(batch.num_tokens[slot] - 1 - batch.num_prompt[slot])
                    tracked.append((req_id, index, admission))
            if tracked:
                out = RecordingOutput(out, state, tracked)
        return out
