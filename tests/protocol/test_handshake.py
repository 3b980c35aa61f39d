"""The sans-IO handshake: what it asks the driver to do for each reply of nsqd."""

from __future__ import annotations

import json

import pytest

from smartnsq.errors import AuthFailed, ConnectFailed, ProtocolError
from smartnsq.protocol import commands
from smartnsq.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT
from smartnsq.protocol.handshake import (
    ConnectionConfig,
    Handshake,
    Send,
    StartCompression,
    StartTLS,
)


def reply(**features: object) -> bytes:
    return json.dumps({"max_rdy_count": 2500, "version": "1.3.0", **features}).encode()


def test_plain_identify_then_done():
    hs = Handshake("n:4150", "n", ConnectionConfig())
    first = hs.start()
    assert isinstance(first, Send) and first.data.startswith(commands.MAGIC_V2 + b"IDENTIFY\n")
    assert hs.reply(FRAME_RESPONSE, reply()) is None
    assert hs.features.max_rdy_count == 2500 and hs.features.version == "1.3.0"


def test_connections_given_the_same_reply_share_its_features():
    # 1,000 consumers on two nsqd hold 2,000 of them: one each per reply, not per connection
    features = []
    for max_rdy in (2500, 2500, 100):
        hs = Handshake("n:4150", "n", ConnectionConfig())
        hs.start()
        assert hs.reply(FRAME_RESPONSE, reply(max_rdy_count=max_rdy)) is None
        features.append(hs.features)
    assert features[0] is features[1]
    assert features[2] is not features[0] and features[2].max_rdy_count == 100
    assert features[0].raw == {"max_rdy_count": 2500, "version": "1.3.0"}
    with pytest.raises(TypeError):  # shared: one connection cannot change another's
        features[0].raw["version"] = "x"  # type: ignore[index]


def test_tls_then_snappy_then_auth_in_that_order():
    cfg = ConnectionConfig(tls=True, snappy=True, auth_secret="s3cret")
    hs = Handshake("n:4150", "n", cfg)
    hs.start()
    step = hs.reply(FRAME_RESPONSE, reply(tls_v1=True, snappy=True, auth_required=True))
    assert isinstance(step, StartTLS) and step.hostname == "n"
    step = hs.reply(FRAME_RESPONSE, b"OK")
    assert isinstance(step, StartCompression)
    assert step.decompress(step.compress(b"hello")) == b"hello"
    assert hs.reply(FRAME_RESPONSE, HEARTBEAT) == commands.NOP  # answered, then read on
    step = hs.reply(FRAME_RESPONSE, b"OK")
    assert step == Send(commands.auth(b"s3cret"))
    assert hs.reply(FRAME_RESPONSE, b'{"identity": "me"}') is None
    assert hs.auth == {"identity": "me"}


def test_required_tls_that_nsqd_does_not_offer_is_refused():
    hs = Handshake("n:4150", "n", ConnectionConfig(tls=True))
    hs.start()
    with pytest.raises(ConnectFailed, match="does not offer TLS"):
        hs.reply(FRAME_RESPONSE, reply())


@pytest.mark.parametrize(
    ("ftype", "payload", "error"),
    [
        (FRAME_ERROR, b"E_AUTH_FAILED nope", AuthFailed),
        (FRAME_MESSAGE, b"x" * 30, ProtocolError),
        (FRAME_RESPONSE, b"[]", ProtocolError),
    ],
)
def test_errors_and_odd_frames_end_the_handshake(ftype, payload, error):
    hs = Handshake("n:4150", "n", ConnectionConfig())
    hs.start()
    with pytest.raises(error):
        hs.reply(ftype, payload)


def test_a_missing_ok_after_an_upgrade_is_a_protocol_error():
    hs = Handshake("n:4150", "n", ConnectionConfig(deflate=True))
    hs.start()
    assert isinstance(hs.reply(FRAME_RESPONSE, reply(deflate=True)), StartCompression)
    with pytest.raises(ProtocolError, match="expected OK"):
        hs.reply(FRAME_RESPONSE, b"NOPE")
