"""Sessions: the stateful agent runtime (built by the runtime issue; answers 501 until then)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.api.deps import PrincipalDep
from app.api.schemas.sessions import (
    ArtifactList,
    CompactRequest,
    SessionCreate,
    SessionOut,
    TurnOut,
    TurnRequest,
)
from app.errors import NotImplementedYet

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


@router.post("", status_code=201, response_model=SessionOut, summary="Create a session")
async def create_session(body: SessionCreate, principal: PrincipalDep) -> SessionOut:
    raise NotImplementedYet("sessions are not built yet")


@router.get("/{id}", response_model=SessionOut, summary="Get a session")
async def get_session(id: str, principal: PrincipalDep) -> SessionOut:
    raise NotImplementedYet("sessions are not built yet")


@router.delete("/{id}", status_code=204, summary="Purge a session, its artifacts, checkpoints and cache")
async def delete_session(id: str, principal: PrincipalDep) -> Response:
    raise NotImplementedYet("sessions are not built yet")


@router.post("/{id}/turns", response_model=TurnOut, summary="Run one transition")
async def post_turn(id: str, body: TurnRequest, principal: PrincipalDep) -> TurnOut:
    raise NotImplementedYet("sessions are not built yet")


@router.get("/{id}/artifacts", response_model=ArtifactList, summary="The ordered artifacts of the live state")
async def list_artifacts(id: str, principal: PrincipalDep) -> ArtifactList:
    raise NotImplementedYet("sessions are not built yet")


@router.get(
    "/{id}/artifacts/{artifact_id}/descendants", response_model=ArtifactList, summary="Taint closure of an artifact"
)
async def artifact_descendants(id: str, artifact_id: str, principal: PrincipalDep) -> ArtifactList:
    raise NotImplementedYet("sessions are not built yet")


@router.post("/{id}/compact", response_model=SessionOut, summary="Replace older turns with a summary")
async def compact_session(id: str, principal: PrincipalDep, body: CompactRequest | None = None) -> SessionOut:
    raise NotImplementedYet("sessions are not built yet")
