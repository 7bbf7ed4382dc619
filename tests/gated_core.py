"""An engine core whose steps the test hands out: tests synchronise on steps, never on time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cadence.engine.core import EngineCore
from cadence.engine.engine_args import EngineArgs

# Only a bound to fail instead of hanging when a test forgets to let a step through.
GATE_TIMEOUT_S = 60.0


class GatedCore(EngineCore):
    """The real engine core; every step first waits for a permit (``allow``) unless the gate is
    ``open``. ``steps`` counts the steps that went through the gate, ``tokens`` the tokens each
    request id got from them, ``finished`` the ids whose last output they made, in order."""

    def __init__(self, args: EngineArgs) -> None:
        super().__init__(args)
        self._cond = threading.Condition()
        self._permits = 0
        self._open = False
        self._at_gate = False
        self._idle = True
        self.steps = 0
        self.tokens: dict[str, int] = {}
        self.finished: list[str] = []

    def allow(self, n: int = 1) -> None:
        """Let ``n`` more steps through."""
        with self._cond:
            self._permits += n
            self._cond.notify_all()

    def open(self) -> None:
        """Let every later step through (call it before shutting the engine down)."""
        with self._cond:
            self._open = True
            self._cond.notify_all()

    def close(self) -> None:
        """Hand out steps one by one again; only once the engine is idle (``wait_idle``)."""
        with self._cond:
            assert self._idle, "close the gate only while the engine is idle"
            self._open = False
            self._permits = 0

    def wait_at_gate(self, steps: int | None = None, timeout: float = GATE_TIMEOUT_S) -> None:
        """Wait until every permit was used (and, if given, exactly ``steps`` steps went
        through) and the engine waits at the gate for the next one."""

        def there() -> bool:
            if steps is not None:
                assert self.steps <= steps, f"{self.steps} steps went through, not {steps}"
                if self.steps != steps:
                    return False
            return self._at_gate and self._permits == 0

        with self._cond:
            assert self._cond.wait_for(there, timeout), "the engine never reached the gate"

    def wait_idle(self, timeout: float = GATE_TIMEOUT_S) -> None:
        """Wait until the engine loop found nothing to do (it then blocks on its inputs)."""
        with self._cond:
            assert self._cond.wait_for(lambda: self._idle, timeout), "the engine never idled"

    def has_work(self) -> bool:
        work = super().has_work()
        with self._cond:
            self._idle = not work
            self._cond.notify_all()
        return work

    @property
    def step_fn(self) -> Callable[[], Any]:
        inner = super().step_fn

        def step() -> Any:
            with self._cond:
                self._at_gate = True
                self._cond.notify_all()
                passed = self._cond.wait_for(lambda: self._open or self._permits > 0,
                                             GATE_TIMEOUT_S)
                self._at_gate = False
                if not passed:
                    raise RuntimeError("the test never let this engine step through its gate")
                if not self._open:
                    self._permits -= 1
                self.steps += 1
            result = inner()
            outputs = result[0]
            for out in outputs.outputs if outputs is not None else []:
                self.tokens[out.request_id] = (self.tokens.get(out.request_id, 0)
                                               + len(out.new_token_ids))
                if out.finish_reason is not None:
                    self.finished.append(out.request_id)
            return result

        return step
