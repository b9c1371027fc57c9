"""Detector webhooks: a prompt-injection detector flags an observation, and the flag starts a forget.

Standard Webhooks scheme, verified with the `standardwebhooks` package against the secret of the tenant that owns
the named session: `webhook-id`, `webhook-timestamp` (more than 5 minutes off: rejected) and `webhook-signature`
(`v1,<base64 HMAC-SHA256(secret, "{id}.{timestamp}.{raw body}")>`).

What an unverified delivery can make the service do. The secret is per tenant and the delivery names a session,
not a tenant, so the secret has to be looked up; everything that can be checked without it is checked first, in
memory: the three headers present, the timestamp a number within the tolerance, a `v1` signature of the right size
(an unsigned or malformed-signature delivery never gets further), and the body a JSON object whose `session_id`
could be an id this service issued (`app/ids.py plausible`: 1-40 letters, digits, `_` and `-`, so no NUL, surrogate
or oversized text can reach a statement and make it fail). Only then one read-only statement fetches the owning
tenant's id and secret by that id; nothing else the delivery holds reaches SQL before its signature verified. After
verification a `webhook-id` longer than its column (200 characters) and a body the schema refuses (a NUL in the
text span, for one) answer 422 problems; nothing is stored for them.

Redelivery is safe: the delivery row (tenant, webhook-id) and the job it starts are inserted in one transaction, so
the same webhook-id answers the same job, also when two deliveries race (the second insert waits for the first).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from standardwebhooks import Webhook

from app.db.database import Database
from app.engine.priority import Priority
from app.errors import InvalidRequest, Unauthorized
from app.forget.locate import Target
from app.forget.repositories import jobs as jobs_repo
from app.forget.service import ForgetService
from app.forget.strategies import STRATEGIES
from app.ids import plausible
from app.tenants import repository as tenants_repo
from app.text import storable
from app.webhooks.schemas import DetectorWebhook

log = logging.getLogger(__name__)

STRATEGY = "selective_replay"
WEBHOOK_ID_MAX = 200  # webhook_deliveries.webhook_id


class DetectorWebhooks:
    def __init__(self, db: Database, forget: ForgetService) -> None:
        self.db = db
        self.forget = forget

    async def receive(self, raw: bytes, headers: Mapping[str, str]) -> str:
        """Verify, deduplicate and queue; returns the forget job's id."""
        tenant_id = await self._verify(raw, headers)
        webhook_id = headers["webhook-id"]
        if len(webhook_id) > WEBHOOK_ID_MAX or not storable(webhook_id):
            raise InvalidRequest(
                f"webhook-id must be at most {WEBHOOK_ID_MAX} characters",
                errors=[{"loc": ["header", "webhook-id"], "msg": "too long or not storable", "type": "webhook_id"}],
            )
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
        strategy = STRATEGIES.named(STRATEGY)
        await self.forget.validate(tenant_id, target, strategy)
        reason = f"detector {flag.detector}" + (f" (score {flag.score:.3f})" if flag.score is not None else "")
        async with self.db.transaction() as tx:
            if await jobs_repo.record_delivery(tx, tenant_id, webhook_id):
                # A suspected injection: its replay goes ahead of every live turn and of any other forget.
                forget_id = await self.forget.enqueue_in(
                    tx, tenant_id, target, strategy, reason, priority=Priority.DETECTOR
                )
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
        session_id = _precheck(raw, headers)
        async with self.db.transaction() as tx:
            owner = await tenants_repo.webhook_owner(tx, session_id)
        secret = None if owner is None else owner[1]
        if owner is None or secret is None:
            raise _unverified("the webhook cannot be verified")
        tenant_id = owner[0]
        wanted = ("webhook-id", "webhook-timestamp", "webhook-signature")
        try:
            Webhook(secret).verify(raw, {k: headers[k] for k in wanted}, json_parse=False)
        except Exception:  # WebhookVerificationError, or a malformed header the package trips over
            raise _unverified("bad webhook signature or a timestamp more than 5 minutes off") from None
        return tenant_id


def _unverified(detail: str) -> Unauthorized:
    return Unauthorized(detail, headers={"WWW-Authenticate": "Signature"})


_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_SIGNATURE = re.compile(r"v1,[A-Za-z0-9+/]{43}=?")  # base64 of a 32-byte HMAC-SHA256
TOLERANCE_S = 5 * 60  # the standardwebhooks package's tolerance


def _precheck(raw: bytes, headers: Mapping[str, str]) -> str:
    """Everything about a delivery that can be checked without its tenant's secret, in memory (see the module
    docstring); returns the session id to look the secret up by, or raises 401."""
    webhook_id, timestamp, signature = (headers.get(k, "") for k in ("webhook-id", "webhook-timestamp",
                                                                      "webhook-signature"))
    if not webhook_id or not any(_SIGNATURE.fullmatch(s) for s in signature.split(" ")):
        raise _unverified("the webhook is not signed (webhook-id and a v1 webhook-signature are required)")
    if not _TIMESTAMP.fullmatch(timestamp) or abs(time.time() - int(timestamp)) > TOLERANCE_S:
        raise _unverified("webhook-timestamp is missing or more than 5 minutes off")
    session_id = _session_id(raw)
    if session_id is None:
        raise _unverified("the webhook cannot be verified")
    return session_id


def _session_id(raw: bytes) -> str | None:
    try:
        body: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    value = body.get("session_id") if isinstance(body, dict) else None
    return value if isinstance(value, str) and plausible(value) else None
