"""Detector webhooks, signed in the Standard Webhooks scheme. The signature covers the raw body, so the route reads
the bytes itself (a parsed-and-reserialized body would not verify); the schema is documented for OpenAPI."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from app.forget.schemas import DeliveryList, DeliveryOut, WebhookAccepted
from app.web.consistency import ReadFromDep
from app.web.deps import ContainerDep, PrincipalDep
from app.web.params import Cursor
from app.web.problems import problem_doc
from app.webhooks.deliveries import page_deliveries
from app.webhooks.schemas import DetectorWebhook

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])

_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": DetectorWebhook.model_json_schema()}},
    },
    "parameters": [
        {"name": name, "in": "header", "required": True, "schema": {"type": "string"}, "description": text}
        for name, text in (
            ("webhook-id", "Unique per message; a redelivery repeats it and answers the same job"),
            ("webhook-timestamp", "Unix seconds; more than 5 minutes off answers 401"),
            ("webhook-signature", "`v1,<base64 HMAC-SHA256(secret, \"{id}.{timestamp}.{raw body}\")>`"),
        )
    ],
}


@router.post(
    "/detector",
    status_code=202,
    response_model=WebhookAccepted,
    summary="Forget request from an injection detector",
    openapi_extra=_BODY,
    responses={
        404: problem_doc("The flagged artifact is not in the session"),
        409: problem_doc("`legal_hold`: a standing legal hold covers the flagged session (`hold_id`); nothing queued"),
        422: problem_doc("A verified body that does not match the schema"),
        503: problem_doc("The model is not loaded yet, or the database connection was lost; retry (Retry-After)"),
    },
)
async def detector_webhook(request: Request, container: ContainerDep) -> WebhookAccepted:
    raw = await request.body()
    headers = {k.lower(): v for k, v in request.headers.items()}
    return WebhookAccepted(forget_id=await container.services.webhooks.receive(raw, headers))


@router.get("/deliveries", response_model=DeliveryList, summary="Detector-webhook deliveries, newest first")
async def list_deliveries(
    principal: PrincipalDep,
    container: ContainerDep,
    where: ReadFromDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Cursor = None,
) -> DeliveryList:
    page, next_cursor = await page_deliveries(
        container.db, principal.tenant_id, cursor=cursor, limit=limit, where=where
    )
    return DeliveryList(
        deliveries=[DeliveryOut.model_validate(d, from_attributes=True) for d in page], next_cursor=next_cursor
    )
