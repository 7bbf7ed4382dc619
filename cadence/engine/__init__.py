"""The engine: offline ``LLM``, asyncio ``AsyncLLM``, and the engine core behind both."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["AsyncLLM", "EngineDeadError", "LLM"]

if TYPE_CHECKING:
    from cadence.engine.async_llm import AsyncLLM
    from cadence.engine.core_proc import EngineDeadError
    from cadence.engine.llm import LLM


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
    raise AttributeError(name)
