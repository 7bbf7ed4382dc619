"""cadence: a small LLM serving engine built around CUDA graphs and raw CUDA bindings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence.outputs import CompletionOutput, RequestOutput
from cadence.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "AsyncEngineArgs", "AsyncLLM", "BeamSearchParams", "CompletionOutput",
           "EngineArgs", "LLMEngine", "RequestOutput", "RequestOutputKind", "SamplingParams",
           "TextPrompt", "TokensPrompt", "__version__"]

if TYPE_CHECKING:
    from cadence.engine.async_llm import AsyncLLM
    from cadence.engine.engine_args import AsyncEngineArgs, EngineArgs
    from cadence.engine.llm import LLM
    from cadence.engine.llm_engine import LLMEngine
    from cadence.inputs import TextPrompt, TokensPrompt


def __getattr__(name: str):
    # The engine pulls in torch and transformers; import it only when asked for.
    if name == "LLM":
        from cadence.engine.llm import LLM

        return LLM
    if name == "AsyncLLM":
        from cadence.engine.async_llm import AsyncLLM

        return AsyncLLM
    if name in ("LLMEngine", "EngineArgs", "AsyncEngineArgs"):
        from cadence import engine

        return getattr(engine, name)
    if name in ("TextPrompt", "TokensPrompt"):
        from cadence import inputs

        return getattr(inputs, name)
    raise AttributeError(name)
