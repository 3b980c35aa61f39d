from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import anyio.abc
import pytest

from smartnsq.errors import InvalidArgument, LookupFailed, ProtocolError, TopicNotFound
from smartnsq.lookup import (
    Node,
    TopicMeta,
    check_lookupd_addresses,
    fetch_lookup,
    normalize_lookupd_address,
    parse_lookup,
)
from smartnsq.lookup.manager import LookupManager
from smartnsq.lookup.model import Skipped, loads, parse_listlookup
from smartnsq.net.http import HttpClient
from tests.helpers import (
    FakeApi,
    HttpRequest,
    drip,
    fake_api,
    hang_up,
    json_body,
    unused_address,
)

PRODUCER = {
    "remote_address": "127.0.0.1:5555",
    "hostname": "h",
    "broadcast_address": "10.0.0.1",
    "tcp_port": 4150,
    "http_port": 4151,
    "version": "1.3.0",
}


def test_classic_flat():
    layout = parse_lookup({"channels": ["c"], "producers": [PRODUCER]})
    assert layout.producers == (Node("10.0.0.1", 4150, 4151, "1.3.0"),)
    assert layout.producers[0].tcp_address == "10.0.0.1:4150"
    assert not layout.partitioned


def test_legacy_envelope():
    body = {"status_code": 200, "status_txt": "OK", "data": {"producers": [PRODUCER]}}
    assert parse_lookup(body).producers[0].tcp_port == 4150


def test_youzan_partitions_and_meta():
    body = {
        "channels": ["ch"],
        "meta": {"partition_num": 2, "replica": 1, "extend_support": True, "ordered": False},
        "partitions": {"0": PRODUCER, "1": dict(PRODUCER, broadcast_address="10.0.0.2")},
        "producers": [PRODUCER],
    }
    layout = parse_lookup(body)
    assert layout.partitioned
    assert layout.partitions[1].broadcast_address == "10.0.0.2"
    assert layout.meta == TopicMeta(2, 1, False, True)


def test_duplicate_producers_are_merged():
    assert len(parse_lookup({"producers": [PRODUCER, PRODUCER]}).producers) == 1


def test_ipv6_address():
    node = Node("::1", 4150)
    assert node.tcp_address == "[::1]:4150"


@pytest.mark.parametrize(
    "body",
    [
        [],
        "x",
        None,
        {"status_code": 200, "data": []},
        {"producers": "nope"},
        {"producers": {"0": PRODUCER}},
        {"partitions": []},
        {"partitions": "x"},
    ],
)
def test_unusable_answer_is_protocol_error(body):
    with pytest.raises(ProtocolError):
        parse_lookup(body)


BAD_ENTRIES = {
    "not an object": ["10.0.0.9:4150", 4150, None, [PRODUCER]],
    "address": [
        {"tcp_port": 4150},
        {"broadcast_address": "", "tcp_port": 4150},
        {"broadcast_address": "   ", "tcp_port": 4150},
        {"broadcast_address": 7, "tcp_port": 4150},
    ],
    "tcp_port": [
        {"broadcast_address": "h"},
        {"broadcast_address": "h", "tcp_port": None},
        {"broadcast_address": "h", "tcp_port": "abc"},
        {"broadcast_address": "h", "tcp_port": "4150abc"},
        {"broadcast_address": "h", "tcp_port": "1_000"},
        {"broadcast_address": "h", "tcp_port": 0},
        {"broadcast_address": "h", "tcp_port": -1},
        {"broadcast_address": "h", "tcp_port": 65536},
        {"broadcast_address": "h", "tcp_port": 10**400},
        {"broadcast_address": "h", "tcp_port": float("inf")},
        {"broadcast_address": "h", "tcp_port": float("-inf")},
        {"broadcast_address": "h", "tcp_port": float("nan")},
        {"broadcast_address": "h", "tcp_port": 4150.5},
        {"broadcast_address": "h", "tcp_port": True},
        {"broadcast_address": "h", "tcp_port": [4150]},
    ],
}


@pytest.mark.parametrize(
    ("problem", "entry"),
    [(problem, entry) for problem, entries in BAD_ENTRIES.items() for entry in entries],
)
def test_bad_producer_entry_is_skipped_alone(problem, entry):
    skipped: list = []
    layout = parse_lookup({"producers": [entry, PRODUCER]}, skipped)
    assert layout.producers == (Node("10.0.0.1", 4150, 4151, "1.3.0"),)
    assert len(skipped) == 1 and problem in skipped[0].problem
    # The same entry as a partition leader is skipped too, the good partition is kept.
    skipped.clear()
    layout = parse_lookup({"partitions": {"0": entry, "1": PRODUCER}}, skipped)
    assert list(layout.partitions) == [1]
    assert len(skipped) == 1 and skipped[0].problem.startswith("partition")


@pytest.mark.parametrize("key", ["zero", "-1", "1.5", "", " 1", "1e3", "9" * 40])
def test_bad_partition_key_is_skipped_alone(key):
    skipped: list = []
    layout = parse_lookup({"partitions": {key: PRODUCER, "2": PRODUCER}}, skipped)
    assert list(layout.partitions) == [2]
    assert [s.problem for s in skipped] == ["partition key that is not a non-negative number"]


def test_json_quirks_parse_into_bad_entries_not_errors():
    # Infinity/NaN and integers past json's 4300-digit limit stay inside their entry.
    body = (
        b'{"producers": [{"broadcast_address": "a", "tcp_port": Infinity},'
        b'{"broadcast_address": "b", "tcp_port": NaN},'
        b'{"broadcast_address": "c", "tcp_port": ' + b"9" * 5000 + b"},"
        b'{"broadcast_address": "d", "tcp_port": 1e999},'
        b'{"broadcast_address": "e", "tcp_port": 4150.0, "http_port": "4151"}]}'
    )
    skipped: list = []
    layout = parse_lookup(loads(body), skipped)
    assert layout.producers == (Node("e", 4150, 4151),)
    assert len(skipped) == 4


def test_bad_http_port_keeps_the_node():
    layout = parse_lookup({"producers": [dict(PRODUCER, http_port=-5)]})
    assert layout.producers == (Node("10.0.0.1", 4150, 0, "1.3.0"),)


@pytest.mark.parametrize(
    "meta",
    [{"partition_num": "many"}, {"partition_num": -1}, {"replica": float("inf")}],
)
def test_malformed_meta_is_dropped_not_the_answer(meta):
    skipped: list = []
    layout = parse_lookup({"meta": meta, "partitions": {"0": PRODUCER}}, skipped)
    assert layout.meta is None and list(layout.partitions) == [0]
    assert [s.problem for s in skipped] == ["meta without valid partition_num and replica"]


def lookupd_node(ip: object, port: object) -> dict:
    return {"ID": "x", "NodeIP": ip, "TcpPort": "4160", "HttpPort": port, "RpcPort": "1"}


def test_listlookup_skips_bad_nodes():
    body = {
        "lookupdnodes": [
            lookupd_node("10.0.0.1", "4161"),
            lookupd_node("10.0.0.2", "0"),
            lookupd_node("10.0.0.3", 0),
            lookupd_node("10.0.0.4", "70000"),
            lookupd_node("10.0.0.5", float("inf")),
            lookupd_node("", "4161"),
            lookupd_node("bad host/path", "4161"),
            "10.0.0.6:4161",
            lookupd_node("::1", 4161),
        ],
        "lookupdleader": lookupd_node("10.0.0.1", "4161"),
    }
    skipped: list = []
    urls, leader = parse_listlookup(body, skipped)
    assert urls == ["http://10.0.0.1:4161", "http://[::1]:4161"]
    assert leader == "http://10.0.0.1:4161"
    assert len(skipped) == 7


@pytest.mark.parametrize("body", [[], "x", {"lookupdnodes": "x"}, {"lookupdnodes": None}])
def test_listlookup_of_another_shape_lists_nothing(body):
    assert parse_listlookup(body) == ([], None)


@pytest.mark.parametrize(
    "options",
    [
        {"max_response_size": 0},
        {"max_response_size": 1.5},
        {"answer_grace": -1},
        {"timeout": 0},
        {"timeout": float("nan")},
    ],
)
def test_bad_options_say_what_to_fix(options):
    with pytest.raises(InvalidArgument, match=next(iter(options))):
        LookupManager(["127.0.0.1:4161"], **options)


def test_addresses():
    assert normalize_lookupd_address("127.0.0.1:4161") == "http://127.0.0.1:4161"
    assert normalize_lookupd_address("http://h:4161/") == "http://h:4161"
    assert check_lookupd_addresses(["h:1", "http://h:1"]) == ["http://h:1"]
    assert normalize_lookupd_address("https://[::1]:4161") == "https://[::1]:4161"
    assert normalize_lookupd_address("http://h:80") == "http://h:80"
    for bad, problem in [
        ("", "host:port"),
        ("h", "host:port"),
        ("ftp://h:1", "host:port"),
        ("http://:1", "host:port"),
        ("h:99999", "not a valid URL"),
        ("h:x", "not a valid URL"),
        ("[::1:4161", "not a valid URL"),
        ("h:1/lookup", "no path"),
        ("h:1?topic=t", "no path"),
        ("user@h:1", "no path"),
        ("bad host:1", "invalid host name"),
    ]:
        with pytest.raises(InvalidArgument, match=problem):
            normalize_lookupd_address(bad)


@pytest.fixture
def client() -> HttpClient:
    return HttpClient(connect_timeout=1.0)


@pytest.fixture
async def lookupd(anyio_backend: str) -> AsyncIterator[FakeApi]:
    async with fake_api() as api:
        yield api


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_fetch_sends_accept_header_and_parses(client: HttpClient, lookupd: FakeApi) -> None:
    lookupd.routes["/lookup"] = json_body({"producers": [PRODUCER]})
    layout = await fetch_lookup(client, lookupd.url, "t", access="r")
    assert layout.producers[0].tcp_port == 4150
    [request] = lookupd.calls("/lookup")
    assert request.headers["accept"] == "application/vnd.nsq; version=1.0"
    assert request.query == {"topic": "t", "access": "r", "metainfo": "true"}


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize(
    ("response", "error"),
    [
        (json_body({"message": "TOPIC_NOT_FOUND"}, 404), TopicNotFound),
        (json_body({"status_code": 500, "status_txt": "TOPIC_NOT_FOUND"}, 500), TopicNotFound),
        ((500, b"boom"), LookupFailed),
        ((200, b"{not json"), LookupFailed),
        (json_body({"producers": {"x": 1}}), LookupFailed),
        ((200, b"[" * 100_000), LookupFailed),  # RecursionError in json
        ((200, b"\xff\xfe"), LookupFailed),
    ],
)
async def test_fetch_errors(
    client: HttpClient,
    lookupd: FakeApi,
    response: tuple[int, bytes],
    error: type[Exception],
) -> None:
    lookupd.routes["/lookup"] = response
    with pytest.raises(error):
        await fetch_lookup(client, lookupd.url, "t")
    assert len(lookupd.calls("/lookup")) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("closes", [False, True])
async def test_fetch_timeout(client: HttpClient, lookupd: FakeApi, closes: bool) -> None:
    """Nothing listens, or the server closes the connection at once."""
    lookupd.routes["/lookup"] = hang_up
    base = lookupd.url if closes else f"http://{unused_address()}"
    error = "ended before the whole answer's head" if closes else "cannot connect"
    with pytest.raises(LookupFailed, match=error):
        await fetch_lookup(client, base, "t")
    assert len(lookupd.calls("/lookup")) == int(closes)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_fetch_skips_bad_entries_and_reports_them(
    client: HttpClient, lookupd: FakeApi
) -> None:
    body = {"producers": [{"broadcast_address": "h", "tcp_port": 0}, PRODUCER]}
    lookupd.routes["/lookup"] = json_body(body)
    skipped: list[Skipped] = []
    layout = await fetch_lookup(client, lookupd.url, "t", skipped=skipped)
    assert [n.broadcast_address for n in layout.producers] == ["10.0.0.1"]
    assert [s.problem for s in skipped] == ["producer entry without a valid tcp_port (1-65535)"]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_fetch_caps_the_body(client: HttpClient, lookupd: FakeApi) -> None:
    hung_up = anyio.Event()

    async def endless(request: HttpRequest, stream: anyio.abc.ByteStream) -> None:
        await stream.send(b"HTTP/1.1 200 OK\r\n\r\n")  # no length: the body runs to the end
        try:
            while True:
                await stream.send(b" " * 1024)
        except (anyio.BrokenResourceError, OSError):
            hung_up.set()

    lookupd.routes["/lookup"] = endless
    with anyio.fail_after(5):
        with pytest.raises(LookupFailed, match="more than 4096 bytes"):
            await fetch_lookup(client, lookupd.url, "t", max_response_size=4096)
        await hung_up.wait()  # stopped reading right after the cap, and hung up


@pytest.mark.anyio
async def test_fetch_deadline_covers_the_body(client: HttpClient, lookupd: FakeApi) -> None:
    lookupd.routes["/lookup"] = drip(100, 0.05)  # each read is quick: only a total deadline
    with anyio.fail_after(3), pytest.raises(LookupFailed, match=r"within 0\.3s"):
        await fetch_lookup(client, lookupd.url, "t", timeout=0.3)
