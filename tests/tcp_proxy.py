"""A TCP proxy a test controls: it forwards 127.0.0.1:port to a target until ``cut``, which
drops every connection through it and refuses new ones until ``restore`` (a partition)."""

import asyncio
import contextlib

from tests.daemons import free_port


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.open = True
        self._server: asyncio.base_events.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if not self.open:
            client_w.close()
            return
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        self._links |= {client_w, server_w}

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            writer.close()

        await asyncio.gather(pump(client_r, server_w), pump(server_r, client_w))
        self._links -= {client_w, server_w}

    def cut(self) -> None:
        """Drop every connection (reset, as a failed link looks) and refuse new ones."""
        self.open = False
        for writer in list(self._links):
            transport = writer.transport
            transport.abort()
        self._links.clear()

    def restore(self) -> None:
        self.open = True

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
