"""Plant realistic bugs one at a time and report which the test suite catches.

    python scripts/mutation_check.py [--only ID[,ID...]] [--gpu] [--list] [--keep]

Each mutation replaces one exact snippet of one source file (it must occur exactly once, so a
refactor that moves the code makes the check fail loudly rather than silently test nothing) in a
copy of the working tree, then runs the tests that should notice it. A mutation is *caught* when
those tests fail. Every mutation must be caught: the script exits 1 otherwise. ``--gpu`` also
runs the ``gpu``-marked tests (on a machine with CUDA); without it the Triton kernels are checked
under Triton's interpreter, as in CPU CI.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    id: str
    what: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    gpu_tests: tuple[str, ...] = ()  # added with --gpu


_BF16_ENGINE = ("tests/engine/test_gpu_engine.py::"
                "test_bf16_greedy_agrees_with_transformers_within_bf16_rounding")

MUTATIONS = [
    Mutation("rmsnorm-eps-kernel", "RMSNorm eps x100 in the Triton kernels",
             "cadence/model/rms_norm_kernels.py",
             "return tl.math.rsqrt(mean + eps)",
             "return tl.math.rsqrt(mean + eps * 100)",
             ("tests/model/test_fused_ops.py",), (_BF16_ENGINE,)),
    Mutation("qk-norm-eps-kernel", "q/k RMSNorm eps x100 in the fused q/k-norm + RoPE kernel",
             "cadence/model/fused_ops.py",
             "rstd = tl.math.rsqrt(ss / HEAD_DIM + eps)[:, None]",
             "rstd = tl.math.rsqrt(ss / HEAD_DIM + eps * 100)[:, None]",
             ("tests/model/test_fused_ops.py",), (_BF16_ENGINE,)),
    Mutation("rmsnorm-eps", "RMSNorm eps x100 in the reference (the CPU path)",
             "cadence/model/fused_ops.py",
             "x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)",
             "x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps * 100)",
             ("tests/model", "tests/engine/test_llm_correctness.py")),
    Mutation("attention-exp-decode", "exp for exp2 in the paged decode attention kernel",
             "cadence/model/triton_decode_kernels.py",
             "\n            p = tl.exp2(s - m_new[:, None])", "\n            p = tl.exp(s - m_new[:, None])",
             ("tests/model/test_triton_attention.py",), (_BF16_ENGINE,)),
    Mutation("attention-exp-varlen", "exp for exp2 in the varlen (prefill) attention kernel",
             "cadence/model/triton_attention_kernels.py",
             "\n        p = tl.exp2(s - m_use[:, None])", "\n        p = tl.exp(s - m_use[:, None])",
             ("tests/model/test_triton_attention.py",), (_BF16_ENGINE,)),
    Mutation("causal-bound", "causal mask off by one (a token cannot see itself)",
             "cadence/model/triton_attention_kernels.py",
             "keep = nmask[None, :] & (offs_n[None, :] <= q_pos[:, None])",
             "keep = nmask[None, :] & (offs_n[None, :] < q_pos[:, None])",
             ("tests/model/test_triton_attention.py",), (_BF16_ENGINE,)),
    Mutation("rope-base", "RoPE base doubled", "cadence/model/rope.py",
             "inv_freq = 1.0 / (params.theta**exponents)",
             "inv_freq = 1.0 / ((2 * params.theta) ** exponents)",
             ("tests/model", "tests/engine/test_llm_correctness.py")),
    Mutation("dropped-residual", "the residual add dropped", "cadence/model/fused_ops.py",
             "    new_residual = residual + x\n", "    new_residual = x\n",
             ("tests/model", "tests/engine/test_llm_correctness.py")),
    Mutation("stale-async-token", "async: the last sampled token read stale from the host",
             "cadence/worker/input_batch.py",
             "use_sampled = (end - 1 >= self.num_known[slots]).astype(np.int32)",
             "use_sampled = (end - 1 > self.num_known[slots]).astype(np.int32)",
             ("tests/engine/test_async_equivalence.py", "tests/worker")),
    Mutation("block-index", "slot mapping: block index off by one at block ends",
             "cadence/worker/input_batch.py",
             "blk = self.block_table[tok_slots, positions // self.block_size]",
             "blk = self.block_table[tok_slots, (positions + 1) // self.block_size]",
             ("tests/worker", "tests/engine/test_llm_correctness.py")),
    Mutation("kv-leak", "freed KV blocks never returned", "cadence/scheduler/block_pool.py",
             "def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:\n",
             "def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:\n"
             "        return\n",
             ("tests/scheduler", "tests/engine/test_stall.py")),
    Mutation("seed-reuse", "seeded sampling reuses one draw at every step",
             "cadence/worker/sampler.py", "def _mix_seed(seed: int, step: int) -> int:\n",
             "def _mix_seed(seed: int, step: int) -> int:\n    step = 0\n",
             ("tests/worker/test_sampler.py", "tests/engine/test_seeded_sampling.py")),
    Mutation("top-p-boundary", "top-p drops the token at the exact nucleus boundary",
             "cadence/worker/sampler.py", "mask = probs_sum <= (1.0 - p).unsqueeze(1)",
             "mask = probs_sum < (1.0 - p).unsqueeze(1)", ("tests/worker/test_sampler.py",)),
    Mutation("priority-victim", "equal priorities: the earlier arrival is preempted",
             "cadence/scheduler/scheduler.py", "return request.priority, request.arrival_time",
             "return request.priority, -request.arrival_time",
             ("tests/scheduler/test_scheduler_resume.py",)),
    Mutation("budget-exact-fit", "a prompt exactly filling the budget waits (no chunking)",
             "cadence/scheduler/scheduler.py",
             "num_new = request.num_tokens - num_hit_tokens\n                if num_new > token_budget:",
             "num_new = request.num_tokens - num_hit_tokens\n                if num_new >= token_budget:",
             ("tests/scheduler/test_scheduler_resume.py",)),
    Mutation("cached-tokens-reset", "a resume overwrites the first admission's cached count",
             "cadence/scheduler/scheduler.py", "if request.num_cached_tokens < 0:",
             "if request.num_cached_tokens <= 0:", ("tests/scheduler/test_scheduler_resume.py",)),
    Mutation("scheduled-time-reset", "a resume overwrites the first scheduled time",
             "cadence/scheduler/scheduler.py", "if request.scheduled_time is None:", "if True:",
             ("tests/scheduler/test_scheduler_resume.py",)),
    Mutation("prefix-queries-prompt", "prefix-cache queries count prompt tokens only",
             "cadence/scheduler/kv_cache_manager.py", "stats.queries += request.num_tokens",
             "stats.queries += request.num_prompt_tokens",
             ("tests/scheduler/test_scheduler_resume.py",)),
    Mutation("resume-misses-outputs", "a resumed request finds only its prompt's blocks",
             "cadence/scheduler/kv_cache_manager.py",
             "max_hit_blocks = (request.num_tokens - 1) // self.block_size",
             "max_hit_blocks = (request.num_prompt_tokens - 1) // self.block_size",
             ("tests/scheduler/test_scheduler_resume.py",)),
    Mutation("prompt-logprobs-cumulative", "cumulative outputs drop the prompt's logprobs",
             "cadence/engine/request_state.py", "if delta and self.prompt_logprobs_sent:",
             "if self.prompt_logprobs_sent:", ("tests/engine/test_output_processor.py",)),
    Mutation("bad-words-spaced", "bad words: a merged spaced form is banned too",
             "cadence/engine/param_checks.py",
             "(spaced[0] != bare[0] and len(spaced) == len(bare))",
             "(spaced[0] != bare[0] or len(spaced) == len(bare))",
             ("tests/engine/test_input_processor.py",)),
    Mutation("detok-min-tokens", "a stop string at the min_tokens-th token counts",
             "cadence/engine/detokenizer.py",
             "if self.min_tokens and len(self.token_ids) <= self.min_tokens:",
             "if self.min_tokens and len(self.token_ids) < self.min_tokens:",
             ("tests/engine/test_detokenizer.py",)),
    Mutation("rank-ties", "a sampled token tied for best gets rank 2",
             "cadence/worker/sampler.py", "ranks = (logprobs > sampled_lp).sum(dim=-1) + 1",
             "ranks = (logprobs >= sampled_lp).sum(dim=-1)", ("tests/worker/test_sampler.py",)),
    Mutation("top-logprobs-extra", "top logprobs rows hold n + 1 entries",
             "cadence/server/serving.py", "is not None else 1 << 30)[:n]",
             "is not None else 1 << 30)[:n + 1]", ("tests/server/test_sampling_fields.py",)),
    Mutation("stream-usage-default", "stream_options without include_usage includes none",
             "cadence/server/protocol.py", "include_usage: bool | None = True",
             "include_usage: bool | None = False", ("tests/server/test_sampling_fields.py",)),
    Mutation("logit-bias-clip", "logit_bias clipped at -50 instead of -100",
             "cadence/server/protocol.py", "bias[tok] = min(100.0, max(-100.0, value))",
             "bias[tok] = min(100.0, max(-50.0, value))", ("tests/server/test_sampling_fields.py",)),
    Mutation("no-token-unflagged", "a row with every token masked is not flagged",
             "cadence/worker/sampler.py",
             'no_token = logits.amax(dim=-1) == float("-inf")',
             'no_token = logits.amax(dim=-1) == float("inf")',
             ("tests/worker/test_sampler.py", "tests/engine/test_structured_outputs.py")),
    Mutation("no-token-appended", "the scheduler appends a masked row's token",
             "cadence/scheduler/scheduler.py",
             "if new_token_ids and new_token_ids[0] == NO_TOKEN:",
             "if new_token_ids and new_token_ids[0] == NO_TOKEN and False:",
             ("tests/engine/test_structured_outputs.py",)),
    Mutation("child-abort", "aborting one child id of an n > 1 request aborts it alone",
             "cadence/engine/output_processor.py",
             "parent = state.parent if state is not None else None",
             "parent = None", ("tests/engine/test_parallel_sampling.py",)),
    Mutation("text-offset-bytes", "text_offset counts each byte token's U+FFFD",
             "cadence/server/serving_completion.py",
             'if decode_ids is not None and (pending or "\\ufffd" in text):',
             "if False:", ("tests/server/test_echo_prompt_logprobs.py",)),
    Mutation("glu-rows", "SwiGLU fused past GLU_MAX_ROWS",
             "cadence/model/skinny_gemm.py", "if rows > GLU_MAX_ROWS:",
             "if rows > GLU_MAX_ROWS + 1:", ("tests/model/test_skinny_gemm.py",)),
    Mutation("moe-decode-bucket", "a step of exactly a bucket's pairs misses its tile",
             "cadence/model/moe.py",
             "    for bucket in _DECODE_BUCKETS[fp8]:\n        if num_pairs <= bucket:",
             "    for bucket in _DECODE_BUCKETS[fp8]:\n        if num_pairs < bucket:",
             ("tests/model/test_moe.py",)),
    Mutation("tool-final-held", "the last piece keeps holding a tag's start",
             "cadence/server/tool_calls.py",
             "keep = 0 if final else tag_prefix_len(text, START)",
             "keep = tag_prefix_len(text, START)", ("tests/server/test_tool_calls.py",)),
    Mutation("tool-invalid-tag", "a call that is not JSON loses its opening tag",
             "cadence/server/tool_calls.py", "content.append(START + body + tag)",
             "content.append(body + tag)", ("tests/server/test_tool_calls.py",)),
    Mutation("reasoning-final-start", "an output that ends on a tag's start loses it",
             "cadence/server/reasoning.py",
             "if START.startswith(stripped) and not final:", "if START.startswith(stripped):",
             ("tests/server/test_reasoning.py",)),
    Mutation("tool-finish-early", "finish_reason tool_calls on every chunk after a call",
             "cadence/server/serving_chat.py",
             "if finish is not None and self.tools is not None and self.tools[c.index].calls:",
             "if self.tools is not None and self.tools[c.index].calls:",
             ("tests/server/test_tool_calls.py",)),
    Mutation("tool-call-index", "each streamed call's index restarts at 0",
             "cadence/server/serving_chat.py",
             "first = len(self.tools[c.index].calls) - len(parsed)",
             "first = 0", ("tests/server/test_tool_calls.py",)),
    Mutation("detokenize-vocab", "/detokenize takes the id equal to the vocabulary size",
             "cadence/server/tokenization.py", "if not 0 <= t < vocab)", "if not 0 <= t <= vocab)",
             ("tests/server/test_tokenization.py",)),
    Mutation("body-limit-declared", "a declared length equal to the limit is 413",
             "cadence/server/request_body.py", "int(declared) > limit:", "int(declared) >= limit:",
             ("tests/server/test_connection_limits.py",)),
    Mutation("body-limit-read", "a body of exactly the limit, as read, is 413",
             "cadence/server/request_body.py", "if len(body) > limit:", "if len(body) >= limit:",
             ("tests/server/test_connection_limits.py",)),
    Mutation("drain-unsent", "aborting an n > 1 request waits for children never sent",
             "cadence/engine/output_processor.py",
             "if parent is None or parent.sent(request_id):", "if True:",
             ("tests/engine/test_output_processor.py",)),
    Mutation("bad-words-resume", "a resumed request's bad-words history starts empty",
             "cadence/worker/logits_state.py", "self._history[req_id] = list(outputs)",
             "self._history[req_id] = []", ("tests/engine/test_logits_processors_engine.py",)),
    Mutation("unseeded-noise", "unseeded rows beside seeded ones get no fresh noise",
             "cadence/worker/sampler.py", "if len(generators) < probs.shape[0]:",
             "if not generators:", ("tests/worker/test_sampler.py",)),
    Mutation("chat-total-tokens", "chat usage.total_tokens leaves out the prompt",
             "cadence/server/serving_chat.py", "total_tokens=prompt_tokens + completion_tokens,",
             "total_tokens=completion_tokens,", ("tests/server/test_app.py",)),
    Mutation("stop-strings-limit", "exactly 64 stop strings are refused",
             "cadence/engine/param_checks.py", "if len(stops) > MAX_STOP_STRINGS:",
             "if len(stops) >= MAX_STOP_STRINGS:", ("tests/engine/test_input_processor.py",)),
    Mutation("detok-min-tokens-flush", "text flushed at exactly min_tokens is checked for stops",
             "cadence/engine/detokenizer.py",
             "if not self.stop or len(self.token_ids) <= self.min_tokens:",
             "if not self.stop or len(self.token_ids) < self.min_tokens:",
             ("tests/engine/test_detokenizer.py",)),
    Mutation("decode-rope-sign", "RoPE in the decode kernel's loads rotates the wrong way",
             "cadence/model/triton_decode_kernels.py",
             "sign = tl.where(offs_d < half, -1.0, 1.0)", "sign = tl.where(offs_d < half, 1.0, -1.0)",
             ("tests/model/test_triton_attention.py",), (_BF16_ENGINE,)),
    Mutation("cache-salt-unmixed", "the cache salt is left out of the first block's hash",
             "cadence/scheduler/block_hash.py",
             "parent = hashes[-1] if hashes else salted_root(request.cache_salt, root_hash)",
             "parent = hashes[-1] if hashes else root_hash",
             ("tests/scheduler/test_block_hash.py", "tests/engine/test_llm_correctness.py")),
    Mutation("truncate-head", "truncate_prompt_tokens keeps the head instead of the tail",
             "cadence/engine/input_processor.py",
             "return token_ids[-k:] if len(token_ids) > k else token_ids",
             "return token_ids[:k] if len(token_ids) > k else token_ids",
             ("tests/engine/test_input_processor.py",)),
    Mutation("as-ids-top", "return_tokens_as_token_ids leaves the top logprobs as text",
             "cadence/server/serving_completion.py",
             "top = {token_text(t, lp, as_ids): clamp_logprob(lp.logprob)",
             "top = {token_text(t, lp): clamp_logprob(lp.logprob)",
             ("tests/server/test_app.py",)),
    Mutation("detokenize-ignored", "detokenize=False still detokenizes",
             "cadence/engine/request_state.py",
             "IncrementalDetokenizer(tokenizer if detokenize else None, request)",
             "IncrementalDetokenizer(tokenizer, request)",
             ("tests/engine/test_llm_correctness.py",)),
    Mutation("request-template-trusted", "a request's chat template is used without trust",
             "cadence/server/serving_chat.py", "if not self.trust_request_chat_template:",
             "if False:", ("tests/server/test_chat_template.py",)),
    Mutation("parallel-calls-ignored", "parallel_tool_calls false keeps every call",
             "cadence/server/serving_chat.py",
             "return calls[:1] if request.parallel_tool_calls is False else calls",
             "return calls", ("tests/server/test_tool_calls.py",)),
    Mutation("live-stats-carry", "the /stats window forgets the gauges from before it",
             "cadence/server/live_stats.py",
             "while len(self._seconds) > 1 and self._seconds[1][0] <= t - self.window_s:",
             "while self._seconds[0][0] <= t - self.window_s:",
             ("tests/server/test_live_stats.py",)),
    Mutation("heap-remove", "removing a waiting request breaks the priority heap",
             "cadence/scheduler/request_queue.py",
             "        self._heap.remove(request)\n        heapq.heapify(self._heap)\n",
             "        self._heap.remove(request)\n", ("tests/scheduler/test_request_queue.py",)),
    Mutation("truncate-minus-one", "truncate_prompt_tokens -1 leaves one token of room",
             "cadence/engine/input_processor.py", "            k = self.max_model_len",
             "            k = self.max_model_len - 1", ("tests/engine/test_input_processor.py",)),
    Mutation("prompt-ids-every-chunk", "streamed completions repeat the prompt ids",
             "cadence/server/serving_completion.py", "                self.prompt_ids_due[k] = False\n",
             "", ("tests/server/test_app.py",)),
    Mutation("chat-prompt-ids-unasked", "streamed chat sends prompt ids unasked",
             "cadence/server/serving_chat.py",
             "if stream is not None and request.return_token_ids:", "if stream is not None:",
             ("tests/server/test_app.py",)),
    Mutation("root-path-prefix", "the root path strips any path that starts with its text",
             "cadence/server/middleware.py", 'if path == root or path.startswith(root + "/"):',
             "if path.startswith(root):", ("tests/server/test_cli_flags.py",)),
    Mutation("prompts-limit", "exactly 1024 prompts are refused",
             "cadence/server/protocol.py", "len(self.prompt) > MAX_PROMPTS_PER_REQUEST",
             "len(self.prompt) >= MAX_PROMPTS_PER_REQUEST", ("tests/server/test_app.py",)),
    Mutation("stop-holdback-shown", "text is held back even when the stop string is shown",
             "cadence/engine/detokenizer.py",
             "if self.stop and not self.include_stop_str_in_output:", "if self.stop:",
             ("tests/engine/test_detokenizer.py",)),
    Mutation("legacy-top-sampled", "legacy top_logprobs leave out a sampled token past the top n",
             "cadence/server/serving_completion.py",
             "top.setdefault(shown, clamp_logprob(sampled.logprob))", "pass",
             ("tests/server/test_echo_prompt_logprobs.py",)),
    Mutation("chat-truncate-bound", "a chat prompt to truncate is refused for its length",
             "cadence/server/serving_chat.py",
             "if request.truncate_prompt_tokens is None else None),",
             "if True else None),", ("tests/server/test_app.py",)),
    Mutation("histogram-le", "a value equal to a bucket bound counts in the next bucket",
             "cadence/metrics.py", "counts[bisect_left(bounds, v)] += 1",
             "counts[sum(b <= v for b in bounds)] += 1", ("tests/test_metrics.py",)),
    Mutation("metrics-shared", "every output shares one live metrics object",
             "cadence/engine/request_state.py",
             "metrics=self.metrics.copy() if finished or self.snapshot_metrics else None,",
             "metrics=self.metrics if finished or self.snapshot_metrics else None,",
             ("tests/engine/test_output_processor.py",)),
    Mutation("offset-five-bytes", "byte tokens that never make a character wait for a fifth",
             "cadence/server/serving_completion.py", "len(pending) >= _MAX_CHAR_TOKENS",
             "len(pending) > _MAX_CHAR_TOKENS", ("tests/server/test_echo_prompt_logprobs.py",)),
    Mutation("n-param-one", "the request_params_n histogram always records 1",
             "cadence/engine/output_processor.py",
             "n_param=state.parent.n if state.parent is not None else 1,", "n_param=1,",
             ("tests/engine/test_output_processor.py",)),
    Mutation("timing-swapped", "the core's queued and scheduled times are swapped",
             "cadence/engine/output_processor.py",
             "state.metrics.queued_time, state.metrics.first_scheduled_time = eco.timing",
             "state.metrics.first_scheduled_time, state.metrics.queued_time = eco.timing",
             ("tests/engine/test_output_processor.py",)),
    Mutation("pending-seventeen", "a byte run that never completes waits a seventeenth token",
             "cadence/engine/detokenizer.py", "if pending >= _MAX_PENDING:",
             "if pending > _MAX_PENDING:", ("tests/engine/test_detokenizer.py",)),
    Mutation("tqdm-inverted", "use_tqdm shows the bar when asked not to",
             "cadence/engine/llm.py", "disable=not use_tqdm", "disable=use_tqdm",
             ("tests/engine/test_llm_chat.py",)),
    Mutation("prompt-special-context", "the prompt's decoding context skips special tokens always",
             "cadence/engine/detokenizer.py",
             'self._prefix = self._decode(self._ids, self._skip) if self._ids else ""',
             'self._prefix = self._decode(self._ids, True) if self._ids else ""',
             ("tests/engine/test_detokenizer.py",)),
    Mutation("skip-special-dropped", "the server ignores skip_special_tokens",
             "cadence/server/protocol.py", "skip_special_tokens=self.skip_special_tokens,",
             "skip_special_tokens=True,", ("tests/server/test_sampling_fields.py",)),
    Mutation("handler-failure-unmarked", "a failed output handler leaves the engine not errored",
             "cadence/engine/async_llm.py",
             "            self._handler_failed = True\n            if not isinstance(exc, EngineDead",
             "            if not isinstance(exc, EngineDead",
             ("tests/engine/test_async_llm.py",)),
    Mutation("handler-cancel-silent", "a cancelled output handler leaves its requests waiting",
             "cadence/engine/async_llm.py",
             'self.output_processor.propagate_error(EngineDeadError("The engine was shut down."))',
             "pass", ("tests/engine/test_async_llm.py",)),
    Mutation("dead-requests-kept", "an engine death leaves every request (each child) registered",
             "cadence/engine/output_processor.py",
             "        self.request_states.clear()\n        self.parents.clear()\n", "",
             ("tests/engine/test_parallel_sampling.py",)),
    Mutation("failed-siblings-run", "a child failing alone leaves its siblings running in the core",
             "cadence/engine/output_processor.py", "self.failed_siblings.append(child_id)",
             "pass", ("tests/engine/test_parallel_sampling.py",)),
    Mutation("usage-after-error", "a streamed completion sends usage after its error frame",
             "cadence/server/serving_completion.py",
             "            elif cs.request.include_usage:\n                yield cs.frames.usage(sum(",
             "            if cs.request.include_usage:\n                yield cs.frames.usage(sum(",
             ("tests/server/test_engine_failure.py",)),
    Mutation("chat-usage-after-error", "a streamed chat sends usage after its error frame",
             "cadence/server/serving_chat.py",
             "            elif cs.request.include_usage:\n                yield cs.frames.usage(cs.",
             "            if cs.request.include_usage:\n                yield cs.frames.usage(cs.",
             ("tests/server/test_engine_failure.py",)),
    Mutation("echo-all-prompt-logprobs", "echo with logprobs turns prompt_logprobs -1 into logprobs",
             "cadence/server/protocol.py",
             "if self.echo and self.logprobs is not None and n != -1:",
             "if self.echo and self.logprobs is not None:",
             ("tests/server/test_echo_prompt_logprobs.py",)),
    Mutation("echo-prompt-logprobs-lower", "echo with logprobs lowers a larger prompt_logprobs",
             "cadence/server/protocol.py", "n = max(n or 0, self.logprobs)", "n = self.logprobs",
             ("tests/server/test_echo_prompt_logprobs.py",)),
    Mutation("prompt-logprobs-untrimmed", "prompt_logprobs show what the echo needed, not the n asked",
             "cadence/server/serving.py",
             "if top is None or lp.rank is None or lp.rank <= top:", "if True:",
             ("tests/server/test_echo_prompt_logprobs.py",)),
    Mutation("interrupt-parent-ids", "an interrupted generate aborts n > 1 requests by parent id",
             "cadence/engine/llm.py",
             "core.abort_requests(self.output_processor.engine_request_ids(pending))",
             "core.abort_requests(pending)", ("tests/engine/test_llm_interrupt.py",)),
    Mutation("chat-salt-dropped", "chat requests lose their cache_salt (shared prefix cache)",
             "cadence/server/serving_chat.py",
             '{"prompt_token_ids": prompt_ids, "cache_salt": request.cache_salt},',
             '{"prompt_token_ids": prompt_ids},', ("tests/server/test_app.py",)),
    Mutation("orphans-left-running", "a departed front end's requests run on in the core",
             "cadence/engine/core_host.py",
             "                if orphans:\n                    client.abort_requests(orphans)\n",
             "", ("tests/server/test_api_servers.py::"
                  "test_a_departed_front_ends_requests_are_aborted_in_the_core",)),
    Mutation("engine-stats-every-front", "every API server records the engine-wide metrics",
             "cadence/server/app.py", "engine_stats=front_end_index in (None, 0),",
             "engine_stats=True,",
             ("tests/server/test_api_servers.py::test_cadence_serve_with_two_api_servers",)),
    Mutation("engine-stats-ignored", "a front end other than 0 records the engine-wide gauges",
             "cadence/metrics.py", "if scheduler_stats is not None and self.engine_stats:",
             "if scheduler_stats is not None:", ("tests/test_metrics.py",)),
]


def _copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns(".git", ".venv*", "__pycache__", ".pytest_cache", "out",
                                    ".whl", "*.egg-info")
    shutil.copytree(ROOT, dest, ignore=ignore, symlinks=True)


def _run(m: Mutation, gpu: bool, keep: bool) -> tuple[bool, float, str]:
    tmp = Path(tempfile.mkdtemp(prefix=f"mutation-{m.id}-"))
    tree = tmp / "tree"
    try:
        _copy_tree(tree)
        path = tree / m.path
        text = path.read_text()
        if text.count(m.old) != 1:
            raise SystemExit(f"{m.id}: the snippet occurs {text.count(m.old)} times in {m.path}; "
                             "update the mutation")
        path.write_text(text.replace(m.old, m.new))
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
               "-m", "gpu or not gpu" if gpu else "not gpu", *m.tests,
               *(m.gpu_tests if gpu else ())]
        paths = [str(tree), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p != str(ROOT))}
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - start
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        if proc.returncode == 5:
            raise SystemExit(f"{m.id}: no test ran ({' '.join(m.tests)})")
        return proc.returncode != 0, seconds, lines[0] if lines else ""
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="comma-separated mutation ids")
    p.add_argument("--gpu", action="store_true", help="also run the gpu-marked tests")
    p.add_argument("--list", action="store_true", help="list the mutations and exit")
    p.add_argument("--keep", action="store_true", help="keep the mutated copies (debugging)")
    ns = p.parse_args()
    chosen = MUTATIONS
    if ns.only:
        wanted = set(ns.only.split(","))
        unknown = wanted - {m.id for m in MUTATIONS}
        if unknown:
            p.error(f"unknown mutation(s): {', '.join(sorted(unknown))}")
        chosen = [m for m in MUTATIONS if m.id in wanted]
    if ns.list:
        for m in chosen:
            print(f"{m.id:20s} {m.what}  ({m.path})")
        return 0
    print("| mutation | what | caught | s | first failure |")
    print("| --- | --- | --- | ---: | --- |")
    missed = 0
    for m in chosen:
        caught, seconds, first = _run(m, ns.gpu, ns.keep)
        missed += not caught
        print(f"| {m.id} | {m.what} | {'yes' if caught else '**NO**'} | {seconds:.0f} | "
              f"{first[:90]} |", flush=True)
    print(f"\n{len(chosen) - missed} of {len(chosen)} caught")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
