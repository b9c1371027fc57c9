"""Forget jobs at rest: what a forget names (its target's words, its reason) sealed under the job's own leaf.

A forget's target is what it forgets: a text span, a keyword, a query (the words a semantic deletion matches). Stored
in the clear, the request would outlive the content it erased in every copy of the database. So a job holding any
(and any reason, a client's or a detector's) gets one leaf, drawn from the tenant's forget stream, seals the whole
target (`target_sealed`, JSON) and the reason (`reason_sealed`, UTF-8) under it, each bound to (tenant,
"forget_jobs", job id, column), and keeps in the clear column `target` only what is not content (`clear_target`):
ids (session, artifact, memory namespace and key: the names memory_records keeps in the clear, so listings can still
filter on them), a query's threshold, and the sealed words' lengths (which the ciphertext's length gives away).

While a job waits on its client (`needs_input`), its receipt holds content too: the call the counterfactual makes
(its arguments) and the client's tool results. Those members are sealed under the same leaf (`receipt_sealed`,
`seal_receipt`), the rest of the receipt (ids, counts, digests) stays in the clear.

The leaf lives as long as the job does: when it ends (succeeded or failed) the leaf joins the job's shred set and the
ciphertexts are dropped, and the job's views show `target_erased` with the id-only target. A job whose target is ids
only and has no reason has nothing to seal and no leaf (a memory DELETE's cascade job). Rows written before
migration 0019 hold plaintext (`leaf` NULL) and read as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy.orm.attributes import set_committed_value

from app.db.models import ForgetJob
from app.keys.content import Sealer
from app.keys.envelope import Binding
from app.keys.errors import Erased
from app.keys.sealed import SealedColumn

TABLE = "forget_jobs"
STREAM = "forget_jobs"  # the Leaves stream: a tenant's jobs get neighbouring leaves
CONTENT: Final = ("text", "keyword", "query")  # the target members holding words to forget
RECEIPT_CONTENT: Final = ("pending", "inputs")  # the receipt's (JobReceipt.stored) call waited on, tool results given
ENDED: Final = ("succeeded", "failed")  # a job's target is no longer needed (needs_input runs again)


def binding(tenant_id: str, job_id: str, column: str) -> Binding:
    return Binding(tenant_id, TABLE, job_id, column)


# What `lethe keys verify` checks of forget jobs (app/keys/sealed.py): every live job holding a ciphertext.
SEALED_COLUMNS = (
    SealedColumn(TABLE, ("id",), ("target_sealed", "reason_sealed", "receipt_sealed"),
                 lambda row, column: binding(row["tenant_id"], row["id"], column.removesuffix("_sealed"))),
)


def clear_target(target: dict[str, Any]) -> dict[str, Any]:
    """The target without its words: each replaced by its length (no hash either: a short secret such as an account
    number falls to a dictionary attack on its hash). Idempotent: a target already cleared is returned as it is."""
    out = dict(target)
    for name in CONTENT:
        value = target.get(name)
        if value is not None:
            out[name] = None
            out[f"{name}_length"] = len(value)
    return out


def holds_content(target: dict[str, Any], reason: str | None) -> bool:
    return reason is not None or any(target.get(name) is not None for name in CONTENT)


async def seal_job(
    sealer: Sealer | None, tenant_id: str, job_id: str, target: dict[str, Any], reason: str | None, *,
    leaf: int | None = None,
) -> dict[str, Any]:
    """The job's columns for `target` and `reason`: ciphertext under `leaf` (None: a fresh one) and the id-only
    target in the clear, or the target in the clear when neither holds content (no leaf then, no sealer needed).
    `Unavailable` when the key provider is down: the caller writes nothing."""
    if not holds_content(target, reason):
        return {"target": target, "reason": None, "target_sealed": None, "reason_sealed": None, "leaf": leaf}
    if sealer is None:
        raise RuntimeError("no Sealer: a forget job's target and reason cannot be stored")
    if leaf is None:
        leaf = await sealer.leaf(tenant_id, STREAM)
    sealed_reason = None
    if reason is not None:
        sealed_reason = await sealer.seal_bytes(leaf, binding(tenant_id, job_id, "reason"), reason.encode())
    return {
        "target": clear_target(target),
        "target_sealed": await sealer.seal_json(leaf, binding(tenant_id, job_id, "target"), target),
        "reason": None,
        "reason_sealed": sealed_reason,
        "leaf": leaf,
    }


async def seal_receipt(sealer: Sealer, job: ForgetJob, receipt: dict[str, Any]) -> dict[str, Any]:
    """The receipt's columns for `job` (a row as stored): its content members sealed under the job's leaf (drawn
    when the job has none yet: its target was ids only), the rest in the clear."""
    content = {name: receipt[name] for name in RECEIPT_CONTENT if receipt.get(name)}
    clear = {name: value for name, value in receipt.items() if name not in RECEIPT_CONTENT}
    if not content:
        return {"receipt": clear, "receipt_sealed": None}
    leaf = job.leaf if job.leaf is not None else await sealer.leaf(job.tenant_id, STREAM)
    sealed = await sealer.seal_json(leaf, binding(job.tenant_id, job.id, "receipt"), content)
    return {"receipt": clear, "receipt_sealed": sealed, "leaf": leaf}


def opened_as(job: ForgetJob, target: dict[str, Any], reason: str | None) -> None:
    """Give the row its plaintext target and reason as committed values: a flush never writes them back."""
    set_committed_value(job, "target", target)
    set_committed_value(job, "reason", reason)


async def open_jobs(sealer: Sealer, rows: Sequence[ForgetJob]) -> list[ForgetJob]:
    """`rows` with their target and reason opened in place. A job that ended, or whose leaf was shredded (a backup
    restored from before its end), comes back `target_erased`, its clear id-only target and no reason. `Tampered`
    (a ciphertext moved from another row) propagates: loud, never erased."""
    for row in rows:
        row.target_erased = row.leaf is not None and row.status in ENDED
        if row.target_erased or (row.target_sealed is None and row.reason_sealed is None
                                 and row.receipt_sealed is None):
            continue  # a row from before 0019, an ended job, or nothing sealed
        try:
            target = row.target
            if row.target_sealed is not None:
                target = await sealer.open_json(binding(row.tenant_id, row.id, "target"), row.target_sealed)
            reason = None
            if row.reason_sealed is not None:
                reason = (await sealer.open_bytes(binding(row.tenant_id, row.id, "reason"), row.reason_sealed)).decode()
            receipt = row.receipt
            if row.receipt_sealed is not None:
                content = await sealer.open_json(binding(row.tenant_id, row.id, "receipt"), row.receipt_sealed)
                receipt = {**row.receipt, **content}
        except Erased:
            row.target_erased = True
            continue
        opened_as(row, target, reason)
        set_committed_value(row, "receipt", receipt)
    return list(rows)
