"""LLM: offline batched generation (vLLM's ``LLM``)."""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn

from tqdm.auto import tqdm

from cadence.beam_search import (
    BeamSearch,
    BeamSearchOutput,
    BeamSearchParams,
    check_beam_search_params,
    step_candidates,
)
from cadence.chat import content_format, conversation_of, render_conversation
from cadence.chat_options import check_template_options, named_template
from cadence.core_types import EngineCoreRequest
from cadence.engine.engine_args import EngineArgs
from cadence.engine.llm_engine import LLMEngine
from cadence.engine.tokenization_kwargs import TokenizationKwargs
from cadence.inputs import refuse_lora
from cadence.metrics_reader import Metric
from cadence.outputs import RequestOutput
from cadence.sampling_params import RequestOutputKind, SamplingParams

PromptType = str | dict[str, Any]
# vLLM's: a progress bar or not, or the tqdm-like factory that makes it.
UseTqdm = bool | Callable[..., Any]


class LLM:
    """Generate for a list of prompts; returns one ``RequestOutput`` per prompt, in order."""

    def __init__(self, model: str = "tiny", **kwargs: Any) -> None:
        self.args = EngineArgs(model=model, **kwargs)
        self.llm_engine = LLMEngine(self.args)  # vLLM's name for the step loop underneath
        self.engine_core = self.llm_engine.engine_core
        self.frontend = self.llm_engine.frontend
        self.output_processor = self.llm_engine.output_processor
        self._counter = itertools.count()
        self._closed = False

    def shutdown(self) -> None:
        """Wait for the device and free the engine's streams, buffers and graphs; the LLM
        takes no requests after it."""
        self._closed = True
        self.llm_engine.shutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this LLM has been shut down; create a new one to generate.")

    def get_default_sampling_params(self) -> SamplingParams:
        """``SamplingParams()`` with the model's generation-config defaults (vLLM's)."""
        return SamplingParams(**self.engine_core.spec.generation_defaults)

    def get_tokenizer(self) -> Any:
        return self.frontend.tokenizer

    def get_metrics(self) -> list[Metric]:
        """vLLM's: a snapshot of the engine's statistics (``LLMEngine.get_metrics``); needs
        ``LLM(..., disable_log_stats=False)``."""
        return self.llm_engine.get_metrics()

    def start_profile(self, profile_prefix: str | None = None) -> None:
        """The torch profiler around the generation that follows, until ``stop_profile`` (vLLM's;
        traces go to ``CADENCE_TORCH_PROFILER_DIR``)."""
        self._check_open()
        self.llm_engine.start_profile(profile_prefix)

    def stop_profile(self) -> str | None:
        """Stop the profiler; the path of the trace it wrote."""
        self._check_open()
        return self.llm_engine.stop_profile()

    def collective_rpc(self, method: str | Callable[..., Any], timeout: float | None = None,
                       args: Sequence[Any] = (),
                       kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """vLLM's: ``method`` on every worker (``LLMEngine.collective_rpc``)."""
        self._check_open()
        return self.llm_engine.collective_rpc(method, timeout, args, kwargs)

    def apply_model(self, func: Callable[[Any], Any]) -> list[Any]:
        """vLLM's: ``func(model)`` on every worker, e.g. to read or change weights in place."""
        self._check_open()
        return self.llm_engine.apply_model(func)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget every cached prefix (vLLM's ``LLM.reset_prefix_cache``); False if requests
        still hold blocks (none do between ``generate`` calls)."""
        self._check_open()
        return self.engine_core.reset_prefix_cache(reset_running_requests)

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: UseTqdm = True,
        priority: int | Sequence[int] | None = None,
        lora_request: Any = None,
        tokenization_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to the end; one output each, in the prompts' order. ``priority``:
        one value per prompt, or one for all (vLLM's). ``tokenization_kwargs`` (vLLM's, merged
        as its renderer merges them): ``add_special_tokens``, ``do_lower_case``, ``truncation``
        (true: a prompt's last ``max_length`` tokens, or as many as leave room for
        ``max_tokens``), ``max_length`` (the longest prompt taken), ``truncate_prompt_tokens``
        (the sampling parameters' own wins)."""
        self._check_open()
        refuse_lora(lora_request)
        tokenization = TokenizationKwargs.parse(tokenization_kwargs)
        prompts = _prompt_list(prompts, Sequence)
        n = len(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if not isinstance(sampling_params, (SamplingParams, Sequence)) or isinstance(
                sampling_params, (str, bytes)):
            raise ValueError("sampling_params: a SamplingParams or a list of them (one per "
                             f"prompt), got {type(sampling_params).__name__}.")
        params = ([sampling_params] * n if isinstance(sampling_params, SamplingParams)
                  else list(sampling_params))
        if len(params) != n:
            raise ValueError(
                f"sampling_params: got {len(params)} for {n} prompts; pass one or one per prompt."
            )
        if priority is None:
            priorities = [0] * n
        elif isinstance(priority, numbers.Integral) and not isinstance(priority, bool):
            priorities = [int(priority)] * n
        elif isinstance(priority, Sequence) and not isinstance(priority, (str, bytes)):
            priorities = list(priority)
        else:
            raise ValueError(f"priority: an integer or one per prompt, got {priority!r}.")
        if len(priorities) != n:
            raise ValueError(f"priority: got {len(priorities)} values for {n} prompts.")

        # Validate everything before anything is scheduled.
        requests: list[tuple[EngineCoreRequest, str | None]] = []
        for prompt, p, prio in zip(prompts, params, priorities):
            req, text = self.llm_engine.prepare_request(str(next(self._counter)), prompt, p,
                                                        tokenization, priority=prio)
            # Only finished requests are returned: one output each, all choices in it (vLLM).
            req.sampling_params.output_kind = RequestOutputKind.FINAL_ONLY
            requests.append((req, text))
        order = {req.request_id: i for i, (req, _) in enumerate(requests)}
        # Made before any request is in: a factory that fails leaves nothing behind.
        bar = _progress(use_tqdm, total=len(order), desc="Processed prompts")
        try:
            for req, text in requests:
                self.llm_engine.submit(req, text)
        except BaseException:  # leave none of this call's requests behind
            self.llm_engine.abort_request(list(order))
            bar.close()
            raise
        return self._run_engine(order, bar)

    def chat(
        self,
        messages: Sequence[dict[str, Any]] | Sequence[Sequence[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: UseTqdm = True,
        lora_request: Any = None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        *,
        priority: int | Sequence[int] | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """``generate`` for one conversation (a list of message dicts) or a list of them, each
        rendered through ``chat_template`` or the tokenizer's (ChatML without one), as vLLM's
        ``LLM.chat``; one output per conversation, its ``prompt`` the rendered text. The
        parameters up to ``mm_processor_kwargs`` are vLLM's, in its order (that one only None:
        there is no multimodal input here)."""
        self._check_open()
        refuse_lora(lora_request)
        if mm_processor_kwargs:
            raise ValueError("mm_processor_kwargs: multimodal inputs are not supported; pass "
                             "None.")
        tokenizer = self.get_tokenizer()
        if tokenizer is None:
            raise ValueError("messages: chat needs a tokenizer, and this engine has none.")
        problem = check_template_options(chat_template_kwargs, add_generation_prompt,
                                         continue_final_message)
        if problem is not None:
            raise ValueError(problem[1])
        # The template that renders (chat_template_kwargs' where none is given, vLLM's merge)
        # is the one whose content format counts.
        fmt = content_format(chat_template_content_format, tokenizer,
                             chat_template or named_template(chat_template_kwargs), tools)
        one = (isinstance(messages, Sequence) and bool(messages)
               and isinstance(messages[0], Mapping))
        conversations = [messages] if one else messages
        if isinstance(conversations, (str, bytes)) or not isinstance(conversations, Sequence) \
                or not conversations:
            raise ValueError("messages: a conversation (a list of message dicts) or a non-empty "
                             "list of them.")
        prompts: list[PromptType] = []
        for conversation in conversations:
            text = render_conversation(
                tokenizer, conversation_of(conversation, fmt),
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, chat_template=chat_template,
                tools=tools, chat_template_kwargs=chat_template_kwargs,
            )
            self.frontend.input_processor.check_prompt_text(text)
            try:  # the template already holds every special token it wants (BOS included)
                ids = list(tokenizer.encode(text, add_special_tokens=False))
            except (TypeError, UnicodeError) as exc:  # e.g. a lone surrogate
                raise ValueError(f"messages: the text cannot be tokenized ({exc}).") from None
            prompts.append({"prompt": text, "prompt_token_ids": ids})
        # The rendered text is tokenized here: of tokenization_kwargs, truncation and
        # max_length apply (the template chose its special tokens).
        return self.generate(prompts, sampling_params, use_tqdm, priority,
                             tokenization_kwargs=tokenization_kwargs)

    # vLLM's pooling calls: this engine serves generative models only.
    def encode(self, *args: Any, **kwargs: Any) -> NoReturn:
        _no_pooling("encode")

    def embed(self, *args: Any, **kwargs: Any) -> NoReturn:
        _no_pooling("embed")

    def classify(self, *args: Any, **kwargs: Any) -> NoReturn:
        _no_pooling("classify")

    def score(self, *args: Any, **kwargs: Any) -> NoReturn:
        _no_pooling("score")

    def reward(self, *args: Any, **kwargs: Any) -> NoReturn:
        _no_pooling("reward")

    def beam_search(
        self,
        prompts: PromptType | Sequence[PromptType],
        params: BeamSearchParams,
        lora_request: Any = None,
        use_tqdm: UseTqdm = False,
        concurrency_limit: int | None = None,
    ) -> list[BeamSearchOutput]:
        """vLLM's ``LLM.beam_search``: the ``params.beam_width`` best sequences of each prompt
        (``cadence.beam_search``), each with its text (prompt and answer) when there is a
        tokenizer. ``concurrency_limit``: prompts searched at once (all by default)."""
        self._check_open()
        refuse_lora(lora_request)
        processor = self.frontend.input_processor
        check_beam_search_params(params, processor.max_logprobs)
        if concurrency_limit is not None and (
                isinstance(concurrency_limit, bool) or not isinstance(concurrency_limit, int)
                or concurrency_limit < 1):
            raise ValueError(f"concurrency_limit: a positive integer or None, got "
                             f"{concurrency_limit!r}.")
        prompts = _prompt_list(prompts, Iterable)  # any iterable of prompts, as vLLM's
        step_params = params.step_params()
        searches: list[BeamSearch] = []
        for prompt in prompts:  # tokenized and checked once, as generate checks a prompt
            req, _ = processor.process("beam-search", prompt, step_params)
            searches.append(BeamSearch(req.prompt_token_ids, params, processor.eos_token_id,
                                       self.engine_core.config.scheduler.max_model_len))
        limit = concurrency_limit or max(1, len(searches))
        bar = _progress(use_tqdm, total=params.max_tokens * -(-len(searches) // limit),
                        desc="Beam search", unit="step")
        try:
            for start in range(0, len(searches), limit):
                batch = searches[start:start + limit]
                while True:
                    pending = [(s, s.pending()) for s in batch]
                    beams = [b for _, group in pending for b in group]
                    if not beams:
                        break
                    outs = self.generate([{"prompt_token_ids": b.tokens} for b in beams],
                                         step_params, use_tqdm=False)
                    rows = iter(step_candidates(o) for o in outs)
                    for search, group in pending:
                        if group:
                            search.advance([next(rows) for _ in group])
                    bar.update(1)
        finally:
            bar.close()
        tokenizer = self.get_tokenizer()
        results = []
        for search in searches:
            best = search.best()
            if tokenizer is not None:
                for beam in best:  # vLLM's offline text: the prompt's and the answer's
                    beam.text = tokenizer.decode(beam.tokens)
            results.append(BeamSearchOutput(best))
        return results

    def _run_engine(self, order: dict[str, int], bar: Any) -> list[RequestOutput]:
        results: list[RequestOutput | None] = [None] * len(order)
        engine = self.llm_engine
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished and out.request_id in order:
                        results[order[out.request_id]] = out
                        bar.update(1)
        except BaseException:
            # Leave no request behind in the engine if generation is interrupted.
            engine.abort_request([r for r in order if results[order[r]] is None])
            raise
        finally:
            bar.close()
        return [r for r in results if r is not None]


def _prompt_list(prompts: Any, kind: type) -> list[PromptType]:
    """One prompt (vLLM: a flat list of ints is one token prompt) or a ``kind`` of them, as a
    list; a ValueError names anything else."""
    if isinstance(prompts, (str, dict)) or _is_id_list(prompts):
        return [prompts]
    if isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, kind):
        raise ValueError("prompts: a prompt (a string, a list of token ids or a dict) or a "
                         f"list of prompts, got {type(prompts).__name__}.")
    return list(prompts)


def _is_id_list(value: object) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) > 0
            and all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in value))


def _progress(use_tqdm: UseTqdm, **kwargs: Any) -> Any:
    """The progress bar ``use_tqdm`` asks for: tqdm's (hidden when False), or one made by the
    given factory (vLLM's ``use_tqdm=partial(tqdm, ...)``)."""
    if callable(use_tqdm):
        return use_tqdm(dynamic_ncols=True, **kwargs)
    return tqdm(disable=not use_tqdm, dynamic_ncols=True, **kwargs)


def _no_pooling(method: str) -> NoReturn:
    raise ValueError(f"LLM.{method}: pooling (embeddings, classification, scores, rewards) is "
                     "not supported; this engine serves generative models (generate, chat, "
                     "beam_search).")
