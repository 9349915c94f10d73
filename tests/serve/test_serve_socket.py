"""The listening socket: connections it accepts must have Nagle off, or every response written
as headers then body waits ~40 ms for the client's delayed ACK (the wire path's main cost)."""

from __future__ import annotations

import asyncio
import socket

from tempering.serve.server import listen_socket


def test_accepted_connections_have_nagle_off() -> None:
    async def main() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def handle(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock: socket.socket = writer.get_extra_info("socket")
            seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        listener = listen_socket("127.0.0.1", 0)
        server = await asyncio.start_server(handle, sock=listener)
        async with server:
            port = int(listener.getsockname()[1])
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            value = await asyncio.wait_for(seen, 10)
            writer.close()
            return value

    assert asyncio.run(main()) != 0
