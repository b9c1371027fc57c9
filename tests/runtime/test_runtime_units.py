"""Pure parts of the runtime: the edge reduction, records, recipes, checkpoint policies, the handle registry, and
how a handle is caught up with the stored log (against a recording fake engine: no model needed to check calls)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from app.engine.protocol import CacheHandle, TokenUsage
from app.engine.session_caches import LocalSessionCaches
from app.runtime import checkpoints
from app.runtime.blocks import Block
from app.runtime.engine_calls import StoredLog, sync
from app.runtime.provenance import FullContext, Node, union_sources
from app.runtime.records import records_for, stored_log
from app.sessions.repositories.artifacts import LogEntry


def _reachable(edges: set[tuple[str, str]], root: str) -> set[str]:
    seen, stack = {root}, [root]
    while stack:
        node = stack.pop()
        for parent, child in edges:
            if parent == node and child not in seen:
                seen.add(child)
                stack.append(child)
    return seen


def test_the_reduced_edges_reach_exactly_what_the_full_prefix_context_reaches() -> None:
    rng = random.Random(7)
    for _ in range(30):
        log: list[LogEntry] = []
        full: set[tuple[str, str]] = set()
        reduced: set[tuple[str, str]] = set()
        for turn in range(1, 12):
            kinds = [rng.choice(["user", "document", "tool_result"]) for _ in range(rng.randint(0, 3))]
            blocks = [Block(k, "x", [1]) for k in kinds]
            if rng.random() < 0.7:
                blocks.append(Block("assistant", "y", [2]))
            records = records_for("ten", "ses", turn, log, blocks, None, FullContext())
            reduced |= {(e["parent_id"], e["child_id"]) for e in records.edges}
            position = len(log)
            for row in records.artifacts:
                if row["kind"] == "assistant":  # the full context: every artifact before it in the log
                    full |= {(e.id, row["id"]) for e in log}
                log.append(LogEntry(row["id"], row["kind"], turn, position, row["token_start"], row["token_end"],
                                    row["token_ids"], row["source_ids"], None))
                position += 1
        for entry in log:
            assert _reachable(reduced, entry.id) == _reachable(full, entry.id)
        replies = sum(1 for e in log if e.kind == "assistant")
        assert len(reduced) <= len(log) + replies  # each artifact is a parent once, plus one chain edge per reply


def test_a_reply_carries_the_sources_of_its_whole_context() -> None:
    prefix = [Node("s", "system", ("s",)), Node("u1", "user", ("u1",)), Node("a1", "assistant", ("s", "u1"))]
    parents = FullContext().reply_parents(prefix, [Node("d", "document", ("d",))])
    assert [p.id for p in parents] == ["a1", "d"]
    assert union_sources(parents) == ["s", "u1", "d"]


def _entry(i: int, tokens: list[int], chunks: Any) -> LogEntry:
    return LogEntry(f"a{i}", "user", i, i, 0, 0, tokens, [f"a{i}"], chunks)


def test_the_stored_recipe_is_the_longest_contiguous_one() -> None:
    log = [
        _entry(0, [1, 2], None),  # the system block: pending until the first transition
        _entry(1, [3, 4, 5], {"at": 0, "sizes": [4, 1]}),
        _entry(2, [6, 7], {"at": 5, "sizes": [2]}),
        _entry(3, [8], None),
        _entry(4, [9], {"at": 99, "sizes": [1]}),  # not contiguous (e.g. recorded before a rewrite): ignored
        _entry(5, [10], {"at": 8, "sizes": [1]}),
    ]
    assert stored_log(log) == StoredLog(list(range(1, 11)), [4, 1, 2])


def test_checkpoint_policies() -> None:
    before = [("a", 0, 5)]
    after = [("a", 0, 5), ("b", 5, 9)]
    assert checkpoints.for_transition("every_turn", 3, ["user"], before, after) == [checkpoints.boundary(3, after)]
    assert checkpoints.for_transition("session_start", 3, ["document"], before, after) == []
    assert checkpoints.for_transition("before_injections", 3, ["user"], before, after) == []
    assert checkpoints.for_transition("before_injections", 3, ["user", "tool_result"], before, after) == [
        checkpoints.boundary(2, before)
    ]
    assert checkpoints.boundary(2, before).token_offset == 5
    assert checkpoints.at_session_start("before_injections", before) == []
    assert checkpoints.boundary(0, []).token_offset == 0


def test_the_registry_keeps_the_most_recently_used_handles() -> None:
    registry = LocalSessionCaches(max_handles=2)
    for key in "abc":
        registry.keep(key, CacheHandle(session_key=key))
        if key == "b":
            registry.peek("a")
    assert "a" in registry and "c" in registry and "b" not in registry and len(registry) == 2


class _Recorder:
    """Records the KVEngine calls `sync` makes; the log semantics are the protocol's (prefill appends)."""

    name, model_id = "recorder", "none"
    records_chunks = True

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def resalt(self, handle: CacheHandle, salt: str | None) -> None:
        handle.salt = salt

    async def open(self, session_key: str, *, salt: str | None = None, tokens: list[int] | None = None,
                   chunks: list[int] | None = None) -> CacheHandle:
        self.calls.append(("open", (list(tokens or []), chunks)))
        return CacheHandle(session_key=session_key, salt=salt, tokens=list(tokens or []))

    def chunks(self, handle: CacheHandle) -> list[int]:
        return []

    async def prefill(self, handle: CacheHandle, token_ids: list[int]) -> TokenUsage:
        self.calls.append(("prefill", list(token_ids)))
        handle.tokens.extend(token_ids)
        return TokenUsage(prefilled=len(token_ids))

    async def crop(self, handle: CacheHandle, n_tokens: int) -> None:
        self.calls.append(("crop", n_tokens))
        del handle.tokens[n_tokens:]


def test_sync_crops_what_differs_and_prefills_along_the_recipe() -> None:
    engine = _Recorder()
    log = StoredLog([1, 2, 3, 4, 5, 6, 7, 8, 9], [5, 1, 2])

    async def run(handle: CacheHandle | None) -> tuple[list[int], int]:
        engine.calls.clear()
        synced = await sync(engine, handle, "s", "t", log)  # type: ignore[arg-type]
        assert synced.handle.tokens + synced.pending == log.tokens
        return synced.pending, synced.prefilled

    # No handle in this process: open from the recipe; the uncovered tail joins the next transition's first call.
    assert asyncio.run(run(None)) == ([9], 0)
    assert engine.calls == [("open", ([1, 2, 3, 4, 5, 6, 7, 8], [5, 1, 2]))]
    # A handle behind the database (another process ran turns): prefill the missing chunks one by one.
    assert asyncio.run(run(CacheHandle("s", tokens=[1, 2, 3]))) == ([9], 5)
    assert engine.calls == [("prefill", [4, 5]), ("prefill", [6]), ("prefill", [7, 8])]
    # A handle that diverged (a forget elsewhere rewrote the suffix): crop to the common prefix first.
    assert asyncio.run(run(CacheHandle("s", tokens=[1, 2, 3, 4, 5, 0, 0]))) == ([9], 3)
    assert engine.calls == [("crop", 5), ("prefill", [6]), ("prefill", [7, 8])]
    # A handle ahead of the database (a commit failed after the model call): crop back.
    assert asyncio.run(run(CacheHandle("s", tokens=[*log.tokens[:8], 42]))) == ([9], 0)
    assert engine.calls == [("crop", 8)]
