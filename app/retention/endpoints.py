"""Retention: HTTP in and out; the rules live in app/retention/service.py."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path

from app.ids import SUBJECT_ID_PATTERN
from app.memory.schemas import NAMESPACE_PATTERN
from app.retention.schemas import NamespaceRetentionPut, RetentionOut, RetentionPut
from app.retention.service import RetentionService
from app.web.deps import ContainerDep, PrincipalDep

router = APIRouter(prefix="/v1/retention", tags=["retention"])


async def get_retention(container: ContainerDep) -> RetentionService:
    return container.services.retention


RetentionDep = Annotated[RetentionService, Depends(get_retention)]


@router.put("", response_model=RetentionOut, summary="Set the tenant's retention limits (a sweep runs at once)")
async def put_retention(body: RetentionPut, principal: PrincipalDep, retention: RetentionDep) -> RetentionOut:
    return await retention.put(principal.tenant_id, None, body)


@router.get("", response_model=RetentionOut, summary="The tenant's retention limits, overrides and next sweep")
async def get_retention_policy(principal: PrincipalDep, retention: RetentionDep) -> RetentionOut:
    return await retention.get(principal.tenant_id)


@router.put(
    "/subjects/{subject_id}", response_model=RetentionOut,
    summary="Override the retention limits for one subject (their sessions, and their namespaces' keys)",
)
async def put_subject_retention(
    subject_id: Annotated[str, Path(min_length=1, max_length=200, pattern=SUBJECT_ID_PATTERN)],
    body: RetentionPut, principal: PrincipalDep, retention: RetentionDep,
) -> RetentionOut:
    return await retention.put(principal.tenant_id, subject_id, body)


@router.put(
    "/namespaces/{namespace}", response_model=RetentionOut,
    summary="Override the memory limit for one namespace's keys (wins over its subjects' and the tenant's)",
)
async def put_namespace_retention(
    namespace: Annotated[str, Path(min_length=1, max_length=200, pattern=NAMESPACE_PATTERN)],
    body: NamespaceRetentionPut, principal: PrincipalDep, retention: RetentionDep,
) -> RetentionOut:
    return await retention.put_namespace(principal.tenant_id, namespace, body)
