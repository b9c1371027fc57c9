"""Liveness, readiness and Prometheus metrics. No auth: bind them to an internal port in production."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from app.web.deps import ContainerDep
from app.web.problems import PROBLEM_JSON, problem, problem_doc

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: the database answers and the engine is loaded",
    responses={503: problem_doc("The database or the engine is not ready (`Retry-After`)")},
)
async def readyz(container: ContainerDep) -> JSONResponse:
    database = await container.db.ping()
    slot = container.engine
    engine = await slot.available()
    container.metrics.ready.set(1 if database and engine else 0)
    checks = {
        "database": "ok" if database else "unreachable",
        "engine": "ok" if engine else (slot.error or "loading"),
    }
    if database and engine:
        return JSONResponse({"status": "ready", "checks": checks, "engine": slot.engine.name})
    body = problem(503, "not-ready", "Service not ready", "the database or the engine is not ready", checks=checks)
    return JSONResponse(body, status_code=503, media_type=PROBLEM_JSON, headers={"Retry-After": "2"})


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(container: ContainerDep) -> Response:
    return Response(container.metrics.render(), media_type=CONTENT_TYPE_LATEST)
