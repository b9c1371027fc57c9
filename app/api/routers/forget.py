"""Forget jobs: execution-state unlearning (built by the unlearning issue; answers 501 until then)."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import PrincipalDep
from app.api.schemas.forget import ForgetJobOut, ForgetRequest
from app.errors import NotImplementedYet

router = APIRouter(prefix="/v1/forget", tags=["forget"])


@router.post("", status_code=202, response_model=ForgetJobOut, summary="Start (or plan) a forget job")
async def create_forget(body: ForgetRequest, principal: PrincipalDep) -> ForgetJobOut:
    raise NotImplementedYet("forget jobs are not built yet")


@router.get("/{id}", response_model=ForgetJobOut, summary="A forget job and its receipt")
async def get_forget(id: str, principal: PrincipalDep) -> ForgetJobOut:
    raise NotImplementedYet("forget jobs are not built yet")
