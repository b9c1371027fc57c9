"""Pure ASGI middleware: request id, body-size limit, HTTP metrics and one access-log line per request.

Pure ASGI rather than BaseHTTPMiddleware so streaming responses (SSE) pass through untouched and the
request-id context variable is visible to everything the request runs.
"""

from __future__ import annotations

import logging
import re
import secrets
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import PayloadTooLarge
from app.observability.logging import request_id_var
from app.observability.metrics import Metrics
from app.web.problems import problem_response

log = logging.getLogger("lethe.http")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# How much of an oversized body is read and thrown away before the 413 is sent. A server that answers and closes
# while the client is still sending makes the client's next write fail (a reset, `Broken pipe`) before it can read
# the answer; reading the rest first lets a client that sent a little too much see its 413.
DRAIN_BYTES = 8 << 20


def _replay(buffered: list[Message], receive: Receive) -> Receive:
    pending = list(buffered)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay


async def _drain(receive: Receive, budget: int) -> None:
    """Read and drop up to `budget` more bytes of the request body (DRAIN_BYTES)."""
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def route_template(scope: Scope) -> str:
    """The matched route's path template (`/v1/sessions/{id}`), so metric labels stay low-cardinality.

    The router records the matched route in the scope while it dispatches; unmatched paths share one label.
    """
    route = scope.get("route")
    path = getattr(route, "path_format", None) or getattr(route, "path", None)
    return str(path) if path else "unmatched"


class ObservabilityMiddleware:
    def __init__(self, app: ASGIApp, *, metrics: Metrics, max_body_bytes: int) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes

    async def _read_bounded_body(self, headers: dict[bytes, bytes], receive: Receive) -> list[Message] | None:
        """Read the whole body up front (at most max_body_bytes); None when it is larger.

        Done here rather than by failing inside the app's receive, because the framework turns any error while it
        parses a body into a 400. Buffering costs at most max_body_bytes per request in flight.
        """
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await _drain(receive, DRAIN_BYTES)
            return None
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                if message.get("more_body", False):
                    await _drain(receive, DRAIN_BYTES)
                return None
            if not message.get("more_body", False):
                return messages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        incoming = headers.get(b"x-request-id", b"").decode("latin-1")
        request_id = incoming if _REQUEST_ID.match(incoming) else "req_" + secrets.token_hex(8)
        token = request_id_var.set(request_id)
        method = scope["method"]
        status = 500
        started = time.perf_counter()

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        self.metrics.http_in_flight.inc()
        try:
            buffered = await self._read_bounded_body(headers, receive)
            if buffered is None:
                error = PayloadTooLarge(f"request body exceeds {self.max_body_bytes} bytes")
                await problem_response(error, instance=scope.get("path"))(scope, receive, tracking_send)
            else:
                await self.app(scope, _replay(buffered, receive), tracking_send)
        finally:
            elapsed = time.perf_counter() - started
            route = route_template(scope)
            self.metrics.http_in_flight.dec()
            self.metrics.http_requests.labels(route, method, str(status)).inc()
            self.metrics.http_latency.labels(route, method).observe(elapsed)
            log.info(
                "%s %s %s", method, route, status,
                extra={"route": route, "method": method, "status": status, "duration_ms": round(elapsed * 1000, 2)},
            )
            request_id_var.reset(token)
