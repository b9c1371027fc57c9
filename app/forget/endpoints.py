"""Forget jobs: execution-state unlearning. HTTP in and out; the work lives in app/forget/."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Response

from app.forget.jobs import Submission
from app.forget.listing import page_jobs
from app.forget.schemas import ForgetJobList, ForgetJobOut, ForgetRequest, ToolResultForJob, job_out
from app.forget.service import ForgetService
from app.web.consistency import ReadFromDep, stamp, token_responses
from app.web.deps import ContainerDep, PrincipalDep
from app.web.openapi import link
from app.web.params import ID_PATTERN, Cursor, ObjectId
from app.web.problems import problem_doc

router = APIRouter(prefix="/v1/forget", tags=["forget"])


async def get_forget(container: ContainerDep) -> ForgetService:
    return container.services.forget


ForgetDep = Annotated[ForgetService, Depends(get_forget)]

JOB_LINKS = {"GetForgetJob": link("get_forget_job_v1_forget__id__get", "The job", id="$response.body#/id")}
# A finished job's answer carries Lethe-Consistency (a queued or running one's cannot: its forget is not durable yet).
FINISHED = token_responses(200)[200]
SUBMIT_ERRORS: dict[int | str, dict[str, Any]] = {
    200: {"model": ForgetJobOut, "description": "A dry run's plan, or the job when `wait` saw it finish (then with "
          "Lethe-Consistency)", **FINISHED},
    202: {"description": "The job, queued", "links": JOB_LINKS},
    409: problem_doc("The plan (`plan_id`) was already confirmed (a dry run of it), or `legal_hold`: a standing legal "
                     "hold covers the target's session or namespace (`hold_id` names the hold)"),
    503: problem_doc("The model is not loaded yet and the strategy replays, or `keys-unavailable`: `\"shred\": "
                     "\"now\"` and the key provider does not answer (nothing queued); for a memory target, also "
                     "when it refused the shred after the tombstone committed (`forget_id` names the job that "
                     "completes it). With `Retry-After`"),
}


@router.post(
    "", status_code=202, response_model=ForgetJobOut, summary="Start (or plan) a forget job", responses=SUBMIT_ERRORS
)
async def create_forget(
    body: ForgetRequest, principal: PrincipalDep, forget: ForgetDep, container: ContainerDep, response: Response
) -> ForgetJobOut:
    view = await forget.submit(
        principal.tenant_id,
        Submission(
            target=None if body.target is None else body.target.model_dump(exclude_none=True),
            strategy=body.strategy, dry_run=body.dry_run, wait=body.wait, reason=body.reason, plan_id=body.plan_id,
            shred_now=body.shred == "now",
        ),
    )
    if view.finished:
        response.status_code = 200
    if not view.dry_run:  # a plan is not stored
        response.headers["Location"] = f"/v1/forget/{view.id}"
        if view.finished:
            await stamp(response, container.db)
    return job_out(view)


@router.get("", response_model=ForgetJobList, summary="The tenant's forget jobs, newest first")
async def list_forget_jobs(
    principal: PrincipalDep,
    container: ContainerDep,
    where: ReadFromDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Cursor = None,
    status: Annotated[
        Literal["planned", "queued", "running", "succeeded", "failed", "needs_input", "held"] | None, Query()
    ] = None,
    session_id: Annotated[
        str | None,
        Query(min_length=1, max_length=64, pattern=ID_PATTERN, description="Jobs whose target or receipt reaches it"),
    ] = None,
) -> ForgetJobList:
    views, next_cursor = await page_jobs(
        container.db, container.sealer, principal.tenant_id, cursor=cursor, limit=limit, status=status,
        session_id=session_id, where=where,
    )
    return ForgetJobList(jobs=[job_out(v) for v in views], next_cursor=next_cursor)


@router.get(
    "/{id}", response_model=ForgetJobOut, summary="A forget job and its receipt",
    description="Read on the primary. A finished job's answer carries Lethe-Consistency: reads sending it never "
    "see what the job forgot.",
    responses={200: FINISHED},
)
async def get_forget_job(
    id: ObjectId, principal: PrincipalDep, forget: ForgetDep, container: ContainerDep, response: Response
) -> ForgetJobOut:
    view = await forget.get(principal.tenant_id, id)
    if view.finished:
        await stamp(response, container.db)
    return job_out(view)


@router.post(
    "/{id}/tool_results",
    response_model=ForgetJobOut,
    summary="Answer the tool call a needs_input job waits on; the job resumes",
    responses={409: problem_doc("The job is not waiting for a tool result"), 200: FINISHED},
)
async def provide_tool_result(
    id: ObjectId, body: ToolResultForJob, principal: PrincipalDep, forget: ForgetDep, container: ContainerDep,
    response: Response,
) -> ForgetJobOut:
    view = await forget.provide(principal.tenant_id, id, body.tool_call_id, body.content)
    if view.finished:
        await stamp(response, container.db)
    return job_out(view)
