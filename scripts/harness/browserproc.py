"""Debian's Chromium driven by Playwright (scripts/browser-setup installs both), for the browser tests and
the page's scripts: a headless browser, and each page's console errors collected."""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

try:
    from playwright.sync_api import expect  # the tests' retrying assertions

    expect.set_options(timeout=30_000)  # a busy machine: 5 s is Playwright's default
except ImportError:  # require_browser() says how to install it
    expect = None

# Chromium's own network traffic is refused on a closed network, many requests at a time: off
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def require_browser() -> None:
    """Skip without Chromium or Playwright, unless LOCALSPEC_REQUIRE_BROWSER is set (scripts/browser-check)."""
    missing = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "Playwright"
    if chromium_path() is None:
        missing = "Chromium"
    if missing:
        if os.environ.get("LOCALSPEC_REQUIRE_BROWSER"):
            pytest.fail(f"{missing} is missing: run scripts/browser-setup")
        pytest.skip(f"{missing} is missing (scripts/browser-setup installs it)")


@contextlib.contextmanager
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:  # a fresh profile per launch: nothing kept between runs
        browser = p.chromium.launch(executable_path=chromium_path(), args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


class Watched:
    """A page and the errors its console and scripts reported."""

    def __init__(self, context):
        self.page = context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}")
                     if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
