"""Compaction: a transition that replaces older turns with a model-written summary.

Compaction at transition c:

1. the model is asked for a summary of the live log (a user-role request after it; the request is not kept), with
   transition c's seed, like any reply;
2. the live prompt becomes: transition 0's blocks, the `summary` block (a system-role block), then *copies* of the
   last `keep_last_turns` transitions' artifacts (same tokens, `copy_of` the original);
3. everything after transition 0 that was live is *archived* (`archived_by = c`), not deleted: a forget whose target
   entered before c replays from there, compaction included, and needs the originals;
4. the cache is cropped to the end of transition 0 and the new blocks prefilled in one chunk.

The summary's provenance parents are the artifacts it summarized; a copy's parent is its original and it carries the
original's sources, so a forget of an original reaches its copy. The same function runs in a live turn and in a
replay, so a replayed compaction is the one the counterfactual session would have run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from app.engine.protocol import KVEngine, Sampling
from app.errors import Conflict
from app.ids import new_id
from app.runtime.blocks import Observation, render
from app.runtime.engine_calls import Synced, Usage, advance, check_room
from app.runtime.records import RUNTIME_META, artifact_row, edge_row

SUMMARIZE: Final = (
    "Summarize our conversation so far in a few sentences. Keep every fact I told you; add nothing else."
)
SUMMARY_HEADER: Final = "Summary of the earlier conversation:\n"
DEFAULT_KEEP_LAST_TURNS: Final = 2  # the turns a compaction keeps verbatim unless the session or request says


@dataclass(frozen=True)
class LiveRow:
    """A live artifact as compaction sees it (from a stored row or one a replay just planned)."""

    id: str
    kind: str
    turn: int
    token_ids: list[int]
    source_ids: list[str]
    content: str
    meta: dict[str, Any]
    committed: bool = False

    @classmethod
    def of(cls, row: Any) -> LiveRow:
        if isinstance(row, dict):
            return cls(row["id"], row["kind"], row["turn"], list(row["token_ids"]), list(row["source_ids"]),
                       row["content"], dict(row["meta"]), bool(row.get("committed")))
        return cls(row.id, row.kind, row.turn, list(row.token_ids), list(row.source_ids), row.content,
                   dict(row.meta or {}), bool(row.committed))


@dataclass
class Compaction:
    rows: list[dict[str, Any]] = field(default_factory=list)  # the summary, then the copies: transition c
    edges: list[dict[str, Any]] = field(default_factory=list)
    archived: list[str] = field(default_factory=list)  # live artifacts taken out of the prompt
    usage: Usage | None = None
    token_count: int = 0
    summary_id: str = ""
    summary: str = ""


def split_older(live: Sequence[LiveRow], keep_last_turns: int) -> tuple[list[LiveRow], list[LiveRow], list[LiveRow]]:
    """(transition 0, the rows summarized, the rows kept as copies); 409 when there is nothing to summarize (a valid
    request the session's state cannot take)."""
    head = [r for r in live if r.turn == 0]
    body = [r for r in live if r.turn != 0]
    turns = sorted({r.turn for r in body})
    kept_turns = set(turns[len(turns) - keep_last_turns :]) if keep_last_turns else set()
    summarized = [r for r in body if r.turn not in kept_turns]
    if not summarized:
        raise Conflict(
            f"nothing to compact: the session has {len(turns)} turns since its start and keep_last_turns keeps them all"
        )
    return head, summarized, [r for r in body if r.turn in kept_turns]


async def compact(
    engine: KVEngine,
    synced: Synced,
    live: Sequence[LiveRow],
    *,
    tenant_id: str,
    session_id: str,
    turn: int,
    sampling: Sampling,
    keep_last_turns: int,
    next_position: int,
    draft: list[int] | None = None,
) -> Compaction:
    head, summarized, kept = split_older(live, keep_last_turns)
    chat = engine.chat
    request = render(chat, Observation("user", SUMMARIZE))
    outcome = await advance(engine, synced, [request], sampling, draft=draft)
    assert outcome.reply is not None
    text = outcome.reply.content.strip()
    head_end = sum(len(r.token_ids) for r in head)
    await engine.crop(synced.handle, head_end)  # transition 0 ends on a chunk boundary (transition.py)
    summary_tokens = chat.render_block("system", SUMMARY_HEADER + text)
    new_tokens = [*summary_tokens, *(t for r in kept for t in r.token_ids)]
    prefilled = (await engine.prefill(synced.handle, new_tokens)).prefilled if new_tokens else 0
    out = Compaction(archived=[r.id for r in live if r.turn != 0], summary=text, summary_id=new_id("art"))
    sources = list(dict.fromkeys(s for r in live for s in r.source_ids))
    offset, position = head_end, next_position
    pieces: list[tuple[str, str, str, list[int], list[str], dict[str, Any], bool]] = [
        (out.summary_id, "summary", text, summary_tokens, sources,
         {"keep_last_turns": keep_last_turns, "summarized": len(summarized)}, False),
    ]
    for row in kept:
        meta = {k: v for k, v in row.meta.items() if k not in RUNTIME_META}
        meta["copy_of"] = row.id
        pieces.append((new_id("art"), row.kind, row.content, row.token_ids, row.source_ids, meta, row.committed))
    for index, (artifact_id, kind, content, tokens, source_ids, meta, committed) in enumerate(pieces):
        if index == len(pieces) - 1:
            meta = {**meta, "chunks": {"at": 0, "sizes": [s for s in (head_end, len(new_tokens)) if s]}}
        out.rows.append(artifact_row(
            id=artifact_id, tenant_id=tenant_id, session_id=session_id, position=position, kind=kind, turn=turn,
            content=content, token_start=offset, token_ids=tokens, source_ids=source_ids, committed=committed,
            meta=meta,
        ))
        offset, position = offset + len(tokens), position + 1
    out.edges = [
        *(edge_row(session_id, r.id, out.summary_id, turn) for r in summarized),
        *(edge_row(session_id, r.id, copy["id"], turn) for r, copy in zip(kept, out.rows[1:], strict=True)),
    ]
    usage = outcome.usage
    out.usage = Usage(
        usage.prompt_tokens, usage.reused_tokens, usage.prefill_tokens, usage.decode_tokens,
        usage.closing_tokens + prefilled, usage.verified_tokens,
    )
    out.token_count = offset
    return out


def summary_room(engine: KVEngine, log_tokens: int) -> int | None:
    """The most tokens the summary may take (transition.check_room with the request's size), the same in a live
    compaction and its replay so both sample with the same max_tokens."""
    request = len(engine.chat.render_block("user", SUMMARIZE))
    return check_room(engine, log_tokens, request, True)
