"""The app in a real browser: headless Chromium (Debian's) driven by Playwright."""

from __future__ import annotations

import re
import shutil
import socket
import time
from pathlib import Path

import pytest

from edgespec.apps.ui import Defaults, build_app, start
from edgespec.models.loader import RuntimeOptions

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
COPY_PROMPT = ("Copy this text exactly: The quick brown fox jumps over the lazy dog. "
               "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason="Debian's chromium is not installed (apt-get install chromium)"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def url():
    blocks = build_app(RuntimeOptions(n_ctx=1024), Defaults(target="smollm2-135m", draft="ngram", gamma="3", max_tokens=48))
    yield start(blocks, port=free_port(), block=False)
    blocks.close()


@pytest.fixture(scope="module")
def page(url):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.goto(url)
        yield pg
        browser.close()


def settled(locator, quiet_s: float = 1.5, timeout_s: float = 90) -> str:
    """Text of `locator` once it has stopped changing for `quiet_s` (the stream is over)."""
    deadline = time.perf_counter() + timeout_s
    last, since = None, time.perf_counter()
    while time.perf_counter() < deadline:
        text = locator.inner_text()
        if text != last:
            last, since = text, time.perf_counter()
        elif time.perf_counter() - since >= quiet_s:
            return text
        time.sleep(0.2)
    raise AssertionError(f"still changing after {timeout_s} s: {last!r}")


@pytest.mark.slow
def test_chat_highlights_accepted_drafts_in_the_browser(page, tmp_path):
    page.locator("#es-msg textarea").fill(COPY_PROMPT)
    page.locator("#es-send").click()
    page.wait_for_selector("#es-chatbot .tok-draft", timeout=90_000)
    stats = settled(page.locator("#es-chatbot .es-stats").last)
    shot = tmp_path / "chat.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000

    assert page.locator("#es-chatbot .tok-draft").count() >= 1
    assert page.locator("#es-chatbot .es-out").count() == 1
    assert re.search(r"\d+\.\d tok/s", stats), stats
    assert re.search(r"acceptance \(per drafted token\) \d+% \(\d+/\d+\)", stats), stats
    assert re.search(r"alpha \(per tested token\) \d\.\d\d", stats), stats
    assert "drafter ngram" in stats
    assert page.locator(".es-legend .tok-bonus").is_visible()
    # Target tokens are outlined in the reply just as in the legend.
    outline = "e => getComputedStyle(e).boxShadow"
    assert page.locator("#es-chatbot .tok-target").first.evaluate(outline) != "none"
    assert page.locator(".es-legend .tok-target").evaluate(outline) != "none"
    live = page.locator("#es-live").inner_text()
    assert "acceptance (per drafted token)" in live and "alpha (per tested token)" in live
    # The toggle switches the reply to plain Markdown: no highlight spans left.
    page.get_by_label("Highlight token sources (off: plain Markdown)").uncheck()
    page.wait_for_function("document.querySelectorAll('#es-chatbot .tok-draft').length === 0", timeout=10_000)
    assert "tok/s" in page.locator("#es-chatbot").inner_text()


@pytest.mark.slow
def test_race_tab_shows_three_columns_and_a_chart(page, tmp_path):
    page.get_by_role("tab", name="Race").click()
    # Short runs, and a fixed gamma in column 3 (auto gamma first times the target's passes).
    page.locator("#race-max-tokens input[type=number]").fill("24")
    page.locator("#race-max-tokens input[type=number]").press("Enter")
    page.get_by_label("gamma (number or auto)").nth(2).fill("3")
    page.locator("#race-run").click()
    page.wait_for_function(
        "document.querySelector('#race-status') && document.querySelector('#race-status').innerText.startsWith('Done')",
        timeout=150_000,
    )
    page.wait_for_selector("#race-chart canvas, #race-chart svg", timeout=20_000)
    shot = tmp_path / "race.png"
    page.screenshot(path=str(shot), full_page=True)
    for i in (1, 2, 3):
        col = page.locator(f"#race-col-{i}")
        assert col.locator(".es-out span").count() >= 1
        assert re.search(r"\d+\.\d tok/s", col.inner_text())
    assert "replay those recorded timings in sync" in page.locator("#race-method").inner_text()


def test_models_tab_shows_the_catalog_and_why_a_pair_fails(page, tmp_path):
    page.get_by_role("tab", name="Models").click()
    page.wait_for_selector("#es-catalog table", timeout=10_000)
    assert "qwen2.5-0.5b-instruct" in page.locator("#es-catalog").inner_text()
    draft = page.locator("#es-draft-model input")
    draft.fill("gemma3-270m")
    draft.press("Enter")
    page.get_by_role("button", name="Load and check pair").click()
    page.wait_for_selector("#es-models-status .es-error", timeout=60_000)
    text = page.locator("#es-models-status").inner_text()
    page.screenshot(path=str(tmp_path / "models.png"), full_page=True)
    assert "incompatible pair" in text and "gemma" in text.lower()
