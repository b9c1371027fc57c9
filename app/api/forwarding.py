"""HTTP workers in front of one engine process: what needs the model is forwarded to it, the rest served here.

With `LETHE_HTTP_WORKERS` above 1, `lethe serve` runs one engine process (the whole app: the model, the sessions'
KV caches, the forget worker) on a private Unix socket and that many HTTP workers on the public port (app/serving.py).
A worker serves the memory API, webhook deliveries, health and metrics itself, from PostgreSQL, and forwards every
request that can touch the engine — sessions and their turns, forget jobs, detector webhooks, the OpenAI-compatible
routes — byte for byte, streams included. So the model is loaded once, every turn of a session reaches the one
process holding its warm cache, and the hot memory path scales with the workers (as vLLM splits its API server from
its engine core).

A client that hangs up mid-stream is passed on: the forwarded request is closed, so the engine process sees the
disconnect exactly as if the client had been its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.problems import error_response
from app.errors import NotReady

log = logging.getLogger(__name__)

# Served by the engine process. `/readyz` too: a worker is ready when the engine process is.
ENGINE_PREFIXES = (
    "/v1/sessions", "/v1/forget", "/v1/webhooks/detector", "/v1/conversations", "/v1/responses", "/v1/models",
    "/v1/chat/completions", "/readyz", "/mcp",
)
# Per-connection headers (RFC 9110 7.6.1) are not forwarded; the rest, Host included, pass unchanged.
_HOP_BY_HOP = {
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade",
}


def forwarded(path: str) -> bool:
    return any(path == p or path.startswith((p + "/", p + ":", p + "?")) for p in ENGINE_PREFIXES)


class _ClientGone(Exception):
    """The client disconnected before its request body was read."""


class EngineForwarding:
    """ASGI middleware: requests for the engine go to the engine process's socket; the rest to `app`."""

    def __init__(self, app: ASGIApp, socket_path: Path) -> None:
        self.app = app
        self.socket_path = socket_path
        # No read timeout: a turn streams for as long as the model generates; the engine process bounds it.
        self.client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(socket_path)), base_url="http://engine",
            timeout=httpx.Timeout(connect=5.0, read=None, write=None, pool=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if scope["type"] != "http" or not forwarded(scope["path"]):
            await self.app(scope, receive, send)
            return
        await self._forward(scope, receive, send)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            await self.client.aclose()

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = scope["raw_path"].decode("latin-1") if scope.get("raw_path") else scope["path"]
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_BY_HOP]
        request = self.client.build_request(scope["method"], target, headers=headers, content=_body(receive))
        try:
            response = await self.client.send(request, stream=True)
        except _ClientGone:
            return
        except httpx.TransportError as exc:
            log.warning("engine process unreachable", extra={"path": scope["path"], "error": type(exc).__name__})
            await _engine_unavailable(scope, receive, send)
            return
        try:
            await send({
                "type": "http.response.start", "status": response.status_code,
                "headers": [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP_BY_HOP],
            })
            await _stream_until_gone(response, receive, send)
        finally:
            await response.aclose()  # closes the engine process's side too when the client left mid-stream


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


async def _stream_until_gone(response: httpx.Response, receive: Receive, send: Send) -> None:
    """Relay the answer; stop as soon as the client disconnects (its request body was read whole already)."""

    async def relay() -> None:
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def client_gone() -> None:
        message: Message = {"type": ""}
        while message["type"] != "http.disconnect":
            message = await receive()

    relaying = asyncio.create_task(relay())
    watching = asyncio.create_task(client_gone())
    try:
        await asyncio.wait({relaying, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (relaying, watching):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(relaying, watching, return_exceptions=True)
    if relaying.done() and not relaying.cancelled() and relaying.exception() is not None:
        raise relaying.exception()  # type: ignore[misc]


async def _engine_unavailable(scope: Scope, receive: Receive, send: Send) -> None:
    detail = "the engine process is not reachable (starting or restarting); retry"
    error = NotReady(detail, headers={"Retry-After": "1"})
    await error_response(scope["path"], error)(scope, receive, send)
