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


def test_generation_requests_under_a_root_path_are_counted_and_refused_when_draining() -> None:
    """Behind a proxy the scope's path carries the root path (/llm/v1/completions): the route
    is still a generation route, counted while it runs and refused (503) once the server
    drains; other routes pass either way."""
    from cadence.server.lifecycle import InFlightMiddleware

    async def main() -> None:
        lifecycle = RequestLifecycle()
        seen: list[tuple[str, int]] = []

        async def app(scope, receive, send) -> None:
            seen.append((scope["path"], lifecycle.in_flight))

        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        def scope(path: str) -> dict:
            return {"type": "http", "method": "POST", "path": path, "root_path": "/llm",
                    "headers": [], "query_string": b""}

        mw = InFlightMiddleware(app, lifecycle)
        await mw(scope("/llm/v1/completions"), receive, send)
        await mw(scope("/llm/v1/chat/completions"), receive, send)
        await mw(scope("/llm/health"), receive, send)
        # Counted while they ran (1 in flight), the health check not at all.
        assert seen == [("/llm/v1/completions", 1), ("/llm/v1/chat/completions", 1),
                        ("/llm/health", 0)]
        assert lifecycle.in_flight == 0 and sent == []
        lifecycle.stop_accepting()
        await mw(scope("/llm/v1/responses"), receive, send)
        assert len(seen) == 3  # not run
        assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 503
        await mw(scope("/llm/health"), receive, send)
        assert seen[-1] == ("/llm/health", 0)

    asyncio.run(main())
