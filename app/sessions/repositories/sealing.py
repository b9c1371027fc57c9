"""Session content at rest: an artifact's text, token ids and embedding, sealed under the artifact's own leaf.

One leaf per artifact (docs/erasure-at-rest.md: one leaf = one erasure unit), drawn from the stream of its session
so a session's artifacts get neighbouring leaves (a forget of a suffix punctures a few subtrees). The three columns
are sealed under it, each bound to (tenant, "artifacts", artifact id, column): a ciphertext copied to another
artifact, column or tenant does not open (`Tampered`); one whose leaf a forget shredded reads as erased. Token ids
are packed as little-endian int32, embeddings as little-endian float32, so what is sealed is exactly what the
plaintext columns held.

`meta` stays in the clear (ids the database filters on, the runtime's bookkeeping) but for the members a client
wrote (`CLIENT_META`: a document's `source` label), sealed since migration 0021 under the same leaf in `meta_sealed`
(column "meta") and merged back into `meta` when the row is opened.

Rows written before migration 0017 hold plaintext (`leaf` NULL) and read as before until the online migration seals
them. The process's `Sealer` reaches these helpers as an argument, from the service that holds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from sqlalchemy.orm.attributes import set_committed_value

from app.db.models import Artifact
from app.keys.content import Sealer
from app.keys.envelope import Binding
from app.keys.errors import Erased
from app.keys.sealed import SealedColumn

TABLE = "artifacts"
CLIENT_META = ("source",)  # members of `meta` a client wrote: sealed (the rest are ids and bookkeeping)
_INT32 = np.dtype("<i4")
_FLOAT32 = np.dtype("<f4")


def binding(tenant_id: str, artifact_id: str, column: str) -> Binding:
    return Binding(tenant_id, TABLE, artifact_id, column)


# What `lethe keys verify` checks of session content (app/keys/sealed.py): every artifact holding a ciphertext.
SEALED_COLUMNS = (
    SealedColumn(TABLE, ("id",), ("content_sealed", "token_ids_sealed", "embedding_sealed", "meta_sealed"),
                 lambda row, column: binding(row["tenant_id"], row["id"], column.removesuffix("_sealed"))),
)


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    return np.asarray(token_ids, dtype=_INT32).tobytes()


def pack_vector(vector: Iterable[float]) -> bytes:
    return np.asarray(list(vector), dtype=_FLOAT32).tobytes()


def unpack_vector(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=_FLOAT32)


async def seal_content(
    sealer: Sealer, leaf: int, tenant_id: str, artifact_id: str, content: str, token_ids: Sequence[int]
) -> dict[str, Any]:
    """The columns of an artifact's text and tokens sealed under `leaf` (the plaintext columns emptied)."""
    return {
        "leaf": leaf,
        "content": None,
        "content_sealed": await sealer.seal_bytes(leaf, binding(tenant_id, artifact_id, "content"), content.encode()),
        "token_ids": None,
        "token_ids_sealed": await sealer.seal_bytes(
            leaf, binding(tenant_id, artifact_id, "token_ids"), pack_tokens(token_ids)
        ),
    }


async def seal_vector(sealer: Sealer, leaf: int, tenant_id: str, artifact_id: str, vector: Iterable[float] | None
                      ) -> dict[str, Any]:
    """The embedding columns: `vector` sealed under the artifact's `leaf`, or neither (None: computed on demand)."""
    if vector is None:
        return {"embedding": None, "embedding_sealed": None}
    sealed = await sealer.seal_bytes(leaf, binding(tenant_id, artifact_id, "embedding"), pack_vector(vector))
    return {"embedding": None, "embedding_sealed": sealed}


async def seal_meta(sealer: Sealer, leaf: int, tenant_id: str, artifact_id: str, meta: dict[str, Any] | None
                    ) -> dict[str, Any]:
    """The meta columns: the client's members (`CLIENT_META`) sealed under the artifact's `leaf`, the rest clear."""
    clear = {k: v for k, v in (meta or {}).items() if k not in CLIENT_META}
    private = {k: v for k, v in (meta or {}).items() if k in CLIENT_META}
    sealed = await sealer.seal_json(leaf, binding(tenant_id, artifact_id, "meta"), private) if private else None
    return {"meta": clear, "meta_sealed": sealed}


async def seal_rows(sealer: Sealer, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """New artifact rows as stored: each under a fresh leaf of its session's stream, only ciphertext."""
    out = []
    for row in rows:
        leaf = await sealer.leaf(row["tenant_id"], row["session_id"])
        tenant_id, artifact_id = row["tenant_id"], row["id"]
        sealed = {**row, **await seal_content(sealer, leaf, tenant_id, artifact_id, row["content"], row["token_ids"])}
        if "embedding" in row:
            sealed.update(await seal_vector(sealer, leaf, row["tenant_id"], row["id"], row["embedding"]))
        sealed.update(await seal_meta(sealer, leaf, tenant_id, artifact_id, row.get("meta")))
        out.append(sealed)
    return out


async def open_text(sealer: Sealer, tenant_id: str, artifact_id: str, plain: str | None, sealed: bytes | None) -> str:
    """An artifact's text from the columns selected (`Erased` propagates)."""
    if sealed is None:
        return plain or ""
    return (await sealer.open_bytes(binding(tenant_id, artifact_id, "content"), sealed)).decode()


async def open_tokens(
    sealer: Sealer, tenant_id: str, artifact_id: str, plain: list[int] | None, sealed: bytes | None
) -> list[int]:
    if sealed is None:
        return list(plain or [])
    data = await sealer.open_bytes(binding(tenant_id, artifact_id, "token_ids"), sealed)
    tokens: list[int] = np.frombuffer(data, dtype=_INT32).tolist()
    return tokens


async def open_vector(sealer: Sealer, tenant_id: str, artifact_id: str, plain: Any, sealed: bytes | None
                      ) -> np.ndarray | None:
    if sealed is None:
        return None if plain is None else np.asarray(plain, dtype=_FLOAT32)
    return unpack_vector(await sealer.open_bytes(binding(tenant_id, artifact_id, "embedding"), sealed))


async def open_artifacts(sealer: Sealer, rows: Sequence[Artifact]) -> list[Artifact]:
    """`rows` with their content, tokens and embedding opened in place, as committed values (a flush never writes
    them back). An artifact whose leaf was shredded (a backup restored from before its forget) comes back `erased`,
    with no text and no tokens: the caller renders it as erased and never hands it to an engine."""
    for row in rows:
        if row.leaf is None:
            continue
        try:
            content = await open_text(sealer, row.tenant_id, row.id, None, row.content_sealed)
            tokens = await open_tokens(sealer, row.tenant_id, row.id, None, row.token_ids_sealed)
            vector = await open_vector(sealer, row.tenant_id, row.id, None, row.embedding_sealed)
            if row.meta_sealed is not None:
                private = await sealer.open_json(binding(row.tenant_id, row.id, "meta"), row.meta_sealed)
                set_committed_value(row, "meta", {**(row.meta or {}), **private})
        except Erased:
            row.erased = True
            content, tokens, vector = "", [], None
        set_committed_value(row, "content", content)
        set_committed_value(row, "token_ids", tokens)
        set_committed_value(row, "embedding", vector)
    return list(rows)
