"""`/mcp`: the official MCP SDK's streamable HTTP transport behind the tenant's API key.

- Authentication: `Authorization: Bearer <api key>`, the key of the HTTP API, checked by the tenants service before
  the transport reads anything; without a valid one the answer is 401 with `WWW-Authenticate: Bearer`, as on `/v1`.
  The tenant rides in the request's ASGI scope to the tools (tools.py).
- Stateless transport with JSON answers: every POST is complete in itself (no MCP session to remember), so any API
  process can answer any request, and HTTP workers forward `/mcp` to the engine process like the other routes that
  can reach the model (a forget does). The lifespan runs the transport's task group (`start`/`stop`).
- No DNS-rebinding guard on Host/Origin: that guard protects servers that trust ambient credentials (a local server
  without auth); here every request must carry the tenant's key, which a rebound page does not have.
- Not in openapi.yaml: the route speaks MCP (JSON-RPC), which OpenAPI cannot describe honestly.
"""

from __future__ import annotations

import contextlib
from typing import Any

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app.container import Container
from app.errors import LetheError, NotReady
from app.mcp import tools
from app.web.problems import error_response

PATH = "/mcp"


class McpMount:
    def __init__(self) -> None:
        self.server = tools.build()
        self._exit = contextlib.AsyncExitStack()
        self._manager: StreamableHTTPSessionManager | None = None

    @property
    def route(self) -> Route:
        """The route to add to the app (POST for JSON-RPC; GET and DELETE answer as the transport decides)."""
        return Route(PATH, endpoint=self, methods=["GET", "POST", "DELETE"], include_in_schema=False)

    async def start(self) -> None:
        """Run the transport (its task group) until `stop`; a manager runs once, so each start builds one."""
        self.server.streamable_http_app(
            streamable_http_path=PATH, stateless_http=True, json_response=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self._manager = self.server.session_manager
        await self._exit.enter_async_context(self._manager.run())

    async def stop(self) -> None:
        await self._exit.aclose()
        self._manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        container: Container = request.app.state.container
        try:
            if self._manager is None:
                raise NotReady("the MCP transport is not running yet", headers={"Retry-After": "1"})
            principal = await container.tenants.authenticate(request.headers.get("authorization"))
        except LetheError as error:
            await error_response(scope, error)(scope, receive, send)
            return
        inner: dict[str, Any] = {**scope, tools.SCOPE_KEY: tools.Caller(container, principal.tenant_id)}
        await self._manager.handle_request(inner, receive, send)
