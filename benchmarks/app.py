"""Dashboard benchmark: warm page render time on the bundled sample trace.

Issue target: a warm page render (caches filled: the user comes back to a page or
changes nothing that needs a new computation) under 3 s on ``sample_traces/chat.jsonl``.

Two measurements per page:

- **script run** (Streamlit's AppTest, in process): the page's script from start to
  finish, after a first (cold) run filled the caches; best and worst of ``--repeat``;
- **browser** (``--browser``, needs Playwright and Chromium): ``kvtrace app`` on a free
  port, headless Chromium navigates to the page a second time and waits until every
  Vega chart has drawn (a canvas or an SVG) and the run is over.

    python benchmarks/app.py [--repeat 5] [--browser]
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, Report  # noqa: E402

ENTRY = ROOT / "analytics" / "kvtrace" / "app" / "kvtrace_app.py"
#: name -> (page file, url path, Vega charts it draws, navigation label, page title)
PAGES = {"overview": ("views/overview.py", "", 3, "Overview", "Overview"),
         "curves": ("views/curves.py", "curves", 1, "Curves", "Capacity-hit curves"),
         "whatifs": ("views/whatifs.py", "whatifs", 2, "What-ifs", "Tier what-ifs"),
         "sizing": ("views/sizing.py", "sizing", 2, "Sizing", "Tier sizing")}
_DRAWN = ("([n, title]) => document.querySelector('h1') && document.querySelector('h1').innerText.trim() === title "
          "&& document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] canvas, "
          "[data-testid=\"stVegaLiteChart\"] svg.marks').length >= n "
          "&& !document.querySelector('[data-testid=\"stStatusWidgetRunningIcon\"]')")
TARGET_S = 3.0
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def script_runs(repeat: int) -> dict[str, tuple[float, float, float]]:
    """Per page: (cold run, best warm run, worst warm run), seconds."""
    sys.path.insert(0, str(ENTRY.parent))
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ENTRY), default_timeout=300)
    out = {}
    for name, (page, *_) in PAGES.items():
        at.switch_page(page)
        t0 = time.perf_counter()
        at.run()
        cold = time.perf_counter() - t0
        if at.exception:
            raise SystemExit(f"{page}: {at.exception[0].value}")
        warm = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            at.run()
            warm.append(time.perf_counter() - t0)
        out[name] = (cold, min(warm), max(warm))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def browser_runs(repeat: int) -> dict[str, tuple[float, float, float]] | str:
    """Per page, seconds until its charts are drawn: (first load of the URL, best warm
    reload of the URL, best warm switch from another page with the navigation); or why
    there are no figures."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return "Playwright is not installed (pip install -e '.[dev]')"
    exe = os.environ.get("KVTRACE_CHROMIUM") or "/usr/bin/chromium"
    if not os.path.isfile(exe):
        return f"no Chromium at {exe} (apt-get install chromium, or set KVTRACE_CHROMIUM)"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTRACE_APP_")}
    server = subprocess.Popen([sys.executable, "-m", "kvtrace.cli", "app", "--headless", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    url = f"http://localhost:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    return "kvtrace app did not start"
                time.sleep(0.5)
        out = {}
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
            page = b.new_page(viewport={"width": 1500, "height": 1200})
            for name, (_, path, charts, _, title) in PAGES.items():
                loads = []
                for _ in range(1 + repeat):  # full page loads: a new session each time
                    t0 = time.perf_counter()
                    page.goto(f"{url}/{path}")
                    page.wait_for_function(_DRAWN, arg=[charts, title], timeout=120_000)
                    loads.append(time.perf_counter() - t0)
                out[name] = [loads[0], min(loads[1:])]
            switches = {name: [] for name in PAGES}
            for _ in range(repeat):  # one session, pages switched with the sidebar navigation
                for name, (_, _, charts, label, title) in PAGES.items():
                    t0 = time.perf_counter()
                    page.locator('[data-testid="stSidebarNav"]').get_by_text(label, exact=True).click()
                    page.wait_for_function(_DRAWN, arg=[charts, title], timeout=120_000)
                    switches[name].append(time.perf_counter() - t0)
            for name in PAGES:
                out[name].append(min(switches[name]))
            b.close()
        return out
    finally:  # kvtrace app and the Streamlit server it started
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="warm runs per page (default 5)")
    ap.add_argument("--browser", action="store_true", help="also time page loads in headless Chromium")
    args = ap.parse_args(argv)
    argv_text = ["python", "benchmarks/app.py", "--repeat", str(args.repeat)] + (["--browser"] if args.browser else [])
    r = Report("dashboard: warm page render on sample_traces/chat.jsonl", shlex.join(argv_text))
    for name, (cold, best, worst) in script_runs(args.repeat).items():
        r.add(f"{name}: page script, warm (best / worst of {args.repeat}; cold {cold:.2f} s)",
              f"{best:.3f} s / {worst:.3f} s", f"< {TARGET_S:g} s", worst < TARGET_S)
    if args.browser:
        res = browser_runs(args.repeat)
        if isinstance(res, str):
            r.note(f"browser timings skipped: {res}")
        else:
            for name, (first, reload, switch) in res.items():
                r.add(f"{name}: headless Chromium, page switch to charts drawn, warm (best of {args.repeat})",
                      f"{switch:.2f} s", f"< {TARGET_S:g} s", switch < TARGET_S)
                r.add(f"{name}: headless Chromium, full load of the URL (new session) to charts drawn, warm "
                      f"(first {first:.2f} s)", f"{reload:.2f} s")
    r.note("warm = the caches hold this trace and these parameters (st.cache_data / st.cache_resource keyed on "
           "the trace's SHA-256 and the parameters); cold includes reading the trace and the computations")
    return 0 if r.print() else 1


if __name__ == "__main__":
    raise SystemExit(main())
