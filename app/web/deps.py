"""FastAPI dependencies: the app's container and the authenticated tenant."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.container import Container
from app.errors import Unauthorized
from app.tenants.service import Principal

# auto_error=False: a missing header is our 401 problem+json, not FastAPI's 403.
_bearer = HTTPBearer(auto_error=False, description="An API key from `lethe tenant create`.")


def container_of(request: Request) -> Container:
    container: Container = request.app.state.container
    return container


async def get_container(request: Request) -> Container:
    # Dependencies are `async def` on purpose: FastAPI runs a plain `def` one in its thread pool, a thread hop per
    # dependency per request (a tenth of the memory API's server time under load, measured with py-spy).
    return container_of(request)


async def get_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if credentials is None:
        raise Unauthorized("send Authorization: Bearer <api key>")
    principal = await container_of(request).tenants.authenticate(f"Bearer {credentials.credentials}")
    request.state.principal = principal  # authenticate_first need not ask the database again
    return principal


ContainerDep = Annotated[Container, Depends(get_container)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]


def _needs_principal(dependant: Dependant) -> bool:
    return any(d.call is get_principal or _needs_principal(d) for d in dependant.dependencies)


async def authenticate_first(request: Request) -> None:
    """Raise Unauthorized when the matched route needs an API key and the request has no valid one.

    FastAPI reads and parses the body before it runs dependencies (a body that is not JSON fails there), and
    reports validation errors after them; the problem handlers call this before answering any of those, so a
    caller without a valid key learns nothing about its request beyond the 401."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not _needs_principal(route.dependant):
        return
    if getattr(request.state, "principal", None) is not None:
        return
    await container_of(request).tenants.authenticate(request.headers.get("authorization"))
