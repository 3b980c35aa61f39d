"""The source's kept HTTP clients (no Spark, no servers)."""

from __future__ import annotations

from typing import Any

import pytest

from smartnsq.spark import youzan


def test_plain_http_never_loads_the_trust_store(monkeypatch: pytest.MonkeyPatch) -> None:
    # Loading it took 110 ms of a query's start, for nsqd endpoints that are never https.
    monkeypatch.setattr(youzan, "_clients", {})
    asked: list[bool] = []

    def verify() -> Any:
        asked.append(True)
        return True

    monkeypatch.setattr(youzan, "tls_verify", verify)
    plain = youzan._client("http://127.0.0.1:4151/stats")
    assert youzan._client("http://127.0.0.1:4161/lookup") is plain and not asked
    secure = youzan._client("https://lookupd:4161/lookup")
    assert secure is not plain and asked == [True]
    assert youzan._client("https://other:4161/lookup") is secure and asked == [True]
