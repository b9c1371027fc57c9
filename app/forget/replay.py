"""Algorithm 1, lines 4-9 on the engine: restore by crop, then replay the transitions with sanitized observations.

Given a session's artifacts, the located target and a restore point c (a checkpoint before τ):

- transitions ≤ c are kept: their artifacts stay, and the cache is cropped to their end (Lemma 1: a crop restores);
- transitions c+1 .. from_turn-1 (the gap a coarse checkpoint policy leaves) are clean: their artifacts stay and
  the first replayed transition re-prefills their recorded tokens along their recorded chunks (engine_calls.sync),
  which reproduces the cache bit for bit;
- transitions from_turn .. T are run again by the runtime's one transition function (runtime/transition.py) with the
  sanitized observations: the same policy, the same per-transition seeds, the same records and checkpoints as a turn,
  so a replayed transition is the one the session would have run had it never seen the target. Observations the
  forget did not touch keep their artifact ids; a transition whose observations held only the target becomes an
  empty transition that keeps its index.

Nothing is written here: the caller swaps the steps in with the turn's own writer, in one transaction (executor.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.db.models import AgentSession, Artifact
from app.engine.protocol import ChatTemplate
from app.forget.closure import Restore
from app.forget.locate import Located
from app.forget.receipts import replay_mode
from app.runtime.blocks import MODEL_KINDS, Observation, render, sampled_of
from app.runtime.compaction import LiveRow
from app.runtime.records import RUNTIME_META
from app.runtime.routing import route_of
from app.runtime.tool_catalog import declared
from app.runtime.tool_loop import ToolContext
from app.runtime.transition import Compaction, Machinery, SessionPolicy, SessionState, Step, TransitionInput, step
from app.sessions.repositories.artifacts import LogEntry
from app.tool_calls import ToolCall


@dataclass
class Rebuilt:
    """A session's rebuilt suffix, ready to swap in: everything of transitions ≥ from_turn is replaced by `steps`."""

    from_turn: int
    steps: list[Step] = field(default_factory=list)
    token_count: int = 0
    system_prompt: str | None = None
    reused: int = 0
    prefilled: int = 0
    decoded: int = 0
    verified: int = 0
    modes: dict[str, str] = field(default_factory=dict)  # replayed replies: receipts.replay_mode
    transitions: int = 0  # transitions recomputed (re-prefilled or regenerated)
    restored_from: Restore | None = None  # the checkpoint whose prefix was reused (None: nothing was)
    suppressed: list[ToolCall] = field(default_factory=list)  # consequential calls the replay did not fire
    committed_dropped: list[ToolCall] = field(default_factory=list)  # fired calls the counterfactual no longer makes

    @property
    def rows(self) -> list[dict[str, Any]]:
        return [r for s in self.steps for r in s.records.artifacts]


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
    m: Machinery,
    policy: SessionPolicy,
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
    out = Rebuilt(from_turn=from_turn, system_prompt=session.system_prompt, restored_from=None if cold else restore)
    kept = live_before(rows, from_turn)
    state = SessionState(entries_of(kept), max((r.position for r in rows if r.turn < from_turn), default=-1) + 1)
    live_rows = [LiveRow.of(r) for r in kept]  # the live prompt with contents, for a replayed compaction
    restored = await _restore(m, session, state, restore, cold=cold)
    by_turn: dict[int, list[Artifact]] = {}
    for row in rows:
        if row.turn >= from_turn:
            by_turn.setdefault(row.turn, []).append(row)
    out.transitions = session.turns - restore.turn
    live_calls = {_call_id(r) for r in kept if r.kind == "tool_call"}
    provided: list[Observation] = []  # the client's answers to calls the counterfactual makes anew
    computed = False
    for turn in range(from_turn, session.turns + 1):
        originals = by_turn.get(turn, [])
        observed, keep_ids, edited = _sanitized(originals, located, live_calls, tools)
        observed, keep_ids = [*provided, *observed], [*(None for _ in provided), *keep_ids]
        provided = []
        had_reply = any(r.kind in MODEL_KINDS and r.kind != "tool_call" for r in originals)
        summary = next((r for r in originals if r.kind == "summary"), None)
        if summary is not None:  # a compaction transition: run again over the replayed prompt
            keep = int((summary.meta or {}).get("keep_last_turns", 0))
            # The summary's text stands for its sampled tokens (stored stripped): only ever a hint (KVEngine.generate).
            draft = m.engine.chat.encode(summary.content) if m.replay_verify else None
            t = TransitionInput(turn, compaction=Compaction(keep, list(live_rows)), draft=draft)
        elif turn != 0 and ((edited and not observed) or (not observed and not had_reply)):
            t = TransitionInput(turn, generate=False)  # an empty transition keeps its index
        else:
            blocks = [render(m.engine.chat, o) for o in observed]
            t = TransitionInput(
                turn, blocks, generate=had_reply and turn != 0, keep_ids=keep_ids, tools=tools,
                draft=_recorded_reply(m.engine.chat, originals) if m.replay_verify else None,
            )
        done = await step(m, session, policy, state, t)
        if turn == 0:
            out.system_prompt = next((o.content for o in observed if o.kind == "system"), None)
        elif t.compaction is not None or t.blocks:
            out.reused = out.reused if computed else done.usage.reused_tokens
            computed = True
            out.prefilled += done.usage.prefill_tokens + done.usage.closing_tokens
            out.decoded += done.usage.decode_tokens
            out.verified += done.usage.verified_tokens
            if done.reply is not None or summary is not None:
                out.modes[str(turn)] = replay_mode(done.usage.verified_tokens, done.usage.decode_tokens)
            live_calls.update(c.id for c in done.tools.calls)
            provided = _answers_needed(session, turn, done.tools.pending, tools)
        if done.archived:
            live_rows = [r for r in live_rows if r.turn == 0]
        live_rows.extend(LiveRow.of(r) for r in done.records.artifacts)
        state.advance(done)
        out.steps.append(done)
    if not computed:  # every replayed transition was empty: only the restore kept anything
        out.reused = restored
    if tools is not None and tools.replay is not None:
        out.suppressed = list(tools.replay.suppressed)
        out.committed_dropped = [
            ToolCall(_call_id(r), str((r.meta or {}).get("name", "")), {})
            for r in rows
            if r.turn >= from_turn and r.kind == "tool_call" and r.committed and _call_id(r) not in live_calls
        ]
    out.token_count = state.log_tokens
    return out


async def _restore(m: Machinery, session: AgentSession, state: SessionState, restore: Restore, *, cold: bool) -> int:
    """Crop the session's cache to the restore point (Lemma 1); the tokens kept. A cache that disagrees with the
    database, and every cache for a cold replay, is dropped: the first replayed transition rebuilds it from the log
    along its recipe."""
    key = route_of(session)
    handle = await m.handles.checkout(key)
    if handle is None:
        return 0
    clean = [t for entry in state.log for t in entry.token_ids]
    offset = restore.token_offset
    if cold or len(handle.tokens) < offset or handle.tokens[:offset] != clean[:offset]:
        await m.handles.drop(key)
        if cold:
            await m.engine.release(handle)
        return 0
    await m.engine.crop(handle, offset)
    return offset


def _recorded_reply(chat: ChatTemplate, originals: Sequence[Artifact]) -> list[int] | None:
    """The tokens the transition's reply was sampled as: the draft its replay verifies (a tool call's reply
    included)."""
    reply = next((r for r in originals if r.kind == "assistant"), None)
    return None if reply is None else sampled_of(chat, list(reply.token_ids))


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
