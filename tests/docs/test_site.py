"""The documentation site builds strictly and renders in a real browser.

The site is built into a temporary directory with ``mkdocs build --strict``, served by a
small HTTP server that records every request, and loaded in headless Chromium (Debian's
``chromium``, which ``./dev setup`` installs). The rendered DOM must show the expected
headings, and no request may fail: a missing stylesheet, script or page would show up as a
404 here.
"""

from __future__ import annotations

import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
BUILD_TIMEOUT = 180  # seconds; a build takes a few seconds
BROWSER_TIMEOUT = 90


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    # Not --quiet: it hides the warnings that --strict turns into a failure.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = mkdocs_build(ROOT / "mkdocs.yml", out)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}"
    assert "WARNING" not in result.stderr, result.stderr
    return out


class Recorder(http.server.SimpleHTTPRequestHandler):
    """Serves the built site and records (path, status) of every request."""

    requests: list[tuple[str, int]]

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.requests.append((self.path, int(code) if str(code).isdigit() else 0))

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: the test reports what matters


@pytest.fixture
def server(site: Path) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    requests: list[tuple[str, int]] = []
    handler = type("Handler", (Recorder,), {"requests": requests})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", requests
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def render(url: str, profile: Path) -> str:
    """The DOM of ``url`` after Chromium has loaded it (scripts run, assets fetched)."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the documentation browser test needs Debian's 'chromium' "
            "package (`./dev setup` installs it as root; else `sudo apt-get install chromium`)"
        )
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        # Anything but the local server fails at once instead of waiting on the network.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        f"--user-data-dir={profile}",
        "--dump-dom",
        url,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=BROWSER_TIMEOUT)
    assert result.returncode == 0, f"chromium failed ({result.returncode}):\n{result.stderr}"
    return result.stdout


def headings(dom: str) -> list[str]:
    """The text of every h1/h2 in the DOM, tags and permalink anchors removed."""
    found = re.findall(r"<h([12])[^>]*>(.*?)</h\1>", dom, flags=re.S)
    texts = [re.sub(r"<[^>]+>", "", body) for _, body in found]
    return [re.sub(r"\s+", " ", text).replace("¶", "").strip() for text in texts]


def assert_served(requests: list[tuple[str, int]], page: str) -> None:
    paths = [path for path, _ in requests]
    failed = [(path, status) for path, status in requests if not 200 <= status < 400]
    assert not failed, f"requests that failed: {failed}"
    assert page in paths
    # The page was rendered with the theme's assets, not as bare HTML.
    assert any(re.search(r"/assets/stylesheets/main\.[^/]*\.css$", p) for p in paths), paths
    assert any(re.search(r"/assets/javascripts/bundle\.[^/]*\.js$", p) for p in paths), paths


def test_home_page_renders(server: tuple[str, list[tuple[str, int]]], tmp_path: Path) -> None:
    base, requests = server
    dom = render(f"{base}/", tmp_path / "profile")
    shown = headings(dom)
    assert "smartnsq" in shown
    for expected in ("Install", "Where to go next"):
        assert expected in shown, shown
    assert "Quick start" in dom  # the navigation was rendered
    assert_served(requests, "/")


def test_api_page_renders(server: tuple[str, list[tuple[str, int]]], tmp_path: Path) -> None:
    base, requests = server
    dom = render(f"{base}/api/", tmp_path / "profile")
    # mkdocstrings adds labels after the name ("async", "dataclass"): compare the names.
    shown = [heading.split(" ")[0] for heading in headings(dom)]
    for expected in (
        "smartnsq.Consumer",
        "smartnsq.Producer",
        "smartnsq.Message",
        "smartnsq.run",
        "smartnsq.serve",
    ):
        assert expected in shown, shown
    # A parameter documented in the docstring is on the page, with its section.
    assert "low_rdy_idle_timeout" in dom
    assert "Parameters" in dom
    assert_served(requests, "/api/")


def test_a_broken_cross_reference_fails_the_strict_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    shutil.copy(ROOT / "README.md", tmp_path)  # pages include sections of it
    with (docs / "index.md").open("a") as page:
        page.write("\nSee [the missing class][smartnsq.NoSuchThing].\n")
    config = (ROOT / "mkdocs.yml").read_text()
    config = config.replace("docs_dir: docs", f"docs_dir: {docs}")
    config = config.replace("paths: [.]", f"paths: [{ROOT}]")
    assert str(docs) in config and str(ROOT) in config
    (tmp_path / "mkdocs.yml").write_text(config)
    result = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "smartnsq.NoSuchThing" in result.stderr
