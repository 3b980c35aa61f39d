"""The ```python blocks of README.md and docs/, and how the snippet test runs them.

The convention (CONTRIBUTING.md, "Writing docs", says the same): a ```python fence is run
unless the line right before it is ``<!-- fragment: why it cannot run -->`` (the reason is
required: a library that is not installed). Other markers, one HTML comment per line right
before the fence (several may stack), say how it is run:

* ``<!-- forever -->``: it runs until stopped (a worker, a consumer that sleeps forever). The
  test waits until a client of it is subscribed on the cluster's nsqd, then sends SIGINT; it
  must then exit within ``STOP_TIMEOUT`` seconds, with status 0 or by ``KeyboardInterrupt``
  (under ``smartnsq.run`` / ``serve`` or a blocking ``Consumer.run()``: 0, no traceback).
* ``<!-- pytest -->``: it is a test module; it is run with pytest, with the smartnsq plugin's
  ``SMARTNSQ_NSQ_BIN_DIR`` pointing at the servers the test suite uses.
* ``<!-- youzan -->``: it needs a Youzan HA cluster; skipped, with the reason, when the fork's
  servers are not on this machine (the only kind of skip).
* ``<!-- youzan-ext -->``: the same, with the topics created as ext topics (JSON headers,
  tags, go-nsq compression).
* ``<!-- tls -->``: it runs against a classic nsqd that takes only TLS (its certificate, for
  127.0.0.1 and ``TLS_NAMES``, signed by a test CA). ``TLS_NSQD`` in it is rewritten to that
  nsqd's TCP address and each of ``TLS_FILES`` to the test's file; ``SSL_CERT_FILE`` names
  the test CA, standing in for the system's trust store that ``tls=True`` uses.
* ``<!-- auth -->``: the same, with the nsqd requiring AUTH from a local auth server that
  accepts ``AUTH_SECRET`` (also in ``NSQ_AUTH_SECRET``) for every topic.
* ``<!-- spark -->``: it starts a local Spark session: a longer timeout, its Python workers on
  the test's interpreter (pyspark and Java 17 must be there; it fails, never skips, without
  them). Every block that uses Spark carries it: none is a fragment.

Snippets use the standard addresses 127.0.0.1:4150 (nsqd TCP), 127.0.0.1:4151 (nsqd HTTP),
127.0.0.1:4160 (lookupd TCP) and 127.0.0.1:4161 (lookupd HTTP), which the test rewrites to
its cluster's. Every snippet starts on an empty classic cluster, where each topic a
``Consumer("…"`` in it reads already exists (as after the page's publishing snippet) and is
known to lookupd; on a Youzan cluster each topic it reads or publishes to exists with 2
partitions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/**/*.md")
MARKERS = frozenset(
    {"fragment", "forever", "pytest", "youzan", "youzan-ext", "spark", "requeues", "tls", "auth"}
)
STANDARD = {"4150": "nsqd_tcp", "4151": "nsqd_http", "4160": "lookupd_tcp", "4161": "lookupd_http"}
# The placeholders of the tls and auth blocks, and what the test puts in their place.
TLS_NSQD = "nsqd.example.com:4150"
TLS_NAMES = ("nsqd.example.com", "nsqd.internal")
TLS_FILES = {"/etc/nsq/ca.pem": "ca", "/etc/nsq/client.pem": "cert", "/etc/nsq/client.key": "key"}
AUTH_SECRET = "s3cret"

_FENCE = re.compile(r"^(\s*)```python\s*$")
_CLOSE = re.compile(r"^\s*```\s*$")
_MARKER = re.compile(r"^\s*<!--\s*([a-z][a-z-]*)\s*(?::\s*(.*?))?\s*-->\s*$")
_ADDRESS = re.compile(r"(?<![\d.])127\.0\.0\.1:(4150|4151|4160|4161)(?!\d)")
_CONSUMED = re.compile(r"\bConsumer\(\s*[\"']([\w.#-]+)[\"']")


class SnippetError(ValueError):
    """A page's fences or markers are malformed (unclosed fence, unknown marker)."""


@dataclass(frozen=True)
class Snippet:
    path: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    code: str
    markers: frozenset[str]
    reason: str = ""  # why a fragment cannot run

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def youzan(self) -> bool:
        return bool(self.markers & {"youzan", "youzan-ext"})

    @property
    def tls(self) -> bool:
        return bool(self.markers & {"tls", "auth"})

    @property
    def runnable(self) -> bool:
        return "fragment" not in self.markers

    def topics_consumed(self) -> list[str]:
        return sorted(set(_CONSUMED.findall(self.code)))


def extract(text: str, path: str) -> list[Snippet]:
    """Every ```python block of ``text`` with the markers on the lines right before it."""
    lines = text.splitlines()
    found: list[Snippet] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        markers: set[str] = set()
        reason = ""
        j = i - 1
        while j >= 0 and (m := _MARKER.match(lines[j])):
            if m.group(1) not in MARKERS:
                raise SnippetError(
                    f"{path}:{j + 1}: unknown snippet marker {m.group(1)!r} "
                    f"(known: {', '.join(sorted(MARKERS))})"
                )
            if (m.group(1) == "fragment") != bool(m.group(2)):
                raise SnippetError(
                    f"{path}:{j + 1}: a fragment says why it cannot run "
                    "(<!-- fragment: reason -->), and only a fragment takes a reason"
                )
            markers.add(m.group(1))
            reason = m.group(2) or reason
            j -= 1
        end = i + 1
        while end < len(lines) and not _CLOSE.match(lines[end]):
            end += 1
        if end == len(lines):
            raise SnippetError(f"{path}:{i + 1}: ```python fence is never closed")
        indent = len(opening.group(1))
        body = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
        found.append(Snippet(path, i + 1, body, frozenset(markers), reason))
        i = end + 1
    return found


def all_snippets(root: Path = ROOT) -> list[Snippet]:
    files = sorted({p for pattern in PAGES for p in root.glob(pattern)})
    return [s for f in files for s in extract(f.read_text(), f.relative_to(root).as_posix())]


def rewrite(code: str, addresses: dict[str, str]) -> str:
    """The standard addresses in ``code`` replaced by ``addresses`` (keys as in STANDARD)."""
    return _ADDRESS.sub(lambda m: addresses[STANDARD[m.group(1)]], code)


def rewrite_tls(code: str, nsqd_tcp: str, files: dict[str, str]) -> str:
    """A tls or auth block's placeholder nsqd and files replaced (``files`` keyed as the values
    of TLS_FILES)."""
    code = code.replace(TLS_NSQD, nsqd_tcp)
    for placeholder, key in TLS_FILES.items():
        code = code.replace(placeholder, files[key])
    return code
