"""Waiting on server-side conditions (with a safety bound), and reading /metrics."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TypeVar

import httpx

T = TypeVar("T")


def wait_until(check: Callable[[], T], what: str, timeout: float = 20.0) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus exposition (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def scrape(http: httpx.Client) -> str:
    resp = http.get("/metrics")
    assert resp.status_code == 200
    return resp.text
