"""The engine core's utilities as coroutines with vLLM's names (``AsyncLLM`` has them): each
runs in the core between two steps, in its thread or its process."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from cadence.engine.core_client import EngineCoreClient, InprocEngineCoreClient
from cadence.worker.worker_rpc import check_timeout, decode_result, encode_call

__all__ = ["CoreUtilities"]

T = TypeVar("T")


class CoreUtilities:
    """Mixed into a front end that holds ``engine_core``."""

    engine_core: EngineCoreClient

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget every cached prefix, between two engine steps (vLLM's). False while requests
        hold blocks, unless ``reset_running_requests`` preempts them (they recompute)."""
        return await self.engine_core.call_utility_async("reset_prefix_cache",
                                                         reset_running_requests)

    async def start_profile(self, profile_prefix: str | None = None) -> None:
        """The torch profiler around what the engine core runs next (vLLM's; traces go to
        ``CADENCE_TORCH_PROFILER_DIR``, read where the core starts)."""
        await self.engine_core.call_utility_async("profile", True, profile_prefix)

    async def stop_profile(self) -> str | None:
        """Stop the profiler; the path of the trace the core wrote."""
        return await self.engine_core.call_utility_async("profile", False)

    async def collective_rpc(self, method: str | Callable[..., Any],
                             timeout: float | None = None, args: Sequence[Any] = (),
                             kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """vLLM's: ``method`` on every worker between two steps (``EngineCore.collective_rpc``);
        TimeoutError after ``timeout`` seconds (the call itself runs on in the core)."""
        check_timeout(timeout)
        call_args = (method, tuple(args), dict(kwargs or {}))
        if isinstance(self.engine_core, InprocEngineCoreClient):
            return await _bounded(
                self.engine_core.call_utility_async("collective_rpc", *call_args), timeout)
        return decode_result(await _bounded(self.engine_core.call_utility_async(
            "collective_rpc_encoded", encode_call(*call_args)), timeout))

    async def get_num_free_kv_blocks(self) -> int:
        return await self.engine_core.call_utility_async("num_free_kv_blocks")

    async def call_utility(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await self.engine_core.call_utility_async(method, *args, **kwargs)


async def _bounded(call: Awaitable[T], timeout: float | None) -> T:
    return await (call if timeout is None else asyncio.wait_for(call, timeout))
