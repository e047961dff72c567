"""The built docs in a real browser: the getting-started and agents pages load every image, script and style they
ask for, and every internal link on them leads to a page that has the anchor it names.

Debian's chromium driven by Playwright, as the widget tests do; the site is served over HTTP on 127.0.0.1 (as
`python3 -m http.server -d docs/_build/html` serves it), and requests that leave the machine are refused, so a
page that needs the network to show itself fails here. Screenshots go to test-artifacts/docs/. Skipped cleanly
without /usr/bin/chromium or playwright.
"""

from __future__ import annotations

import functools
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urldefrag, urlsplit

import pytest

from tests.docs.conftest import ROOT, Build

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"]
ARTIFACTS = ROOT / "test-artifacts" / "docs"
PAGES = ["getting-started.html", "concepts/agents.html"]

pytestmark = [
    pytest.mark.heavy,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no chromium at {CHROMIUM} (apt-get install chromium)"),
]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site(docs_build: Build) -> Iterator[str]:
    assert docs_build.returncode == 0, f"the docs did not build:\n{docs_build.output[-3000:]}"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=docs_build.html))
    thread = threading.Thread(target=server.serve_forever, name="docs-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_the_getting_started_and_agents_pages_have_no_broken_link_and_no_missing_image(site: str):
    sync_api = pytest.importorskip("playwright.sync_api")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            for name in PAGES:
                problems += [f"{name}: {what}" for what in _check_page(browser, site, name)]
        finally:
            browser.close()
    assert not problems, "\n".join(problems)


def _check_page(browser: object, site: str, name: str) -> list[str]:
    """What is broken on the page ``name`` of the site: a request answered >= 400 or failed, an image that did not
    load, an internal link to no page or to a page without the anchor it names."""
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(site) else route.abort())
    problems: list[str] = []
    page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.on("requestfailed", lambda r: problems.append(f"failed {r.url}") if r.url.startswith(site) else None)
    page.goto(site + name, wait_until="load")
    page.screenshot(path=str(ARTIFACTS / f"{Path(name).stem}.png"))
    images = page.eval_on_selector_all("img", "els => els.map(e => [e.src, e.complete && e.naturalWidth > 0])")
    problems += [f"image {src} did not load" for src, ok in images if not ok]
    links = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
    internal = sorted({href for href in links if href.startswith(site)})
    assert len(internal) > 10, (name, internal)  # the navigation and the page's own links at least
    for href in internal:
        url, fragment = urldefrag(href)
        answer = page.request.get(url)
        if answer.status != 200:
            problems.append(f"link {href} answers {answer.status}")
        elif fragment and urlsplit(url).path.endswith(".html") and f'id="{fragment}"' not in answer.text():
            problems.append(f"link {href}: no id {fragment!r} on that page")
    page.close()
    return problems
