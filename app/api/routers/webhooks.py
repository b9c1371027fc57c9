"""Detector webhooks, signed in the Standard Webhooks scheme (built by the unlearning issue)."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.schemas.forget import DetectorWebhook, WebhookAccepted
from app.errors import NotImplementedYet

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])


@router.post("/detector", status_code=202, response_model=WebhookAccepted, summary="Forget request from a detector")
async def detector_webhook(body: DetectorWebhook) -> WebhookAccepted:
    raise NotImplementedYet("detector webhooks are not built yet")
