from __future__ import annotations

import asyncio

from cadence.engine.request_ledger import RequestLedger


def test_an_abort_while_preparing_is_reported_by_the_last_add_only() -> None:
    ledger = RequestLedger()
    ledger.begin_preparing("a")
    ledger.begin_preparing("a")  # the same id added twice at once
    ledger.note_aborts(["a", "b"])  # "b" is not being prepared: not remembered
    assert ledger.aborted_early == {"a"}
    assert ledger.end_preparing("a") is False  # one add of "a" still being prepared
    assert ledger.end_preparing("a") is True
    assert not ledger.preparing and not ledger.aborted_early
    ledger.begin_preparing("c")
    assert ledger.end_preparing("c") is False  # never aborted


def test_draining_ids_release_their_waiters() -> None:
    async def main() -> list[str]:
        ledger = RequestLedger()
        ledger.start_draining(["x", "y"])
        first = ledger.draining_event("x")
        ledger.start_draining(["x"])  # already draining: the same event
        assert ledger.draining_event("x") is first and ledger.draining_event("z") is None
        done: list[str] = []

        async def wait(rid: str) -> None:
            event = ledger.draining_event(rid)
            assert event is not None
            await event.wait()
            done.append(rid)

        tasks = [asyncio.create_task(wait(r)) for r in ("x", "y")]
        await asyncio.sleep(0)
        ledger.stop_draining(["x", "unknown"])
        await tasks[0]
        assert done == ["x"] and ledger.draining_event("x") is None
        ledger.stop_all_draining()
        await tasks[1]
        assert not ledger.draining
        return done

    assert asyncio.run(main()) == ["x", "y"]
