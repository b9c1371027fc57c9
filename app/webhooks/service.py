"""Detector webhooks: a prompt-injection detector flags an observation, and the flag starts a forget.

Standard Webhooks scheme, verified with the `standardwebhooks` package against the secret of the tenant that owns
the named session: `webhook-id`, `webhook-timestamp` (more than 5 minutes off: rejected) and `webhook-signature`
(`v1,<base64 HMAC-SHA256(secret, "{id}.{timestamp}.{raw body}")>`). Nothing is read or written for a delivery that
does not verify, beyond finding the session's tenant to pick the secret.

Redelivery is safe: the delivery row (tenant, webhook-id) and the job it starts are inserted in one transaction, so
the same webhook-id answers the same job, also when two deliveries race (the second insert waits for the first).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from standardwebhooks import Webhook

from app.api.schemas.forget import DetectorWebhook
from app.db.repositories import forget_jobs as jobs_repo
from app.db.repositories import sessions as sessions_repo
from app.db.session import Database
from app.errors import InvalidRequest, Unauthorized
from app.forget.service import ForgetService
from app.forget.strategies import STRATEGIES
from app.forget.targets import Target

log = logging.getLogger(__name__)

STRATEGY = "selective_replay"


class DetectorWebhooks:
    def __init__(self, db: Database, forget: ForgetService) -> None:
        self.db = db
        self.forget = forget

    async def receive(self, raw: bytes, headers: Mapping[str, str]) -> str:
        """Verify, deduplicate and queue; returns the forget job's id."""
        tenant_id = await self._verify(raw, headers)
        webhook_id = headers["webhook-id"]
        try:
            flag = DetectorWebhook.model_validate_json(raw)
        except ValidationError as exc:
            raise InvalidRequest(
                "the webhook body does not match the detector schema",
                errors=[{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()],
            ) from None
        async with self.db.transaction() as tx:
            earlier = await jobs_repo.delivery_job(tx, tenant_id, webhook_id)
        if earlier is not None:
            return earlier
        target = Target(artifact_id=flag.artifact_id, session_id=flag.session_id, text=flag.text)
        if flag.artifact_id is None and flag.text is None:
            raise InvalidRequest("a detector flag names the flagged artifact_id, a text span, or both")
        if flag.artifact_id is not None and flag.text is not None:
            # The span inside the flagged observation: forget the span where it occurs in the session.
            target = Target(session_id=flag.session_id, text=flag.text)
        strategy = STRATEGIES[STRATEGY]
        await self.forget.validate(tenant_id, target, strategy)
        reason = f"detector {flag.detector}" + (f" (score {flag.score:.3f})" if flag.score is not None else "")
        async with self.db.transaction() as tx:
            if await jobs_repo.record_delivery(tx, tenant_id, webhook_id):
                forget_id = await self.forget.enqueue_in(tx, tenant_id, target, strategy, reason)
                await jobs_repo.link_delivery(tx, tenant_id, webhook_id, forget_id)
            else:  # a concurrent delivery of the same webhook-id won the insert; it committed its job
                existing = await jobs_repo.delivery_job(tx, tenant_id, webhook_id)
                if existing is None:
                    raise InvalidRequest("this webhook-id was already delivered and started no forget")
                forget_id = existing
        self.forget.notify()
        log.info("detector webhook accepted", extra={"forget_id": forget_id, "detector": flag.detector})
        return forget_id

    async def _verify(self, raw: bytes, headers: Mapping[str, str]) -> str:
        """The tenant whose secret signed this delivery; 401 for anything that does not verify."""
        session_id = _session_id(raw)
        tenant_id = secret = None
        if session_id is not None:
            async with self.db.transaction() as tx:
                tenant_id = await sessions_repo.tenant_of(tx, session_id)
                if tenant_id is not None:
                    secret = await jobs_repo.tenant_secret(tx, tenant_id)
        if tenant_id is None or secret is None:
            raise Unauthorized("the webhook cannot be verified", headers={"WWW-Authenticate": "Signature"})
        wanted = ("webhook-id", "webhook-timestamp", "webhook-signature")
        try:
            Webhook(secret).verify(raw, {k: headers[k] for k in wanted if k in headers}, json_parse=False)
        except Exception:  # WebhookVerificationError, or a malformed header the package trips over
            raise Unauthorized(
                "bad webhook signature or a timestamp more than 5 minutes off",
                headers={"WWW-Authenticate": "Signature"},
            ) from None
        return tenant_id


def _session_id(raw: bytes) -> str | None:
    try:
        body: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    value = body.get("session_id") if isinstance(body, dict) else None
    return value if isinstance(value, str) and len(value) <= 64 else None
