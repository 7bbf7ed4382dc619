"""What the front ends (LLM, AsyncLLM, the server) share: their engine core (``connect_core``),
tokenizer and input processing."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cadence.config import REASONING_TAGS
from cadence.engine.core_client import EngineCoreClient, InprocEngineCoreClient
from cadence.engine.core_proc import EngineCoreLike
from cadence.engine.input_processor import InputProcessor
from cadence.engine.prompt_bound import max_chars_per_token
from cadence.user_errors import first_line

if TYPE_CHECKING:
    from cadence.engine.core import EngineCore

logger = logging.getLogger(__name__)


@dataclass
class Frontend:
    tokenizer: Any | None  # a transformers tokenizer, None with skip_tokenizer_init
    input_processor: InputProcessor
    max_model_len: int
    model_name: str


def load_tokenizer(path: str | None) -> Any | None:
    if path is None:
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001 - a broken tokenizer file raises anything
        raise ValueError(
            f"the tokenizer in {path} cannot be loaded: {first_line(exc)}") from None


def reasoning_tag_ids(tokenizer: Any | None, parser: str | None) -> tuple[int, int] | None:
    """The reasoning parser's tags as token ids, where the tokenizer has each as one token
    (what a thinking budget needs); None otherwise."""
    if parser is None or tokenizer is None:
        return None
    vocab = tokenizer.get_vocab()
    start, end = (vocab.get(tag) for tag in REASONING_TAGS[parser])
    return None if start is None or end is None else (start, end)


def load_frontend(core: EngineCore) -> Frontend:
    spec = core.spec
    skip = core.config.model.skip_tokenizer_init or spec.tokenizer_path is None
    if spec.tokenizer_path is None and not core.config.model.skip_tokenizer_init:
        logger.warning("Model %s ships no tokenizer: token-id prompts only (text prompts and "
                       "chat need --tokenizer DIR).", core.config.model.model)
    tokenizer = None if skip else load_tokenizer(spec.tokenizer_path)
    processor = InputProcessor(
        tokenizer,
        vocab_size=core.vocab_size,
        max_model_len=core.max_model_len,
        eos_token_ids=list(spec.eos_token_ids),
        num_kv_blocks=core.num_kv_blocks,
        block_size=core.block_size,
        max_chars_per_token=max_chars_per_token(tokenizer) if tokenizer is not None else None,
        max_logprobs=(core.config.model.max_logprobs if core.config.model.max_logprobs >= 0
                      else core.vocab_size),
        reasoning_tags=reasoning_tag_ids(tokenizer, core.config.model.reasoning_parser),
    )
    return Frontend(tokenizer, processor, core.max_model_len, core.config.model.model)


def connect_core(args: Any, core_factory: Callable[[], EngineCoreLike] | None = None,
                 core_client: Any = None) -> tuple[EngineCoreClient, Any]:
    """A front end's engine core: ``core_client`` (a launcher's, of a core process serving
    several front ends), a core process of its own (``args.engine_process``), or a core thread
    (built from ``args``, or by ``core_factory``); with what the front end reads of the core
    (its model, sizes and checks: the core itself in process, else the facts it reported)."""
    if core_client is not None:
        return core_client, core_client.facts
    if args.engine_process and core_factory is None:
        from cadence.engine.core_process import ProcessEngineCoreClient

        process_client = ProcessEngineCoreClient.spawn(args)
        return process_client, process_client.facts
    if core_factory is None:
        from cadence.engine.core import EngineCore

        def core_factory() -> EngineCoreLike:
            return EngineCore(args)

    inproc = InprocEngineCoreClient(core_factory)
    return inproc, inproc.proc.engine_core
