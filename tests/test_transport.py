"""The asyncio transport against a real loopback socket."""

from __future__ import annotations

import asyncio

import pytest

from smartnsq.transport import AsyncioLink, open_link


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_every_read_is_handed_over_as_bytes_of_its_own(loop_kind: str) -> None:
    # The link reads into one buffer it keeps: what it hands over must be a copy, or a
    # message would change under the handler when the next read lands.
    chunks = [b"first read " * 3, b"second", b"x" * 300_000, b"last"]

    async def main() -> list[bytes]:
        accepted: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()

        async def on_client(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.set_result(writer)

        server = await asyncio.start_server(on_client, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        link = await open_link("127.0.0.1", port)
        assert isinstance(link, AsyncioLink)
        writer = await accepted
        got: list[bytes] = []
        grew = asyncio.Event()

        def on_data(data: bytes) -> None:
            got.append(data)
            grew.set()

        runner = asyncio.ensure_future(link.run(on_data, lambda: None))
        sent = 0
        for chunk in chunks:  # the next chunk only once this one is read: reads of their own
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)
            while sum(map(len, got)) < sent:
                grew.clear()
                await asyncio.wait_for(grew.wait(), 10)
        link.abort()
        await asyncio.gather(runner, return_exceptions=True)
        writer.close()
        server.close()
        return got

    if loop_kind == "uvloop":
        import uvloop

        got = uvloop.run(main())
    else:
        got = asyncio.run(main())
    assert all(type(g) is bytes for g in got)
    assert b"".join(got) == b"".join(chunks)
    assert got[0] == chunks[0] and got[1] == chunks[1]  # unchanged by the reads after them
