"""vLLM's ``POST /start_profile`` and ``POST /stop_profile``: the engine core's torch profiler
(``cadence.torch_profiler``), served only where profiling is on (``CADENCE_TORCH_PROFILER_DIR``
or ``VLLM_TORCH_PROFILER_DIR`` set for the server, as for its engine); behind the API key where
the server has one. A start while running and a stop while not are no-ops (200), as vLLM's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cadence.engine.core_proc import EngineDeadError
from cadence.envs import read_envs
from cadence.server.errors import BadRequestError, InternalServerError
from cadence.server.serving import engine_unavailable

if TYPE_CHECKING:
    from cadence.engine.async_llm import AsyncLLM


def profile_routes(engine: AsyncLLM) -> list[Route]:
    """The two routes, or none where profiling is off."""
    if not read_envs().torch_profiler_dir:
        return []

    async def start(request: Request) -> Response:
        return await _call(engine.start_profile())

    async def stop(request: Request) -> Response:
        return await _call(engine.stop_profile())

    return [Route("/start_profile", start, methods=["POST"]),
            Route("/stop_profile", stop, methods=["POST"])]


async def _call(call) -> Response:  # type: ignore[no-untyped-def]
    try:
        await call
    except EngineDeadError as exc:
        return engine_unavailable(exc).response()
    except RuntimeError as exc:  # profiling off, another profiler, an unusable directory
        return BadRequestError(str(exc)).response()
    except OSError as exc:  # the trace could not be written (a full disk)
        return InternalServerError(str(exc)).response()
    return Response(status_code=200)
