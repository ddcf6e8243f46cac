"""End to end in a real headless browser: ``kvtrace app`` on a free port, every page
visited in Chromium (Debian's ``chromium`` package, driven by Playwright).

Per page: the Vega charts are drawn (a canvas or an SVG inside each chart), no
Streamlit exception box and no traceback is shown, and a screenshot is saved under
the test's tmp dir. A bad upload shows one error line; a server path outside the data
directory is refused, its content unread. Skips, saying why, only when
Playwright or a Chromium binary is missing (``.ci/run`` installs Chromium with apt).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kvtrace.app import launcher

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: page url path -> Vega charts it draws. A deep link comes first, on the fresh server:
#: it must open inside the app's navigation like any other page.
PAGES = {"curves": 1, "": 3, "whatifs": 2, "sizing": 1, "scenarios": 0}
START_TIMEOUT_S = 90
PAGE_TIMEOUT_MS = 90_000


def _chromium() -> str | None:
    for c in (os.environ.get("KVTRACE_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
              shutil.which("chromium-browser")):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed: pip install -e '.[dev]'")
    exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium browser: install Debian's chromium (apt-get install -y chromium; .ci/run does it) "
                    "or set KVTRACE_CHROMIUM to a Chromium binary")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``kvtrace app --headless --port N`` on the bundled sample; its base URL."""
    port = _free_port()
    logdir = tmp_path_factory.mktemp("server")
    log = open(logdir / "kvtrace-app.log", "wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTRACE_APP_")}
    proc = subprocess.Popen([sys.executable, "-m", "kvtrace.cli", "app", "--headless", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=logdir, env=env, start_new_session=True)
    url = f"http://localhost:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"kvtrace app exited with {proc.returncode}: {(logdir / 'kvtrace-app.log').read_text()}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.read().strip() == b"ok":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"kvtrace app did not answer in {START_TIMEOUT_S} s")
            time.sleep(0.5)
        yield url
    finally:  # the whole session: kvtrace app and the Streamlit server it started
        _stop_group(proc)
        log.close()


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                proc.wait()
                return
            proc.poll()
            time.sleep(0.2)


def _wait_idle(page) -> None:
    """Until the script run is over (Streamlit's running indicator gone)."""
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"] [data-testid=\"stStatusWidgetRunningIcon\"]')"
        " && !document.querySelector('[data-testid=\"stStatusWidgetRunningManIcon\"]')",
        timeout=PAGE_TIMEOUT_MS,
    )


def _choose_sample(page, name: str) -> None:
    """Pick a bundled sample in the sidebar. The dropdown is opened again until the
    option shows: a click landing while the sidebar re-renders opens nothing."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    box = page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').filter(has_text="Sample trace")
    option = page.get_by_role("option", name=name)
    for _ in range(10):
        box.first.click()
        try:
            option.wait_for(timeout=3000)
            break
        except PlaywrightTimeout:  # the dropdown did not open: try again
            _wait_idle(page)
    option.click()
    page.wait_for_function("n => document.querySelector('[data-testid=\"stSidebar\"]').innerText.includes(n)",
                           arg=name, timeout=PAGE_TIMEOUT_MS)
    _wait_idle(page)


def _assert_no_exception(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0, page.locator(
        '[data-testid="stException"]').first.inner_text()
    assert "Traceback" not in page.locator('[data-testid="stApp"]').inner_text()


@pytest.mark.parametrize("path", list(PAGES))
def test_page_renders_in_a_real_browser(browser, server, path, tmp_path):
    page = browser.new_page(viewport={"width": 1500, "height": 2200})
    try:
        page.goto(f"{server}/{path}", timeout=PAGE_TIMEOUT_MS)
        page.wait_for_selector('[data-testid="stApp"]', timeout=PAGE_TIMEOUT_MS)
        page.wait_for_selector("h1", timeout=PAGE_TIMEOUT_MS)
        charts = PAGES[path]
        if charts:
            page.wait_for_function(
                "n => document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] canvas, "
                "[data-testid=\"stVegaLiteChart\"] svg.marks').length >= n",
                arg=charts, timeout=PAGE_TIMEOUT_MS)
        _wait_idle(page)
        page.wait_for_function(  # tables laid out and drawn (their grids are canvases)
            "() => Array.from(document.querySelectorAll('[data-testid=\"stDataFrame\"]'))"
            ".every(d => d.getBoundingClientRect().width > 200 && d.querySelector('canvas'))",
            timeout=PAGE_TIMEOUT_MS)
        page.wait_for_timeout(1000)  # let Vega and the grids finish painting before the screenshot
        _assert_no_exception(page)
        nav = page.locator('[data-testid="stSidebarNav"]').inner_text()
        assert all(t in nav for t in ("Overview", "Curves", "What-ifs", "Sizing", "Scenarios")), nav
        assert page.locator('[data-testid="stVegaLiteChart"]').count() >= charts
        if path == "sizing" and not charts:
            assert "not available" in page.locator('[data-testid="stApp"]').inner_text()
        shot = tmp_path / f"{path or 'overview'}.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
    finally:
        page.close()


def test_scenarios_run_in_a_real_browser(browser, server, tmp_path):
    """The Scenarios page on the mixed sample: the example file runs, the table, the
    prestaging figures and the timeline (one chart, four panels) are drawn."""
    page = browser.new_page(viewport={"width": 1500, "height": 2600})
    try:
        page.goto(f"{server}/scenarios", timeout=PAGE_TIMEOUT_MS)
        page.wait_for_selector("h1", timeout=PAGE_TIMEOUT_MS)
        _wait_idle(page)
        _choose_sample(page, "mixed.parquet")
        page.get_by_role("button", name="Run the scenarios").click()
        page.wait_for_function(
            "() => document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] canvas, "
            "[data-testid=\"stVegaLiteChart\"] svg.marks').length >= 1", timeout=PAGE_TIMEOUT_MS)
        _wait_idle(page)
        page.wait_for_timeout(1000)
        _assert_no_exception(page)
        text = page.locator('[data-testid="stApp"]').inner_text()
        assert "Side by side" in text and "Prestaging" in text and "Timeline" in text, text[:2000]
        assert page.locator('[data-testid="stAlertContainer"]').count() == 0
        assert page.locator('[data-testid="stDataFrame"]').count() >= 3
        page.screenshot(path=str(tmp_path / "scenarios.png"), full_page=True)
    finally:
        page.close()


def test_bad_upload_shows_one_line_in_a_real_browser(browser, server, tmp_path):
    page = browser.new_page(viewport={"width": 1500, "height": 1400})
    try:
        page.goto(server, timeout=PAGE_TIMEOUT_MS)
        page.wait_for_selector('[data-testid="stMetric"]', timeout=PAGE_TIMEOUT_MS)
        page.get_by_text("upload", exact=True).click()
        page.wait_for_selector('[data-testid="stFileUploaderDropzoneInput"]', state="attached",
                               timeout=PAGE_TIMEOUT_MS)
        page.set_input_files('[data-testid="stFileUploaderDropzoneInput"]',
                             files=[{"name": "bad.jsonl", "mimeType": "application/json",
                                     "buffer": b"this is not a trace\n"}])
        alert = page.locator('[data-testid="stAlertContainer"]').filter(has_text="bad.jsonl")
        alert.first.wait_for(timeout=PAGE_TIMEOUT_MS)
        _wait_idle(page)
        _assert_no_exception(page)
        text = alert.first.locator('[data-testid="stMarkdownContainer"]').inner_text().strip()
        assert len(text.splitlines()) == 1 and "bad.jsonl:1" in text, text
        page.screenshot(path=str(tmp_path / "bad_upload.png"), full_page=True)
    finally:
        page.close()


def test_a_path_outside_the_data_directory_is_refused_in_a_real_browser(browser, server, tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("aws_secret_access_key=AKIAIOSFODNN7EXAMPLE\n")
    page = browser.new_page(viewport={"width": 1500, "height": 1400})
    try:
        page.goto(server, timeout=PAGE_TIMEOUT_MS)
        page.wait_for_selector('[data-testid="stMetric"]', timeout=PAGE_TIMEOUT_MS)
        page.get_by_text("server path", exact=True).click()
        box = page.get_by_label("Trace path on the server", exact=True)
        box.wait_for(timeout=PAGE_TIMEOUT_MS)
        assert "Data directory:" in page.locator('[data-testid="stSidebar"]').inner_text()
        box.fill(str(secret))
        box.press("Enter")
        alert = page.locator('[data-testid="stAlertContainer"]').filter(has_text="outside the data directory")
        alert.first.wait_for(timeout=PAGE_TIMEOUT_MS)
        _wait_idle(page)
        _assert_no_exception(page)
        text = alert.first.locator('[data-testid="stMarkdownContainer"]').inner_text().strip()
        assert text.startswith(f"{secret}: outside the data directory") and len(text.splitlines()) == 1, text
        assert "AKIA" not in page.locator('[data-testid="stApp"]').inner_text()
        page.screenshot(path=str(tmp_path / "outside_root.png"), full_page=True)
    finally:
        page.close()


def test_the_app_files_exist():
    assert launcher.APP_ENTRY.is_file()
    assert all((launcher.APP_DIR / "views" / f"{p or 'overview'}.py").is_file() for p in PAGES)
