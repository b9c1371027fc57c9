"""FastAPI dependencies: the app's container and the authenticated tenant."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.container import Container
from app.errors import Unauthorized
from app.tenants.service import Principal

# auto_error=False: a missing header is our 401 problem+json, not FastAPI's 403.
_bearer = HTTPBearer(auto_error=False, description="An API key from `lethe tenant create`.")


def get_container(request: Request) -> Container:
    container: Container = request.app.state.container
    return container


async def get_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if credentials is None:
        raise Unauthorized("send Authorization: Bearer <api key>")
    return await get_container(request).tenants.authenticate(f"Bearer {credentials.credentials}")


ContainerDep = Annotated[Container, Depends(get_container)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
