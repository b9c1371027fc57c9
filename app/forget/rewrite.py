"""Forgetting without replay: edit the log in place and re-prefill the cache from the first edit.

What the paper's cheaper baselines do (and the DeLLM policy in a full-context session): delete artifacts, redact
text inside them, or append an instruction, and regenerate nothing. The remaining artifacts keep their ids and
positions; their token spans are re-tiled so they still cover the prompt from 0 without gaps, and the cache is
cropped to the last chunk boundary before the first edit and the rest prefilled in one chunk, which the edited
transition's recipe records so any process can rebuild the same cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.db.models import AgentSession, Artifact
from app.forget.replay import Rebuilt, entries_of, observation_of
from app.runtime.blocks import MODEL_KINDS, Observation, assistant_block, render
from app.runtime.records import chunk_recipe, stored_log
from app.runtime.routing import route_of
from app.runtime.transition import Machinery, SessionPolicy, SessionState, TransitionInput, step


@dataclass
class Rewritten:
    deleted: list[str] = field(default_factory=list)
    updated: list[dict[str, Any]] = field(default_factory=list)  # rows whose content, tokens, span or meta changed
    inserted: list[dict[str, Any]] = field(default_factory=list)  # regenerated outputs (a retrieval session's forget)
    edges: list[dict[str, Any]] = field(default_factory=list)  # the inserted rows' provenance
    transitions: int = 0  # outputs regenerated
    decoded: int = 0
    verified: int = 0
    modes: dict[str, str] = field(default_factory=dict)  # regenerated replies: receipts.replay_mode
    token_count: int = 0
    first_turn: int | None = None  # the first transition the rewrite touched (its checkpoints and later are stale)
    system_prompt: str | None = None
    prefilled: int = 0
    reused: int = 0


async def rewrite(
    m: Machinery,
    session: AgentSession,
    rows: Sequence[Artifact],
    *,
    drop: set[str],
    edits: dict[str, str | None],
    redact: str | None = None,
    holds_log: bool,
) -> Rewritten:
    """Delete `drop`, apply `edits` to observations, strip `redact` from every remaining artifact; re-tile and
    re-prefill (only a cache that `holds_log`: a retrieval session's holds its preamble alone, runtime/retrieval.py,
    so there is nothing to re-prefill and no recipe to keep)."""
    chat = m.engine.chat
    out = Rewritten(system_prompt=session.system_prompt)
    offset = 0
    first_change: int | None = None
    kept: list[dict[str, Any]] = []
    for row in rows:
        if row.id in drop or (row.id in edits and edits[row.id] is None):
            out.deleted.append(row.id)
            first_change = row.token_start if first_change is None else first_change
            out.first_turn = row.turn if out.first_turn is None else min(out.first_turn, row.turn)
            if row.kind == "system":
                out.system_prompt = None
            continue
        content = edits.get(row.id) or row.content
        if redact:
            content = content.replace(redact, "")
        tokens = list(row.token_ids)
        if content != row.content:
            if row.kind in MODEL_KINDS:
                tokens = assistant_block(chat, content, chat.encode(content)).token_ids
            else:
                tokens = render(chat, observation_of(row, content)).token_ids
            if row.kind == "system":
                out.system_prompt = content
        end = offset + len(tokens)
        if tokens != list(row.token_ids) or offset != row.token_start:
            first_change = offset if first_change is None else first_change
            out.first_turn = row.turn if out.first_turn is None else min(out.first_turn, row.turn)
        kept.append({"row": row, "content": content, "token_ids": tokens, "token_start": offset, "token_end": end})
        offset = end
    out.token_count = offset
    if first_change is None:
        return out
    boundary = _chunk_boundary(rows, first_change) if holds_log else first_change
    tokens = [t for k in kept for t in k["token_ids"]]
    for item in kept:
        row = item["row"]
        meta = dict(row.meta or {})
        if item["token_end"] > boundary:
            meta.pop("chunks", None)  # recipes past the edit describe a cache that no longer exists
        item["meta"] = meta
    if holds_log:
        if kept and len(tokens) > boundary:
            kept[-1]["meta"]["chunks"] = chunk_recipe(boundary, [len(tokens) - boundary])
        out.reused, out.prefilled = await _reprefill(m, session, tokens, boundary)
    out.updated = [
        {"id": k["row"].id, "content": k["content"], "token_ids": k["token_ids"], "token_start": k["token_start"],
         "token_end": k["token_end"], "meta": k["meta"],
         **({"embedding": None} if k["content"] != k["row"].content else {})}
        for k in kept
        if k["token_end"] > boundary or k["content"] != k["row"].content
    ]
    return out


def _chunk_boundary(rows: Sequence[Artifact], position: int) -> int:
    """The last chunk boundary of the stored recipe at or before token `position`."""
    boundary = 0
    for size in stored_log(entries_of(rows)).recipe:
        if boundary + size > position:
            break
        boundary += size
    return boundary


async def _reprefill(m: Machinery, session: AgentSession, tokens: list[int], boundary: int) -> tuple[int, int]:
    """Crop the session's cache to `boundary` and prefill the rewritten rest in one chunk; (reused, prefilled)."""
    key = route_of(session)
    handle = await m.handles.checkout(key)
    if handle is None or handle.tokens[:boundary] != tokens[:boundary] or len(handle.tokens) < boundary:
        if handle is not None:
            await m.handles.drop(key)
        return 0, 0  # nothing resident: the next turn rebuilds along the recipe, paying then
    await m.engine.crop(handle, boundary)
    rest = tokens[boundary:]
    prefilled = (await m.engine.prefill(handle, rest)).prefilled if rest else 0
    return boundary, prefilled


async def append_instruction(
    m: Machinery, policy: SessionPolicy, session: AgentSession, rows: Sequence[Artifact], instruction: str
) -> Rebuilt:
    """One more transition holding a user message and no reply (the forget-instruction baseline)."""
    turn = session.turns + 1
    state = SessionState(entries_of(rows), max((r.position for r in rows), default=-1) + 1)
    block = render(m.engine.chat, Observation("user", instruction))
    done = await step(m, session, policy, state, TransitionInput(turn, [block], generate=False))
    return Rebuilt(
        from_turn=turn, steps=[done], token_count=done.records.token_count, system_prompt=session.system_prompt,
        reused=done.usage.reused_tokens, prefilled=done.usage.prefill_tokens, transitions=1,
    )
