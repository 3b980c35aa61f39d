"""SyncConnection.detach: a handshaken connection handed over to a caller's own read loop."""

from __future__ import annotations

from typing import Any

import pytest

from smartnsq.errors import ConnectionClosed
from smartnsq.net.blocking import SyncConnection
from smartnsq.protocol import commands
from smartnsq.protocol.frames import FRAME_RESPONSE, OK
from smartnsq.protocol.handshake import ConnectionConfig
from tests.helpers import unique

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("option", [{}, {"snappy": True}, {"deflate": True}])
def test_detached_socket_speaks_the_negotiated_protocol(
    classic_cluster: Any, option: dict[str, Any]
) -> None:
    address = classic_cluster.nsqd[0].tcp
    conn = SyncConnection.open(address, ConnectionConfig(**option), 5.0)
    own = conn.detach(5.0)
    try:
        assert conn.closed
        with pytest.raises(ConnectionClosed, match="handed over"):
            conn.request(commands.NOP, 1.0)
        compress = own.compress or (lambda b: b)
        decompress = own.decompress or (lambda b: b)
        own.sock.sendall(compress(commands.pub(unique("detach"), b"x")))
        frame = None
        while frame is None:
            frame = own.decoder.next_frame()
            if frame is None:
                own.decoder.append(decompress(own.sock.recv(65536)))
        assert frame == (FRAME_RESPONSE, OK)
    finally:
        own.sock.close()
