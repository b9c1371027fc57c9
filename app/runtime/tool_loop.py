"""Tool calls inside a transition: parse the reply's calls, answer the ones the server answers, and append the
answers to the log (tool_catalog.py says who answers what).

One function serves a live turn and a forget's replay, so a replayed transition treats tools exactly as the original
did, except where assumption A3 of the unlearning paper says a replay must differ:

- a read-only call identical to the original (same id) reuses the recorded observation; a different built-in one
  runs against the environment as restored from the snapshot before τ;
- a consequential call never fires twice: identical to one that fired (in the ledger), it reuses the recorded
  result and re-applies its effect to the replay's (shadow) environment; a new one does not fire during a replay
  and is reported as suppressed (it stays pending in the session);
- a sink policy (information-flow control) blocks consequential calls whose context holds a flagged source.

The results are prefilled as one chunk of their own after the reply closes, so the transition still ends on a chunk
boundary (transition.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.engine.protocol import CacheHandle, KVEngine, Sampling, TokenSink
from app.runtime.blocks import Block, Observation, render
from app.runtime.engine_calls import Outcome, Synced, advance
from app.runtime.tool_catalog import declared, execute_builtin, parse_calls
from app.tool_calls import ToolCall


@dataclass
class ReplayTools:
    """What a replay knows of the original run: recorded results by call id, and the client's answers to calls
    the counterfactual makes anew (a needs_input job resumed)."""

    recorded: dict[str, str] = field(default_factory=dict)
    original_calls: set[str] = field(default_factory=set)
    provided: dict[str, str] = field(default_factory=dict)
    suppressed: list[ToolCall] = field(default_factory=list)


@dataclass
class ToolContext:
    session_id: str
    tools: Sequence[Mapping[str, Any]]
    env: dict[str, Any]
    fired: set[str]  # call ids of consequential calls that fired, ever (the ledger)
    flagged: frozenset[str] = frozenset()  # sources a sink policy flags
    replay: ReplayTools | None = None


@dataclass
class ToolStep:
    calls: list[ToolCall] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)  # tool_call blocks (no tokens of their own), then results
    fired_now: list[ToolCall] = field(default_factory=list)  # to record in the ledger
    pending: list[ToolCall] = field(default_factory=list)  # the client's to answer
    env_changed: bool = False
    prefilled: int = 0


async def run_tools(
    engine: KVEngine, handle: CacheHandle, ctx: ToolContext, turn: int, reply: str, sources: frozenset[str]
) -> ToolStep:
    """Answer the calls of `reply` (transition `turn`) and prefill the answers; `sources` are the sources of the
    reply's context (for the sink policy)."""
    step = ToolStep()
    if not ctx.tools:
        return step
    step.calls = parse_calls(turn, reply)
    results: list[Block] = []
    for call in step.calls:
        answer, committed = _answer(ctx, call, step, sources)
        meta: dict[str, Any] = {"tool_call_id": call.id, "name": call.name}
        if committed:
            meta["committed"] = True
        step.blocks.append(Block("tool_call", call.to_json(), [], meta))
        if answer is not None:
            # `server` marks a result the runtime produced (a replay regenerates it rather than replaying it as input)
            meta_result = {"tool_call_id": call.id, "server": "1"}
            results.append(render(engine.chat, Observation("tool_result", answer, meta_result)))
    step.blocks.extend(results)
    tokens = [t for block in results for t in block.token_ids]
    if tokens:
        step.prefilled = (await engine.prefill(handle, tokens)).prefilled
    return step


def _answer(ctx: ToolContext, call: ToolCall, step: ToolStep, sources: frozenset[str]) -> tuple[str | None, bool]:
    """The server's answer to a call (None: the client answers, or nobody now) and whether it counts as fired."""
    spec = declared(ctx.tools, call.name)
    if spec is None:
        return f"error: no tool named {call.name!r}", False
    kind = spec.get("kind", "read_only")
    replay = ctx.replay
    if kind == "consequential" and ctx.flagged & sources:
        return "blocked: the call's context holds a flagged source (sink policy)", False
    if not spec.get("builtin"):
        is_new = call.id not in ctx.fired and (replay is None or call.id not in replay.recorded)
        if kind == "consequential" and replay is not None and is_new:
            replay.suppressed.append(call)  # the client's side effect: a replay does not ask for it
        step.pending.append(call)
        return None, False
    if kind == "read_only":
        if replay is not None and call.id in replay.recorded:
            return replay.recorded[call.id], False
        _, text = execute_builtin(ctx.env, call)
        return text, False
    if call.id in ctx.fired:
        # It happened once; the replay reuses its result and re-applies its effect to the shadow environment.
        ctx.env, text = execute_builtin(ctx.env, call)
        step.env_changed = True
        return (replay.recorded.get(call.id, text) if replay is not None else text), True
    if replay is not None:
        replay.suppressed.append(call)  # a consequential call the original never made: not fired by a replay
        step.pending.append(call)
        return None, False
    ctx.env, text = execute_builtin(ctx.env, call)
    step.env_changed = True
    step.fired_now.append(call)
    return text, True


async def advance_with_tools(
    engine: KVEngine,
    synced: Synced,
    observations: list[Block],
    sampling: Sampling | None,
    ctx: ToolContext | None,
    turn: int,
    sources: frozenset[str],
    on_tokens: TokenSink | None = None,
    draft: list[int] | None = None,
) -> tuple[Outcome, ToolStep]:
    """transition.advance, then the reply's tool calls answered and their results prefilled as one more chunk."""
    outcome = await advance(engine, synced, observations, sampling, on_tokens, draft)
    if outcome.reply is None or ctx is None or not ctx.tools:
        return outcome, ToolStep()
    step = await run_tools(engine, synced.handle, ctx, turn, outcome.reply.content, sources)
    if not step.blocks:
        return outcome, step
    added = sum(len(b.token_ids) for b in step.blocks)
    chunks = None if outcome.chunks is None else [*outcome.chunks, *([added] if added else [])]
    usage = replace(outcome.usage, closing_tokens=outcome.usage.closing_tokens + step.prefilled)
    return replace(outcome, blocks=[*outcome.blocks, *step.blocks], chunks=chunks, usage=usage), step
