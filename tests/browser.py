"""Headless Chromium under Selenium for browser tests: Debian's ``chromium`` and
``chromium-driver`` (``.ci/run`` installs them when absent), never a browser that downloads
itself. Where they are missing the tests skip with a reason that says so loudly.

Screenshots go to ``test-artifacts/browser/`` at the repository root (git-ignored), or under
``$CADENCE_TEST_ARTIFACTS``."""

from __future__ import annotations

import base64
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

__all__ = ["ARTIFACTS", "Page", "chromium_page", "missing_browser"]

ARTIFACTS = Path(os.environ.get("CADENCE_TEST_ARTIFACTS",
                                Path(__file__).resolve().parents[1] / "test-artifacts"))
# Every wait on the page is bounded by this (a hang fails with the condition's name).
WAIT_S = 30.0

_BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _binaries() -> tuple[str | None, str | None]:
    browser = next((p for p in map(shutil.which, _BROWSERS) if p), None)
    return browser, shutil.which("chromedriver")


def missing_browser() -> str | None:
    """Why browser tests cannot run here, or None when they can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed (pip install -e '.[test]')"
    browser, driver = _binaries()
    if browser is None or driver is None:
        return ("chromium and chromedriver are not installed "
                "(apt-get install chromium chromium-driver; .ci/run does it)")
    return None


class Page:
    """A Chromium window and what tests do with it: bounded waits, scripts, screenshots."""

    def __init__(self, driver: Any, artifacts: Path) -> None:
        self.driver = driver
        self.artifacts = artifacts

    def wait(self, condition: Callable[[Any], Any], what: str, timeout: float = WAIT_S) -> Any:
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, timeout, poll_frequency=0.02).until(
            condition, f"timed out after {timeout} s waiting for {what}")

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def by_id(self, element_id: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.ID, element_id)

    def text_of(self, element_id: str) -> str:
        """The element's ``textContent`` (whitespace as the page wrote it)."""
        return self.js("return document.getElementById(arguments[0]).textContent;", element_id)

    def screenshot(self, name: str) -> Path:
        """The whole page (beyond the window's height), as ``ARTIFACTS/.../name.png``."""
        self.artifacts.mkdir(parents=True, exist_ok=True)
        path = self.artifacts / f"{name}.png"
        size = self.driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
        shot = self.driver.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"],
                     "scale": 1}})
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def console_errors(self) -> list[str]:
        return [e["message"] for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]

    def fetched_urls(self) -> list[str]:
        """Every URL the page loaded or fetched (the Resource Timing entries)."""
        return self.js("return performance.getEntriesByType('resource').map(e => e.name);")


@contextmanager
def chromium_page(artifacts: Path, width: int = 1280, height: int = 900) -> Iterator[Page]:
    """A headless Chromium window; skips the test (loudly) where there is none."""
    reason = missing_browser()
    if reason is not None:
        warnings.warn(f"BROWSER TESTS NOT RUN: {reason}", stacklevel=3)
        pytest.skip(f"BROWSER TESTS NOT RUN: {reason}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = _binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = browser  # type: ignore[assignment]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-default-apps", "--lang=en-US"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        driver.set_page_load_timeout(WAIT_S)
        driver.set_script_timeout(WAIT_S)
        yield Page(driver, artifacts)
    finally:
        driver.quit()
