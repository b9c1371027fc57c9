"""A minimal HTTP/1.1 keep-alive client for load generation: one request at a time per connection, on uvloop.

The benches measure a server on the same 2 cores as their load generator, so the generator must cost little: httpx
spends about 0.9 ms of CPU per request (bench.memory_bench at 600 requests/s kept half a core busy), more than the
server's own work on a memory read. This client writes a pre-framed request and parses only the status line and
Content-Length of the answer (tens of microseconds). It understands exactly what Lethe's JSON endpoints send:
`Content-Length` framed bodies, keep-alive; anything else (chunked bodies, a closed connection) is an error, never
a silent retry.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast


class TransportError(Exception):
    """The connection failed or closed before a whole answer arrived."""


class Response:
    __slots__ = ("body", "consistency", "status")

    def __init__(self, status: int, body: bytes, consistency: str | None = None) -> None:
        self.status = status
        self.body = body
        self.consistency = consistency  # the Lethe-Consistency header, the one header a load generator needs

    def json(self) -> Any:
        return json.loads(self.body) if self.body else {}


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[Response] | None = None
        self.closed: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = exc or TransportError("server closed the connection")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(TransportError(f"connection lost mid-request: {self.closed!r}"))

    def _complete(self) -> None:
        if self.waiter is None or self.waiter.done():
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        length = 0
        consistency = None
        for line in head[1:]:
            name, _, value = line.partition(":")
            name = name.lower()
            if name == "content-length":
                length = int(value)
            elif name == "lethe-consistency":
                consistency = value.strip()
            elif name == "transfer-encoding":
                self.waiter.set_exception(TransportError(f"unexpected transfer-encoding: {value.strip()}"))
                return
        total = end + 4 + length
        if len(self.buffer) < total:
            return
        body = bytes(self.buffer[end + 4 : total])
        del self.buffer[:total]
        self.waiter.set_result(Response(status, body, consistency))


class Connection:
    """One keep-alive connection; `request` sends one request and waits for its whole answer."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self.host, self.port = host, port
        self.fixed = "".join(f"{k}: {v}\r\n" for k, v in {"Host": f"{host}:{port}", **headers}.items())
        self.protocol: _Protocol | None = None

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        _, self.protocol = await loop.create_connection(_Protocol, self.host, self.port)

    async def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> Response:
        protocol = self.protocol
        if protocol is None or protocol.transport is None:
            raise TransportError("not connected")
        if protocol.closed is not None:
            raise TransportError(f"connection closed by the server: {protocol.closed!r}")
        payload = b"" if body is None else json.dumps(body).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        if body is not None:
            extra += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        protocol.waiter = asyncio.get_running_loop().create_future()
        protocol.transport.write(f"{method} {path} HTTP/1.1\r\n{self.fixed}{extra}\r\n".encode() + payload)
        return await protocol.waiter

    def close(self) -> None:
        if self.protocol is not None and self.protocol.transport is not None:
            self.protocol.transport.close()
