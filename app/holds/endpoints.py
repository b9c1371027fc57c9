"""Legal holds: HTTP in and out; the rules live in app/holds/service.py."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from app.holds.schemas import HoldCreate, HoldOut
from app.holds.service import HoldService
from app.web.deps import ContainerDep, PrincipalDep
from app.web.params import ObjectId
from app.web.problems import problem_doc

router = APIRouter(prefix="/v1/holds", tags=["holds"])

NOT_FOUND: dict[int | str, dict[str, Any]] = {404: problem_doc("No such hold in this tenant")}


async def get_holds(container: ContainerDep) -> HoldService:
    return container.services.holds


HoldsDep = Annotated[HoldService, Depends(get_holds)]


@router.post(
    "", response_model=HoldOut, status_code=201, summary="Place a legal hold on a subject, a session or a namespace",
    responses={404: problem_doc("`session_id` names no session of this tenant")},
)
async def place_hold(body: HoldCreate, principal: PrincipalDep, holds: HoldsDep) -> HoldOut:
    return await holds.place(principal.tenant_id, principal.key_id, body)


@router.get("/{hold_id}", response_model=HoldOut, summary="A hold, what it deferred, and its audit trail",
            responses=NOT_FOUND)
async def get_hold(hold_id: ObjectId, principal: PrincipalDep, holds: HoldsDep) -> HoldOut:
    return await holds.get(principal.tenant_id, hold_id)


@router.delete(
    "/{hold_id}", response_model=HoldOut,
    summary="Release a hold and run the erasures it deferred (again: runs what is still deferred)",
    responses=NOT_FOUND,
)
async def release_hold(hold_id: ObjectId, principal: PrincipalDep, holds: HoldsDep) -> HoldOut:
    return await holds.release(principal.tenant_id, principal.key_id, hold_id)
