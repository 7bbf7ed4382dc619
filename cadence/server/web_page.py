"""GET /: the browser page (chat playground and live engine view), one self-contained response.

The page's HTML, CSS and JavaScript ship in ``cadence/server/static/``; the stylesheet and the
script are inlined into the HTML once, and a Content-Security-Policy allows exactly those two
(by hash) and requests to this server only: the page can load nothing from elsewhere. The page
holds no data of the server's: what it shows comes from ``/stats`` and ``/v1/*``, which need the
API key when one is set.
"""

from __future__ import annotations

import base64
import hashlib
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["WebPage", "page_bytes"]

_STYLE_MARK = "/*STYLE*/"
_SCRIPT_MARK = "/*SCRIPT*/"


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def page_bytes() -> tuple[bytes, str]:
    """The page, and its Content-Security-Policy."""
    static = resources.files("cadence.server") / "static"
    html = (static / "page.html").read_text(encoding="utf-8")
    style = (static / "page.css").read_text(encoding="utf-8")
    script = (static / "page.js").read_text(encoding="utf-8")
    if html.count(_STYLE_MARK) != 1 or html.count(_SCRIPT_MARK) != 1:
        raise RuntimeError("page.html must hold one style and one script mark")
    html = html.replace(_STYLE_MARK, style).replace(_SCRIPT_MARK, script)
    csp = "; ".join([
        "default-src 'none'",
        f"script-src '{_sha256(script)}'",
        f"style-src '{_sha256(style)}'",
        "connect-src 'self'",
        "img-src data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ])
    return html.encode(), csp


class WebPage:
    """The route's endpoint (``serve``): the page, built on first use."""

    def __init__(self) -> None:
        self._page: tuple[bytes, str] | None = None

    async def serve(self, request: Request) -> Response:
        if self._page is None:
            self._page = page_bytes()
        body, csp = self._page
        return Response(body, media_type="text/html; charset=utf-8", headers={
            "content-security-policy": csp,
            "x-content-type-options": "nosniff",
            "referrer-policy": "no-referrer",
            "cache-control": "no-cache",
        })
