"""The documentation site builds strictly and renders in a real browser.

The site is built into a temporary directory with ``mkdocs build --strict``, served by a
small HTTP server that records every request, and loaded in headless Chromium (Debian's
``chromium``, which ``./dev setup`` installs). The rendered DOM must show the expected
headings, and no request may fail: a missing stylesheet, script or page would show up as a
404 here. A probe page loads every page of the site in iframes of a desktop and a phone width
and measures the rendered code blocks: no code line may run past its box (cut off, or hidden
behind a scroll bar), and the API reference's signatures are formatted over several lines.
"""

from __future__ import annotations

import contextlib
import html
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
BUILD_TIMEOUT = 180  # seconds; a build takes a few seconds
BROWSER_TIMEOUT = 90
PROBE_TIMEOUT = 240  # forty page loads in one browser, on a loaded machine


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
    with serving(site) as served:
        yield served


@contextlib.contextmanager
def serving(site: Path) -> Iterator[tuple[str, list[tuple[str, int]]]]:
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


def render(url: str, profile: Path, *extra: str, timeout: float = BROWSER_TIMEOUT) -> str:
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
        *extra,
        "--dump-dom",
        url,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
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


# Every page of the site (mkdocs.yml's nav), as served.
PAGES = [
    "/",
    "/quickstart/",
    "/local-nsqd/",
    "/clusters/",
    "/ordered/",
    "/tracing/",
    "/guarantees/",
    "/shutdown/",
    "/metrics/",
    "/logging/",
    "/tls-auth/",
    "/integrations/",
    "/blocking/",
    "/spark/",
    "/cli/",
    "/testing/",
    "/migrating/",
    "/api/",
    "/api/sync/",
    "/api/connection/",
    "/api/trace/",
    "/api/errors/",
]
# page @width -> {"cut": [...], "signatures": [...]}, as the probe page reports them
Measured = dict[str, dict[str, list[dict[str, object]]]]
WIDTHS = (1280, 390)  # a laptop and a phone, in CSS pixels

# Loads each page in a same-origin iframe of each width and, once it has loaded, measures it;
# the results replace the text of #result, which --dump-dom then prints.
PROBE = """<!doctype html><html><head><link rel="icon" href="data:,"></head><body>
<pre id="result">pending</pre><script>
const pages = %(pages)s, widths = %(widths)s, out = {};
let pending = pages.length * widths.length;
function measure(frame) {
  const doc = frame.contentDocument, win = frame.contentWindow, found = {cut: [], signatures: []};
  for (const el of doc.querySelectorAll("pre, code, table, .doc-signature, .md-typeset__table")) {
    const style = win.getComputedStyle(el);
    const block = el.tagName === "CODE" && el.parentElement.tagName === "PRE";
    const hides = ["hidden", "clip"].includes(style.overflowX);
    // A code block must fit its box; anything else must not hide what overflows it.
    if ((block || hides) && el.scrollWidth > el.clientWidth + 1) {
      found.cut.push({tag: el.tagName, overflow: style.overflowX, scrollWidth: el.scrollWidth,
                      clientWidth: el.clientWidth, text: el.textContent.slice(0, 80)});
    }
  }
  for (const code of doc.querySelectorAll(".doc-signature code")) {
    const lineHeight = parseFloat(win.getComputedStyle(code).lineHeight);
    found.signatures.push({text: code.textContent.slice(0, 400),
                           lines: Math.round(code.getBoundingClientRect().height / lineHeight)});
  }
  return found;
}
for (const page of pages) for (const width of widths) {
  const frame = document.createElement("iframe");
  // Same origin (so it can be measured) but no scripts: code boxes are laid out by CSS alone,
  // and forty copies of the theme's JavaScript would only slow the browser down.
  frame.setAttribute("sandbox", "allow-same-origin");
  frame.style.width = width + "px";
  frame.style.height = "800px";
  frame.onload = () => {
    out[page + " @" + width + "px"] = measure(frame);
    if (--pending === 0) document.getElementById("result").textContent = JSON.stringify(out);
  };
  frame.src = page;
  document.body.appendChild(frame);
}
</script></body></html>
"""


def measure_site(site: Path, base: str, profile: Path) -> Measured:
    (site / "probe.html").write_text(
        PROBE % {"pages": json.dumps(PAGES), "widths": json.dumps(list(WIDTHS))}
    )
    # The virtual time budget lets every iframe load before the dump.
    dom = render(
        f"{base}/probe.html", profile, "--virtual-time-budget=20000", timeout=PROBE_TIMEOUT
    )
    found = re.search(r'<pre id="result">(.*?)</pre>', dom, flags=re.S)
    assert found, dom[:2000]
    text = html.unescape(found.group(1))
    assert text != "pending", "the probe page did not finish measuring every page"
    result: Measured = json.loads(text)
    assert len(result) == len(PAGES) * len(WIDTHS), sorted(result)
    return result


@pytest.fixture(scope="module")
def measured(site: Path, tmp_path_factory: pytest.TempPathFactory) -> Measured:
    with serving(site) as (base, requests):
        result = measure_site(site, base, tmp_path_factory.mktemp("profile"))
    failed = [(path, status) for path, status in requests if not 200 <= status < 400]
    assert not failed, f"requests that failed: {failed}"
    return result


def test_no_code_line_is_cut_off(measured: Measured) -> None:
    cut = {page: found["cut"] for page, found in measured.items() if found["cut"]}
    assert not cut, "code wider than its box (cut off, or behind a scroll bar):\n" + "\n".join(
        f"{page}: {json.dumps(items[:3])}" for page, items in cut.items()
    )


def test_signatures_are_formatted_over_several_lines(
    measured: Measured,
) -> None:
    signatures = measured["/api/ @1280px"]["signatures"]
    consumer = [s for s in signatures if str(s["text"]).startswith("Consumer(")]
    assert consumer, [s["text"] for s in signatures][:5]
    text = str(consumer[0]["text"])
    # One parameter per line, as ruff formats it: not one long line that wraps.
    assert text.startswith("Consumer(\n    topic: str,\n    channel: str,"), text
    assert int(str(consumer[0]["lines"])) >= 5, consumer[0]


def test_the_docs_extra_can_format_signatures() -> None:
    # mkdocstrings formats signatures with ruff (or black); without either it prints each
    # signature as one long line, silently.
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = {re.split(r"[\[<>=!~; ]", spec, maxsplit=1)[0].lower() for spec in extras["docs"]}
    assert names & {"ruff", "black"}, extras["docs"]
