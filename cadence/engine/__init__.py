"""The engine: offline ``LLM`` (its step loop ``LLMEngine``), asyncio ``AsyncLLM``, and the engine
core behind both."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["AsyncEngineArgs", "AsyncLLM", "EngineArgs", "EngineDeadError", "LLM", "LLMEngine"]

if TYPE_CHECKING:
    from cadence.engine.async_llm import AsyncLLM
    from cadence.engine.core_proc import EngineDeadError
    from cadence.engine.engine_args import AsyncEngineArgs, EngineArgs
    from cadence.engine.llm import LLM
    from cadence.engine.llm_engine import LLMEngine


def __getattr__(name: str):
    # These pull in torch and transformers; import them only when asked for.
    if name == "AsyncLLM":
        from cadence.engine.async_llm import AsyncLLM

        return AsyncLLM
    if name == "EngineDeadError":
        from cadence.engine.core_proc import EngineDeadError

        return EngineDeadError
    if name == "LLM":
        from cadence.engine.llm import LLM

        return LLM
    if name == "LLMEngine":
        from cadence.engine.llm_engine import LLMEngine

        return LLMEngine
    if name in ("EngineArgs", "AsyncEngineArgs"):
        from cadence.engine import engine_args

        return getattr(engine_args, name)
    raise AttributeError(name)
