"""The asyncio transport against a real loopback socket."""

from __future__ import annotations

import asyncio

import pytest

from smartnsq.net.transport import AsyncioLink, open_link


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


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_the_connections_of_a_loop_share_one_read_buffer(loop_kind: str) -> None:
    # A buffer per connection kept the pages its reads had touched resident: 2,000
    # connections held 8 MB. Reads on a loop never overlap, so one buffer serves them all,
    # and each connection still gets exactly its own bytes.
    links_n, rounds = 4, 20

    async def main() -> tuple[list[bytes], list[bytes], int]:
        writers: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

        async def on_client(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await writers.put(writer)

        server = await asyncio.start_server(on_client, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        links, outs, got = [], [], [bytearray() for _ in range(links_n)]
        runners = []
        for i in range(links_n):
            link = await open_link("127.0.0.1", port)
            assert isinstance(link, AsyncioLink)
            links.append(link)
            outs.append(await writers.get())
            runners.append(asyncio.ensure_future(link.run(got[i].extend, lambda: None)))
        expected = [bytearray() for _ in range(links_n)]
        for r in range(rounds):  # every connection readable in the same loop pass
            for i, writer in enumerate(outs):
                chunk = bytes([65 + i]) * (1 + (r * 977 + i * 131) % 9000)
                expected[i] += chunk
                writer.write(chunk)
            for writer in outs:
                await writer.drain()
        for _ in range(1000):
            if all(len(g) == len(e) for g, e in zip(got, expected, strict=True)):
                break
            await asyncio.sleep(0.01)
        buffers = {id(link.get_buffer(-1).obj) for link in links}
        for link in links:
            link.abort()
        await asyncio.gather(*runners, return_exceptions=True)
        for writer in outs:
            writer.close()
        server.close()
        return [bytes(g) for g in got], [bytes(e) for e in expected], len(buffers)

    if loop_kind == "uvloop":
        import uvloop

        got, expected, buffers = uvloop.run(main())
    else:
        got, expected, buffers = asyncio.run(main())
    assert got == expected
    assert buffers == 1
