"""cadence: a small LLM serving engine built around CUDA graphs and raw CUDA bindings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence.sampling_params import RequestOutputKind, SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "RequestOutputKind", "SamplingParams", "__version__"]

if TYPE_CHECKING:
    from cadence.engine.llm import LLM


def __getattr__(name: str):
    # The engine pulls in torch and transformers; import it only when asked for.
    if name == "LLM":
        from cadence.engine.llm import LLM

        return LLM
    raise AttributeError(name)
