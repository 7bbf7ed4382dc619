"""The server's count of requests in flight: idle only once the last one ends (the shutdown's
drain waits for that)."""

from __future__ import annotations

import asyncio

from cadence.server.lifecycle import RequestLifecycle


def test_idle_comes_when_the_last_request_ends() -> None:
    async def main() -> None:
        lifecycle = RequestLifecycle()
        assert await lifecycle.wait_idle(None)  # nothing in flight: at once
        first, second = lifecycle.track(), lifecycle.track()
        first.__enter__()
        second.__enter__()
        waiter = asyncio.ensure_future(lifecycle.wait_idle(None))
        first.__exit__(None, None, None)
        await asyncio.sleep(0)  # the waiter runs if idle was set
        assert lifecycle.in_flight == 1 and not waiter.done()
        second.__exit__(None, None, None)
        assert await waiter and lifecycle.in_flight == 0

    asyncio.run(main())
