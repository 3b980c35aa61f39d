import httpx
import pytest
import respx

from smartnsq.errors import InvalidArgument, LookupFailed, ProtocolError, TopicNotFound
from smartnsq.lookup import (
    Node,
    TopicMeta,
    check_lookupd_addresses,
    fetch_lookup,
    normalize_lookupd_address,
    parse_lookup,
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
        {"producers": "nope"},
        {"producers": [{"broadcast_address": "h"}]},
        {"producers": [{"tcp_port": 1}]},
        {"partitions": {"zero": PRODUCER}},
        {"partitions": []},
        {"meta": {"partition_num": "many"}},
    ],
)
def test_garbage_is_protocol_error(body):
    with pytest.raises(ProtocolError):
        parse_lookup(body)


def test_addresses():
    assert normalize_lookupd_address("127.0.0.1:4161") == "http://127.0.0.1:4161"
    assert normalize_lookupd_address("http://h:4161/") == "http://h:4161"
    assert check_lookupd_addresses(["h:1", "http://h:1"]) == ["http://h:1"]
    for bad in ["", "h", "ftp://h:1", "http://:1"]:
        with pytest.raises(InvalidArgument):
            normalize_lookupd_address(bad)


@pytest.fixture
def client():
    return httpx.AsyncClient(timeout=1.0)


BASE = "http://lookupd.test:4161"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@respx.mock
async def test_fetch_sends_accept_header_and_parses(client, anyio_backend):
    route = respx.get(f"{BASE}/lookup").mock(
        return_value=httpx.Response(200, json={"producers": [PRODUCER]})
    )
    layout = await fetch_lookup(client, BASE, "t", access="r")
    assert layout.producers[0].tcp_port == 4150
    request = route.calls.last.request
    assert request.headers["accept"] == "application/vnd.nsq; version=1.0"
    assert request.url.params["topic"] == "t"
    assert request.url.params["access"] == "r"
    assert request.url.params["metainfo"] == "true"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@respx.mock
@pytest.mark.parametrize(
    ("response", "error"),
    [
        (httpx.Response(404, json={"message": "TOPIC_NOT_FOUND"}), TopicNotFound),
        (
            httpx.Response(500, json={"status_code": 500, "status_txt": "TOPIC_NOT_FOUND"}),
            TopicNotFound,
        ),
        (httpx.Response(500, text="boom"), LookupFailed),
        (httpx.Response(200, text="{not json"), LookupFailed),
        (httpx.Response(200, json={"producers": [{"x": 1}]}), LookupFailed),
    ],
)
async def test_fetch_errors(client, anyio_backend, response, error):
    respx.get(f"{BASE}/lookup").mock(return_value=response)
    with pytest.raises(error):
        await fetch_lookup(client, BASE, "t")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@respx.mock
async def test_fetch_timeout(client, anyio_backend):
    respx.get(f"{BASE}/lookup").mock(side_effect=httpx.ConnectTimeout("slow"))
    with pytest.raises(LookupFailed, match="unreachable"):
        await fetch_lookup(client, BASE, "t")
