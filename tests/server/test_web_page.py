"""The page at / in headless Chromium (tests/browser.py) against a live server over the tiny
model. The engine is gated (tests/gated_core.py) where a test needs an answer to be half-way:
steps are handed out one by one, and the test waits on what the page shows, never on the clock.
Screenshots of each state land in test-artifacts/browser/."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.browser import ARTIFACTS, Page, chromium_page
from tests.gated_core import GatedCore
from tests.server.waiting import metric, scrape, wait_released, wait_until

SHOTS = ARTIFACTS / "browser"

# Counts, from the page's own DOM, each change of an answer's text while the answer streams.
WATCH_ANSWERS = """
window.__answerUpdates = [];
new MutationObserver((records) => {
  for (const r of records) {
    const node = r.target.nodeType === 1 ? r.target : r.target.parentElement;
    const li = node && node.closest('li.assistant');
    if (li && node.closest('.text') && li.dataset.state === 'streaming') {
      window.__answerUpdates.push(li.querySelector('.text').textContent.length);
    }
  }
}).observe(document.getElementById('conversation'),
           {subtree: true, childList: true, characterData: true});
"""


def gated(srv: Any) -> GatedCore:
    return srv.engine.engine_core.proc.engine_core


@pytest.fixture
def page() -> Iterator[Page]:
    with chromium_page(SHOTS) as p:
        yield p


def last_answer_state(page: Page) -> str | None:
    return page.js("const li = document.querySelector('#conversation li.assistant:last-child');"
                   "return li ? li.dataset.state : null;")


def last_answer_text(page: Page) -> str:
    return page.js("return document.querySelector('#conversation li.assistant:last-child "
                   ".text').textContent;")


def set_field(page: Page, element_id: str, value: str) -> None:
    el = page.by_id(element_id)
    el.clear()
    el.send_keys(value)


def open_settings(page: Page) -> None:
    if not page.js("return document.getElementById('settings').open;"):
        page.js("document.querySelector('#settings summary').click();")


def test_chat_streams_stops_and_shows_the_engine(server_factory, page: Page) -> None:
    from selenium.webdriver.common.keys import Keys

    srv = server_factory(core_factory=GatedCore)
    core = gated(srv)
    try:
        page.driver.get(srv.base_url + "/")
        page.wait(lambda d: page.text_of("model-line").startswith("tiny"), "the configuration")
        page.wait(lambda d: page.text_of("stat-running") == "0", "the engine view")
        assert "512" in page.text_of("config")  # max model length of the test's engine
        page.js(WATCH_ANSWERS)
        open_settings(page)
        set_field(page, "temperature", "0")
        set_field(page, "max-tokens", "48")
        page.screenshot("01-idle")

        # An answer streams: each engine step is one token, and the page shows it before the
        # engine may take the next step.
        page.by_id("message").send_keys("Hello there", Keys.ENTER)
        for k in (1, 2):
            core.allow()
            page.wait(lambda d, k=k: len(page.js("return window.__answerUpdates;")) >= k,
                      f"DOM update {k} of the answer")
            assert last_answer_state(page) == "streaming"
        page.wait(lambda d: page.text_of("stat-running") == "1", "one running request shown")
        assert page.by_id("stop-button").is_enabled() and not page.by_id("send").is_enabled()
        page.screenshot("02-streaming")
        core.open()
        page.wait(lambda d: last_answer_state(page) == "done", "the answer to complete")
        updates = page.js("return window.__answerUpdates;")
        assert len(updates) >= 2 and updates == sorted(updates)
        # The streamed text is what the server answers the same conversation without streaming.
        with httpx.Client(base_url=srv.base_url, timeout=30) as http:
            whole = http.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Hello there"}], "temperature": 0,
                "top_p": 1, "max_tokens": 48}).json()
        assert last_answer_text(page) == whole["choices"][0]["message"]["content"]
        page.wait(lambda d: page.text_of("stat-running") == "0", "no running request shown")
        page.screenshot("03-answered")

        # Stop, half-way through a long answer: the server aborts the request.
        core.wait_idle()
        core.close()
        page.by_id("clear").click()
        set_field(page, "max-tokens", "400")
        page.by_id("message").send_keys("Tell me a long story", Keys.ENTER)
        core.allow()
        page.wait(lambda d: last_answer_state(page) == "streaming" and last_answer_text(page),
                  "the long answer's first token")
        page.wait(lambda d: page.text_of("stat-running") == "1", "the long answer running")
        page.screenshot("04-before-stop")
        page.by_id("stop-button").click()
        page.wait(lambda d: last_answer_state(page) == "stopped", "the page to stop")
        core.open()
        with httpx.Client(base_url=srv.base_url, timeout=30) as http:
            wait_until(lambda: metric(scrape(http), "cadence:num_requests_running") == 0,
                       "/metrics to show no running request")
        wait_released(srv.engine)
        stopped_id = list(core.tokens)[-1]
        assert core.tokens[stopped_id] < 400 and stopped_id not in core.finished
        page.wait(lambda d: page.text_of("stat-running") == "0", "the page to show it")
        assert page.by_id("send").is_enabled() and not page.by_id("stop-button").is_enabled()
        page.screenshot("05-stopped")

        assert page.console_errors() == []
        origin = srv.base_url + "/"
        assert all(url.startswith(origin) for url in page.fetched_urls())
    finally:
        core.open()


def test_api_key_root_path_and_narrow_window(server_factory, page: Page) -> None:
    from selenium.webdriver.common.keys import Keys

    srv = server_factory(app_kwargs={"api_key": "s3cret", "root_path": "/llm",
                                     "served_model_name": "house-model"})
    page.driver.set_window_size(390, 844)
    page.driver.get(srv.base_url + "/llm/")
    page.wait(lambda d: page.by_id("key-form").is_displayed(), "the key prompt")
    # Without the key the page shows nothing of the server.
    assert "house-model" not in page.driver.page_source
    assert page.text_of("stat-running") == "\u2013" and page.text_of("config") == ""
    # Keyboard use: the first Tab reaches the skip link, with a visible focus ring; every
    # control has a label.
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(page.driver).send_keys(Keys.TAB).perform()
    assert page.js("return document.activeElement.className;") == "skip"
    assert page.js("return getComputedStyle(document.activeElement).outlineStyle;") != "none"
    unlabelled = page.js("return [...document.querySelectorAll('input, textarea, select')]"
                         ".filter(e => !e.labels || e.labels.length === 0).map(e => e.id);")
    assert unlabelled == []
    page.screenshot("10-needs-key")
    page.by_id("api-key").send_keys("wrong", Keys.ENTER)
    page.wait(lambda d: "refused" in page.text_of("key-status"), "the wrong key refused")
    field = page.by_id("api-key")
    field.clear()
    field.send_keys("s3cret", Keys.ENTER)
    page.wait(lambda d: page.text_of("model-line").startswith("house-model"), "the model name")
    open_settings(page)
    set_field(page, "max-tokens", "8")
    page.by_id("message").send_keys("Hi", Keys.ENTER)
    page.wait(lambda d: last_answer_state(page) == "done", "the answer")
    # Readable at a phone's width: nothing wider than the window.
    assert page.js("return document.documentElement.scrollWidth <= window.innerWidth;")
    page.screenshot("11-narrow-with-key")
    page.driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {
        "features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    page.screenshot("12-narrow-dark")
    errors = page.console_errors()  # the refused key's 401s, nothing else
    assert all("401" in e for e in errors), errors
    assert all(url.startswith(srv.base_url + "/llm/") for url in page.fetched_urls())


def test_token_ids_without_a_tokenizer(server_factory, page: Page) -> None:
    from selenium.webdriver.common.keys import Keys

    srv = server_factory(skip_tokenizer_init=True)
    page.driver.get(srv.base_url + "/")
    page.wait(lambda d: "token ids" in page.text_of("message-label"), "the token-id box")
    open_settings(page)
    set_field(page, "temperature", "0")
    set_field(page, "max-tokens", "12")
    page.by_id("message").send_keys("1, 2 3", Keys.ENTER)
    page.wait(lambda d: last_answer_state(page) == "done", "the completion")
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        whole = http.post("/v1/completions", json={"prompt": [1, 2, 3], "temperature": 0,
                                                   "top_p": 1, "max_tokens": 12}).json()
    ids = [int(t) for t in last_answer_text(page).split()]
    assert ids == whole["choices"][0]["token_ids"]
    page.screenshot("20-token-ids")
    assert page.console_errors() == []

