"""Fixtures of the dashboard tests: one ``braid serve`` under a bounded load of all three
protocols (tests/dashboard/load.py), and Debian's Chromium driven by Playwright (no browser
download: ``executable_path`` is the system's ``chromium``)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright

from tests.braid_process import REPO_ROOT, BraidProcess
from tests.dashboard.load import Load

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# The pages' screenshots: docs/images/ when BRAID_SCREENSHOTS=docs asks to refresh the docs'
# pictures, else a temporary directory (a test run must not rewrite tracked files).
SCREENSHOTS = (
    REPO_ROOT / "docs" / "images"
    if os.environ.get("BRAID_SCREENSHOTS") == "docs"
    else Path(tempfile.gettempdir()) / "braid-dashboard-screenshots"
)
GUEST = ("guest", "guest")
# Playwright's own deadline for one wait (a locator, a navigation): generous, since several
# helpers share two cores; the waits poll and end as soon as the condition holds.
WAIT_MS = 60_000
expect.set_options(timeout=WAIT_MS)


def api(braid: BraidProcess, method: str, path: str, body: Any = None, auth=GUEST):
    return requests.request(
        method,
        f"http://127.0.0.1:{braid.http_port}/api/{path}",
        auth=auth,
        data=None if body is None else json.dumps(body),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path_factory.mktemp("dashboard")) as process:
        yield process


@pytest.fixture(scope="module")
def load(braid: BraidProcess) -> Iterator[Load]:
    running = Load(braid).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Dashboard:
    """One logged-in browser tab and what its console said."""

    page: Page
    base: str
    problems: list[str] = field(default_factory=list)

    def open(self, name: str, query: str = "") -> Page:
        """Go to a page of the dashboard and wait until its first poll has been shown."""
        self.page.goto(f"{self.base}/#/{name}{'?' + query if query else ''}")
        self.page.locator(f'main[data-ready="{name}"]').wait_for(timeout=WAIT_MS)
        return self.page

    def screenshot(self, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SCREENSHOTS / f"dashboard-{name}.png"), full_page=True)

    def assert_clean(self) -> None:
        """No console error, no uncaught exception, no error banner."""
        assert self.problems == []
        banner = self.page.locator("#banner.error")
        assert banner.count() == 0 or not banner.is_visible(), banner.inner_text()


def dashboard_of(
    browser: Browser, braid: BraidProcess, user: str, password: str
) -> Iterator[Dashboard]:
    context = browser.new_context(
        # "always": the credentials go with the first request, as a logged-in browser sends
        # them, so no 401 challenge shows in the console.
        http_credentials={"username": user, "password": password, "send": "always"},
        viewport={"width": 1360, "height": 900},
    )
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    dashboard = Dashboard(page, f"http://127.0.0.1:{braid.http_port}")

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            dashboard.problems.append(f"console: {message.text} at {message.location}")

    page.on("console", on_console)
    page.on("pageerror", lambda error: dashboard.problems.append(f"page error: {error}"))
    page.on("dialog", lambda dialog: dialog.accept())  # the "Purge ...?" confirmations
    try:
        yield dashboard
    finally:
        context.close()


@pytest.fixture
def admin(browser: Browser, braid: BraidProcess, load: Load) -> Iterator[Dashboard]:
    yield from dashboard_of(browser, braid, *GUEST)


def repo_path(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))
