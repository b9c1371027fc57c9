"""Data subjects: HTTP in and out; the rules live in app/subjects/service.py."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Response
from fastapi.responses import StreamingResponse

from app.forget.schemas import ForgetJobOut, job_out
from app.ids import SUBJECT_ID_PATTERN
from app.subjects.erasure import SubjectErasure
from app.subjects.schemas import SubjectErase, SubjectErasePlan, SubjectOut, SubjectPut
from app.subjects.service import SubjectService
from app.web.consistency import ReadFromDep
from app.web.deps import ContainerDep, PrincipalDep
from app.web.problems import problem_doc

router = APIRouter(prefix="/v1/subjects", tags=["subjects"])

SubjectId = Annotated[str, Path(min_length=1, max_length=200, pattern=SUBJECT_ID_PATTERN,
                                description="The caller's id for the person (an account id, a customer number)")]
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: problem_doc("No such subject in this tenant (a session or conversation naming it, or a PUT, makes one)"),
}


async def get_subjects(container: ContainerDep) -> SubjectService:
    return container.services.subjects


SubjectsDep = Annotated[SubjectService, Depends(get_subjects)]


async def get_erasure(container: ContainerDep) -> SubjectErasure:
    return container.services.subject_erasure


ErasureDep = Annotated[SubjectErasure, Depends(get_erasure)]


@router.put(
    "/{subject_id}", response_model=SubjectOut, summary="Link memory namespaces to a subject (made if new)",
    responses={201: {"description": "The subject, made now", "model": SubjectOut}},
)
async def put_subject(
    subject_id: SubjectId, body: SubjectPut, principal: PrincipalDep, subjects: SubjectsDep, response: Response
) -> SubjectOut:
    subject, made = await subjects.put(principal.tenant_id, subject_id, body.memory_namespaces)
    if made:
        response.status_code = 201
    return subject


@router.get("/{subject_id}", response_model=SubjectOut, summary="What is linked to a subject", responses=NOT_FOUND)
async def get_subject(
    subject_id: SubjectId, principal: PrincipalDep, subjects: SubjectsDep, where: ReadFromDep
) -> SubjectOut:
    return await subjects.get(principal.tenant_id, subject_id, where=where)


@router.get(
    "/{subject_id}/export", summary="Everything held about a subject, as one JSON document, streamed",
    response_class=StreamingResponse,
    responses={
        200: {"description": "`{exported_at, subject, sessions: [{id, created_at, turns, conversation_id, artifacts: "
                             "[{id, kind, turn, content}]}], memory: [{namespace, key, version, value, updated_at}], "
                             "forget_receipts: [{id, status, strategy, created_at, finished_at, sessions, memory, "
                             "erasure}]}`; erased content is not held, so not exported",
              "content": {"application/json": {"schema": {"type": "object"}}}},
        **NOT_FOUND,
    },
)
async def export_subject(subject_id: SubjectId, principal: PrincipalDep, subjects: SubjectsDep) -> StreamingResponse:
    document = await subjects.export(principal.tenant_id, subject_id)
    return StreamingResponse(document, media_type="application/json",
                             headers={"Content-Disposition": 'attachment; filename="subject-export.json"'})


@router.post(
    "/{subject_id}/erase", response_model=ForgetJobOut | SubjectErasePlan,
    summary="Erase everything a subject owns (their sessions whole, their namespaces' keys), with one receipt",
    responses={200: {"description": "The erasure's forget job, ended, with its `subject` receipt and `erasure`; "
                                    "with `dry_run`, the plan"},
               202: {"description": "The erasure's forget job, queued or running (`wait` false, or past "
                                    "LETHE_FORGET_WAIT_S): read it at `Location`", "model": ForgetJobOut},
               **NOT_FOUND,
               409: problem_doc("`legal_hold`: a standing hold covers the whole subject (`hold_id` names it)")},
)
async def erase_subject(
    subject_id: SubjectId, body: SubjectErase, principal: PrincipalDep, erasure: ErasureDep, response: Response
) -> ForgetJobOut | SubjectErasePlan:
    also = body.also
    texts = (also.text or []) if also else []
    query, min_similarity = (also.query, also.min_similarity) if also else (None, None)
    if body.dry_run:
        plan = await erasure.plan(principal.tenant_id, subject_id, texts, query=query, min_similarity=min_similarity)
        return plan.out()
    view = await erasure.submit(principal.tenant_id, subject_id, texts, query=query, min_similarity=min_similarity,
                                wait=body.wait)
    response.headers["Location"] = f"/v1/forget/{view.id}"
    if not view.finished:
        response.status_code = 202
    return job_out(view)
