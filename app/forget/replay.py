"""Algorithm 1, lines 4-9 on the engine: restore by crop, then replay the transitions with sanitized observations.

Given a session's artifacts, the located target and a restore point c (a checkpoint before τ):

- transitions ≤ c are kept: their artifacts stay, and the cache is cropped to their end (Lemma 1: a crop restores);
- transitions c+1 .. from_turn-1 (the gap a coarse checkpoint policy leaves) are clean: their artifacts stay and
  the cache re-prefills their recorded tokens along their recorded chunks, which reproduces it bit for bit;
- transitions from_turn .. T are replayed through the runtime's own transition function (transition.advance) with
  the sanitized observations, the same per-transition seeds (sampling_for) and the same records (records_for), so a
  replayed transition is the one the session would have run had it never seen the target. Observations the forget
  did not touch keep their artifact ids; a transition whose observations held only the target becomes an empty
  transition that keeps its index.

Nothing is written here: the caller swaps the result in, in one transaction (executor.py).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.db.models import AgentSession, Artifact
from app.db.repositories.artifacts import LogEntry
from app.engine.protocol import CacheHandle, KVEngine
from app.forget.closure import Restore
from app.forget.locate import Located
from app.runtime import checkpoints
from app.runtime.blocks import MODEL_KINDS, Observation, render
from app.runtime.compaction import LiveRow, compact, summary_room
from app.runtime.context import policy_for
from app.runtime.handles import HandleRegistry
from app.runtime.records import RUNTIME_META, log_entries, records_for, stored_log
from app.runtime.salts import route_of, salt_of
from app.runtime.tooling import ToolContext, advance_with_tools
from app.runtime.tools import declared
from app.runtime.transition import Synced, Usage, check_room, sampling_for, sync
from app.tool_calls import ToolCall

# Meta keys the runtime adds for itself; the rest came with the observation and is rendered again with it.


@dataclass
class Rebuilt:
    """A session's rebuilt suffix, ready to swap in: everything of transitions ≥ from_turn is replaced."""

    from_turn: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    edges: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[checkpoints.Boundary] = field(default_factory=list)
    token_count: int = 0
    system_prompt: str | None = None
    reused: int = 0
    prefilled: int = 0
    decoded: int = 0
    transitions: int = 0  # transitions recomputed (re-prefilled or regenerated)
    restored_from: Restore | None = None  # the checkpoint whose prefix was reused (None: nothing was)
    handle: CacheHandle | None = None
    environments: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (turn, state) snapshots
    archive_existing: list[tuple[str, int]] = field(default_factory=list)  # kept rows a replayed compaction archives
    suppressed: list[ToolCall] = field(default_factory=list)  # consequential calls the replay did not fire
    committed_dropped: list[ToolCall] = field(default_factory=list)  # fired calls the counterfactual no longer makes


class NeedsInput(Exception):
    """The counterfactual makes a read-only call the client must answer (the original made another): the job waits
    for the client's result, then replays again with it."""

    def __init__(self, session_id: str, call: ToolCall) -> None:
        super().__init__(call.id)
        self.session_id = session_id
        self.call = call


def entries_of(rows: Sequence[Artifact]) -> list[LogEntry]:
    return [
        LogEntry(
            r.id, r.kind, r.turn, r.position, r.token_start, r.token_end, list(r.token_ids), list(r.source_ids),
            (r.meta or {}).get("chunks"),
        )
        for r in rows
    ]


def observation_of(row: Artifact, content: str) -> Observation:
    meta = {k: str(v) for k, v in (row.meta or {}).items() if k not in RUNTIME_META}
    return Observation(row.kind, content, meta)


async def replay(
    engine: KVEngine,
    handles: HandleRegistry,
    session: AgentSession,
    rows: Sequence[Artifact],
    located: Located,
    restore: Restore,
    *,
    from_turn: int,
    tools: ToolContext | None = None,
    cold: bool = False,
) -> Rebuilt:
    """Rebuild transitions from_turn..T after restoring to `restore`. `tools`: the session's tools with the
    environment as it stood before from_turn. `cold`: ignore any cached state (the full reset baseline)."""
    chat = engine.chat
    out = Rebuilt(from_turn=from_turn, system_prompt=session.system_prompt, restored_from=None if cold else restore)
    kept = live_before(rows, from_turn)
    log = entries_of(kept)
    live_rows = [LiveRow.of(r) for r in kept]  # the live prompt with contents, for a replayed compaction
    next_position = max((r.position for r in rows if r.turn < from_turn), default=-1) + 1
    handle = None if cold else handles.get(session.id)
    if cold:
        stale = handles.pop(session.id)
        if stale is not None:
            await engine.release(stale)
    clean = [t for entry in log for t in entry.token_ids]
    if handle is not None:
        offset = restore.token_offset
        if len(handle.tokens) >= offset and handle.tokens[:offset] == clean[:offset]:
            await engine.crop(handle, offset)  # the restore (Lemma 1)
        else:
            handle = None  # this process's cache disagrees with the database: rebuild from the recipe
    synced = await sync(engine, handle, route_of(session), salt_of(session), stored_log(log))
    handles.put(session.id, synced.handle)
    out.handle = synced.handle
    restore_prefilled = synced.prefilled
    first_usage: Usage | None = None
    by_turn: dict[int, list[Artifact]] = {}
    for row in rows:
        if row.turn >= from_turn:
            by_turn.setdefault(row.turn, []).append(row)
    out.transitions = session.turns - restore.turn
    live_calls = {_call_id(r) for r in kept if r.kind == "tool_call"}
    provided: list[Observation] = []  # the client's answers to calls the counterfactual makes anew
    for turn in range(from_turn, session.turns + 1):
        originals = by_turn.get(turn, [])
        observed, keep_ids, edited = _sanitized(originals, located, live_calls, tools)
        observed, keep_ids = [*provided, *observed], [*(None for _ in provided), *keep_ids]
        provided = []
        had_reply = any(r.kind in MODEL_KINDS and r.kind != "tool_call" for r in originals)
        blocks = [render(chat, o) for o in observed]
        summary = next((r for r in originals if r.kind == "summary"), None)
        if summary is not None:
            # A compaction transition: run it again over the replayed prompt, with the same seed and policy.
            done = await compact(
                engine, synced, live_rows, tenant_id=session.tenant_id, session_id=session.id, turn=turn,
                sampling=sampling_for(session.sampling, turn, summary_room(engine, log[-1].token_end if log else 0)),
                keep_last_turns=int((summary.meta or {}).get("keep_last_turns", 0)), next_position=next_position,
            )
            planned = {r["id"]: r for r in out.rows}
            for artifact_id in done.archived:
                if artifact_id in planned:
                    planned[artifact_id]["archived_by"] = turn
                else:
                    out.archive_existing.append((artifact_id, turn))
            head = [e for e in log if e.turn == 0]
            log = [*head, *log_entries(done.rows)]
            live_rows = [*(r for r in live_rows if r.turn == 0), *(LiveRow.of(r) for r in done.rows)]
            out.rows.extend(done.rows)
            out.edges.extend(done.edges)
            next_position += len(done.rows)
            assert done.usage is not None
            first_usage = first_usage or done.usage
            out.prefilled += done.usage.prefill_tokens + done.usage.closing_tokens
            out.decoded += done.usage.decode_tokens
            synced = Synced(synced.handle, [], 0)
            manifest = [(e.id, e.token_start, e.token_end) for e in log]
            marks = checkpoints.for_transition(session.checkpoint_policy, turn, ["summary"], [], manifest)
            out.checkpoints.extend(marks)
            continue
        if turn == 0:
            # The system block: written at creation without an engine call; it waits as pending tokens.
            records = records_for(
                session.tenant_id, session.id, 0, log, blocks, None, policy_for(session.context_policy), keep_ids
            )
            synced.pending.extend(t for b in blocks for t in b.token_ids)
            out.system_prompt = next((o.content for o in observed if o.kind == "system"), None)
            marks = checkpoints.at_session_start(session.checkpoint_policy, records.manifest_after)
        else:
            if (edited and not observed) or (not observed and not had_reply):
                records = records_for(
                    session.tenant_id, session.id, turn, log, [], None, policy_for(session.context_policy)
                )
            else:
                log_tokens = log[-1].token_end if log else 0
                room = check_room(engine, log_tokens, sum(len(b.token_ids) for b in blocks), had_reply)
                sampling = sampling_for(session.sampling, turn, room) if had_reply else None
                sources = frozenset(s for entry in log for s in entry.source_ids)
                outcome, step = await advance_with_tools(engine, synced, blocks, sampling, tools, turn, sources)
                live_calls.update(c.id for c in step.calls)
                if tools is not None and step.env_changed:
                    out.environments.append((turn, copy.deepcopy(tools.env)))
                provided = _answers_needed(session, turn, step.pending, tools)
                records = records_for(
                    session.tenant_id, session.id, turn, log, outcome.blocks, outcome,
                    policy_for(session.context_policy), keep_ids,
                )
                usage = outcome.usage
                first_usage = first_usage or usage
                out.prefilled += usage.prefill_tokens + usage.closing_tokens
                out.decoded += usage.decode_tokens
                synced = Synced(synced.handle, [], 0)
            marks = checkpoints.for_transition(
                session.checkpoint_policy, turn, records.kinds, records.manifest_before, records.manifest_after
            )
        out.rows.extend(records.artifacts)
        out.edges.extend(records.edges)
        out.checkpoints.extend(marks)
        log.extend(log_entries(records.artifacts))
        live_rows.extend(LiveRow.of(r) for r in records.artifacts)
        next_position += len(records.artifacts)
    if tools is not None and tools.replay is not None:
        out.suppressed = list(tools.replay.suppressed)
        out.committed_dropped = [
            ToolCall(_call_id(r), str((r.meta or {}).get("name", "")), {})
            for r in rows
            if r.turn >= from_turn and r.kind == "tool_call" and r.committed and _call_id(r) not in live_calls
        ]
    if first_usage is None:  # every replayed transition was empty: only the restore computed anything
        out.prefilled += restore_prefilled
        out.reused = max(0, len(synced.handle.tokens) - restore_prefilled)
    else:
        out.reused = first_usage.reused_tokens
    out.token_count = log[-1].token_end if log else 0
    return out


def live_before(rows: Sequence[Artifact], turn: int) -> list[Artifact]:
    """The live prompt as it stood when transition `turn` began: rows of earlier transitions that no compaction
    before `turn` had archived (a compaction at or after `turn` is replayed, so what it archived was live then)."""
    return [r for r in rows if r.turn < turn and (r.archived_by is None or r.archived_by >= turn)]


def _call_id(row: Artifact) -> str:
    return str((row.meta or {}).get("tool_call_id", ""))


def _answers_needed(
    session: AgentSession, turn: int, pending: Sequence[ToolCall], tools: ToolContext | None
) -> list[Observation]:
    """For each client read-only call the counterfactual makes anew: the client's answer (provided to the job) as
    an input of the next transition; without one, NeedsInput, unless nothing follows (the call then stays
    pending in the session, as it would in the counterfactual)."""
    if tools is None or tools.replay is None:
        return []
    answers: list[Observation] = []
    for call in pending:
        spec = declared(tools.tools, call.name)
        if call.id in tools.replay.original_calls or spec is None or spec.get("kind") != "read_only":
            continue
        if call.id in tools.replay.provided:
            answers.append(Observation("tool_result", tools.replay.provided[call.id], {"tool_call_id": call.id}))
        elif turn < session.turns:
            raise NeedsInput(session.id, call)
    return answers


def _sanitized(
    originals: Sequence[Artifact], located: Located, live_calls: set[str], tools: ToolContext | None
) -> tuple[list[Observation], list[str | None], bool]:
    """A transition's observations with the target removed; the ids they keep (None: a sanitized observation is a
    new artifact); whether the forget touched any of them. Results the server's tools produced are not inputs
    (the replayed reply's calls produce them again); a client's result for a call the counterfactual no longer
    makes is dropped, as that client would never have sent it."""
    observed: list[Observation] = []
    keep_ids: list[str | None] = []
    edited = False
    originals_calls = tools.replay.original_calls if tools is not None and tools.replay is not None else set()
    for row in originals:
        if row.kind in MODEL_KINDS or (row.meta or {}).get("server"):
            continue
        if row.kind == "tool_result" and _call_id(row) in originals_calls and _call_id(row) not in live_calls:
            edited = True
            continue
        if row.id in located.edits:
            edited = True
            content = located.edits[row.id]
            if content is not None:
                observed.append(observation_of(row, content))
                keep_ids.append(None)
        else:
            observed.append(observation_of(row, row.content))
            keep_ids.append(row.id)
    return observed, keep_ids, edited
