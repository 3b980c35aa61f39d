"""The Consumers' options have one definition, ``Options``: both Consumers' signatures and
``Args:`` entries are written from it (scripts/consumer_options.py), and must agree with it."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import pydoc
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import smartnsq
import smartnsq.sync
from smartnsq.consumer.options import Options

ROOT = Path(__file__).resolve().parent.parent.parent
CONSUMERS = [smartnsq.Consumer, smartnsq.sync.Consumer]


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "consumer_options", ROOT / "scripts" / "consumer_options.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("consumer", CONSUMERS, ids=lambda c: c.__module__)
def test_every_keyword_default_and_type_is_the_fields(consumer: Any) -> None:
    params = list(inspect.signature(consumer.__init__).parameters.values())[1:]
    fields = dataclasses.fields(Options)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        assert p.annotation == f.type, p.name
        default = p.empty if f.default is dataclasses.MISSING else f.default
        assert p.default == default, p.name
        kind = p.KEYWORD_ONLY if f.kw_only else p.POSITIONAL_OR_KEYWORD
        assert p.kind is kind, p.name


@pytest.mark.parametrize("consumer", CONSUMERS, ids=lambda c: c.__module__)
def test_help_shows_every_keyword_with_its_default_and_description(consumer: Any) -> None:
    text = pydoc.plain(pydoc.render_doc(consumer))
    assert "max_in_flight: 'int' = 1" in text
    assert "dead_letter_topic: 'str | None' = None" in text
    for f in dataclasses.fields(Options):
        assert f"{f.name}: " in text
    # The descriptions are the fields' (the blocking Consumer keeps its own for the first
    # three, which it hands over differently).
    assert "Most messages held at once over all connections" in text


def test_the_options_hold_what_the_consumer_was_given() -> None:
    def handle(message: Any) -> None:
        pass

    consumer = smartnsq.Consumer(
        "t", "c", handle, nsqd_tcp_addresses=["127.0.0.1:4150"], max_attempts=7, snappy=True
    )
    options = consumer._options
    assert (options.handler, options.max_attempts, options.snappy) == (handle, 7, True)
    assert options.requeue_delay == 90.0  # a default, from the field


def test_the_blocking_consumer_hands_every_option_over() -> None:
    consumer = smartnsq.sync.Consumer(
        "t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], max_in_flight=9
    )
    created = consumer._create()  # what start() runs on the loop; nothing connects
    assert created._options.max_in_flight == 9
    fields = {f.name: f for f in dataclasses.fields(Options)}
    assert created._options.heartbeat_interval == fields["heartbeat_interval"].default


CLAIMS = """
class Options:
    max_attempts: int = 5
    \"\"\"Attempts. {claim}\"\"\"
"""


@pytest.mark.parametrize(
    ("claim", "ok"),
    [
        ("Default 5.", True),
        ("default 5", True),
        ("Default 6.", False),
        ("``5`` (default): five.", True),
        ("``None`` (the default): none.", False),
        ("0 (default) delivers all.", False),
        ("Five by default unless said.", True),
    ],
)
def test_a_description_must_state_the_fields_default(claim: str, ok: bool) -> None:
    read = script().read_options
    if ok:
        assert read(CLAIMS.format(claim=claim))[0].default == "5"
    else:
        with pytest.raises(SystemExit, match="says the default is"):
            read(CLAIMS.format(claim=claim))


def test_a_field_without_a_description_is_refused() -> None:
    with pytest.raises(SystemExit, match="needs a description"):
        script().read_options("class Options:\n    a: int = 1\n    b: int = 2\n")


def test_a_misspelt_keyword_is_refused_when_the_blocking_consumer_is_made() -> None:
    with pytest.raises(TypeError, match="max_inflight"):
        smartnsq.sync.Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], max_inflight=5)  # type: ignore[call-arg]


def test_a_description_that_wraps_into_a_markdown_list_is_refused() -> None:
    module = script()
    fine = module.Option("a", "int", "1", "x" * 85 + " and an item", True)
    assert module.args_entry(fine)[1].strip() == "and an item"
    listed = module.Option("a", "int", "1", "x" * 85 + " - an item", True)
    with pytest.raises(SystemExit, match="list or heading"):
        module.args_entry(listed)
