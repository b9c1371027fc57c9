"""What a session leaves in the database and the engine: checkpoints, purge, tenancy, atomicity, replayability."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.db.database import Database
from app.engine.protocol import CacheHandle, KVEngine
from app.engine.session_caches import LocalSessionCaches
from app.runtime.blocks import Observation, render
from app.runtime.engine_calls import StoredLog, Synced, advance, check_room, sampling_for, sync
from app.runtime.records import stored_log
from app.sessions.repositories import artifacts as artifacts_repo
from tests.conftest import LiveServer, make_settings
from tests.runtime.runtime_helpers import artifacts, assert_tiles, create_session, session, turn, user
from tests.support import BOOTSTRAP_KEY, cache_key, problem, sealer_of, sql, stored_artifacts


def _manifest(items: list[dict[str, Any]]) -> str:
    digest = hashlib.sha256()
    for a in items:
        digest.update(f"{a['id']}\t{a['token_span'][0]}\t{a['token_span'][1]}\n".encode())
    return digest.hexdigest()


def _checkpoints(database_url: str, sid: str) -> list[tuple[int, int, str, Any]]:
    rows = sql(database_url, "SELECT turn, token_offset, manifest_sha256, env_snapshot_id FROM checkpoints "
                             "WHERE session_id = $1 ORDER BY turn", sid)
    return [(r["turn"], r["token_offset"], r["manifest_sha256"], r["env_snapshot_id"]) for r in rows]


def test_checkpoints_follow_the_policy(client: httpx.Client, database_url: str) -> None:
    doc = {"type": "document", "content": "Opening hours: 9 to 5.", "source": "https://shop.example"}
    script: list[tuple[list[dict[str, Any]], bool]] = [
        ([user("Hi.")], True), ([doc], False), ([], False), ([user("When is it open?")], True),
    ]
    runs = {}
    for policy in ("every_turn", "session_start", "before_injections"):
        sid = create_session(client, checkpoint_policy=policy, sampling={"temperature": 0, "max_tokens": 2, "seed": 0})
        boundaries = {0: (session(client, sid)["token_count"], _manifest(artifacts(client, sid)))}
        for t, (inputs, generate) in enumerate(script, start=1):
            turn(client, sid, *inputs, generate=generate)
            boundaries[t] = (session(client, sid)["token_count"], _manifest(artifacts(client, sid)))
        runs[policy] = (_checkpoints(database_url, sid), boundaries)

    every, at = runs["every_turn"]
    assert every == [(t, at[t][0], at[t][1], None) for t in range(5)]  # metadata only, transition 0 and empty ones too
    start, at = runs["session_start"]
    assert start == [(0, at[0][0], at[0][1], None)]
    injections, at = runs["before_injections"]
    assert injections == [(1, at[1][0], at[1][1], None)]  # the boundary just before the document's transition


def test_delete_purges_rows_and_the_cache_handle(client: httpx.Client, database_url: str,
                                                 server_handles: LocalSessionCaches) -> None:
    sid = create_session(client)
    turn(client, sid, user("Remember the number 7."))
    key = cache_key(database_url, sid)
    assert key in server_handles
    r = client.delete(f"/v1/sessions/{sid}")
    assert r.status_code == 204 and r.content == b""
    problem(client.get(f"/v1/sessions/{sid}"), 404)
    problem(client.get(f"/v1/sessions/{sid}/artifacts"), 404)
    problem(client.post(f"/v1/sessions/{sid}/turns", json={"inputs": [user("hi")]}), 404)
    problem(client.delete(f"/v1/sessions/{sid}"), 404)
    assert key not in server_handles
    for table in ("artifacts", "provenance_edges", "checkpoints"):
        assert sql(database_url, f"SELECT count(*) AS n FROM {table} WHERE session_id = $1", sid)[0]["n"] == 0


def test_foreign_and_unknown_ids_are_404(client: httpx.Client, other_tenant: httpx.Client) -> None:
    sid = create_session(client)
    t = turn(client, sid, user("My PIN is 1234."))
    art = t["inputs"][0]["artifact_id"]
    for c, path in [
        (other_tenant, f"/v1/sessions/{sid}"),
        (other_tenant, f"/v1/sessions/{sid}/artifacts"),
        (other_tenant, f"/v1/sessions/{sid}/artifacts/{art}/descendants"),
        (client, "/v1/sessions/ses_00000000000000000000000000"),
        (client, f"/v1/sessions/{sid}/artifacts/art_00000000000000000000000000/descendants"),
    ]:
        problem(c.get(path), 404)
    problem(other_tenant.post(f"/v1/sessions/{sid}/turns", json={"inputs": [user("hi")]}), 404)
    problem(other_tenant.post(f"/v1/sessions/{sid}/turns", json={"inputs": [], "generate": False}), 404)
    problem(other_tenant.delete(f"/v1/sessions/{sid}"), 404)
    # An artifact id of another session of the same tenant is unknown in this one.
    other_sid = create_session(client)
    problem(client.get(f"/v1/sessions/{other_sid}/artifacts/{art}/descendants"), 404)
    assert session(client, sid)["turns"] == 1


def test_a_failed_model_call_writes_nothing_and_rewinds_the_handle(
    client: httpx.Client, live_server: LiveServer, server_engine: KVEngine, server_handles: LocalSessionCaches,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sid = create_session(client)
    turn(client, sid, user("First."))
    before, before_items = session(client, sid), artifacts(client, sid)

    async def broken(handle: CacheHandle, sampling: Any) -> Any:
        raise RuntimeError("injected engine failure")

    monkeypatch.setattr(server_engine, "generate", broken)
    # Its own connection: uvicorn closes the connection of a request that ended in an unhandled error.
    headers = {"Authorization": f"Bearer {BOOTSTRAP_KEY}"}
    with httpx.Client(base_url=live_server.base_url, headers=headers, timeout=120) as doomed:
        problem(doomed.post(f"/v1/sessions/{sid}/turns", json={"inputs": [user("Second.")]}), 500)
    monkeypatch.undo()
    assert session(client, sid) == before and artifacts(client, sid) == before_items
    handle = server_handles.peek(cache_key(database_url, sid))
    assert handle is not None and len(handle.tokens) == before["token_count"]  # cropped back, prefill kept
    t = turn(client, sid, user("Second."))
    assert t["turn"] == 2 and t["usage"]["reused_tokens"] == before["token_count"]
    assert_tiles(artifacts(client, sid))
    assert sql(database_url, "SELECT count(*) AS n FROM checkpoints WHERE session_id = $1", sid)[0]["n"] == 3


def _log_until(server: LiveServer, database_url: str, sid: str, last_turn: int) -> StoredLog:
    async def load() -> StoredLog:
        db = Database(database_url, pool_size=1)
        sealer = sealer_of(server, db)  # another process of the deployment: it opens what the server sealed
        try:
            async with db.transaction() as tx:
                log = await artifacts_repo.load_log(tx, sealer, sid)
        finally:
            await db.close()
        return stored_log([e for e in log if e.turn <= last_turn])

    return asyncio.run(load())


def _replies(server: LiveServer, database_url: str, sid: str) -> list[list[int]]:
    rows = stored_artifacts(database_url, "WHERE session_id = $1 AND kind = 'assistant' ORDER BY position", sid)
    return [list(r["token_ids"]) for r in rows]


def _replay(engine: KVEngine, live: CacheHandle, prefix: StoredLog, steps: list[tuple[int, list[Observation]]],
            sampling: dict[str, Any], forked: bool) -> list[list[int]]:
    """Algorithm 1's lines 5-10 on this runtime: restore (crop a fork of the live cache, or rebuild one from the
    stored recipe as another process would), then run the remaining transitions with their own seeds."""

    async def run() -> list[list[int]]:
        handle = await engine.fork(live, "replay") if forked else None
        synced = await sync(engine, handle, "replay", "t", prefix)
        replies = []
        for number, observations in steps:
            blocks = [render(engine.chat, o) for o in observations]
            room = check_room(engine, len(synced.handle.tokens) + len(synced.pending),
                              sum(len(b.token_ids) for b in blocks), True)
            outcome = await advance(engine, synced, blocks, sampling_for(sampling, number, room))
            assert outcome.reply is not None
            replies.append(outcome.reply.token_ids)
            synced = Synced(synced.handle, [], 0)
        await engine.release(synced.handle)
        return replies

    return asyncio.run(run())


def test_crop_and_replay_reproduces_the_counterfactual_session(
    client: httpx.Client, live_server: LiveServer, database_url: str, server_engine: KVEngine,
    server_handles: LocalSessionCaches,
) -> None:
    """What selective replay will do with this runtime's records: crop the real session to the end of τ-1 and replay
    τ..T with the target dropped (here an empty transition at τ = 2): the replies equal the counterfactual session's
    token for token (seeded sampling), from a crop of the live cache and from a cache rebuilt from the recipe."""
    sampling = {"temperature": 0.7, "top_p": 0.95, "max_tokens": 12, "seed": 11}
    script = ["I like jogging in the morning.", "My home address is 12 Rue Cler, Paris.", "Suggest a place to run."]
    real = create_session(client, sampling=sampling)
    for text in script:
        turn(client, real, user(text))
    counterfactual = create_session(client, sampling=sampling)
    turn(client, counterfactual, user(script[0]))
    turn(client, counterfactual, generate=False)
    turn(client, counterfactual, user(script[2]))
    expected = _replies(live_server, database_url, counterfactual)[1:]
    prefix = _log_until(live_server, database_url, real, 1)
    live = server_handles.peek(cache_key(database_url, real))
    assert live is not None
    steps = [(3, [Observation("user", script[2])])]
    for forked in (True, False):
        assert _replay(server_engine, live, prefix, steps, sampling, forked) == expected


def test_replay_from_session_start_reproduces_a_sanitized_document(
    client: httpx.Client, live_server: LiveServer, database_url: str, server_engine: KVEngine,
    server_handles: LocalSessionCaches,
) -> None:
    """τ = 1: the restore point is the end of transition 0, whose system block was never prefilled alone; the
    replayed first call prefills it with the sanitized document, exactly as the counterfactual session did."""
    sampling = {"temperature": 0.7, "top_p": 0.95, "max_tokens": 10, "seed": 4}
    bill = "Car Rental 98.70\nPlease pay by bank transfer to IBAN: UK12345678901234567890\nThank you!"
    clean = bill.replace("UK12345678901234567890", "")
    ask = "Which account should the money go to?"

    def run(document: str) -> str:
        sid = create_session(client, sampling=sampling)
        turn(client, sid, user("Read my bill."), {"type": "document", "content": document, "source": "file://b.txt"})
        turn(client, sid, user(ask))
        return sid

    real, counterfactual = run(bill), run(clean)
    prefix = _log_until(live_server, database_url, real, 0)
    live = server_handles.peek(cache_key(database_url, real))
    assert live is not None
    steps = [(1, [Observation("user", "Read my bill."), Observation("document", clean, {"source": "file://b.txt"})]),
             (2, [Observation("user", ask)])]
    expected = _replies(live_server, database_url, counterfactual)
    for forked in (True, False):
        assert _replay(server_engine, live, prefix, steps, sampling, forked) == expected


@pytest.fixture
def second_server(data_dir: Path, database_url: str) -> Iterator[LiveServer]:
    server = LiveServer(make_settings(data_dir, database_url))
    server.start()
    yield server
    server.stop()


def test_two_api_processes_alternating_turns_stay_consistent(client: httpx.Client, second_server: LiveServer) -> None:
    sampling = {"temperature": 0.7, "top_p": 0.95, "max_tokens": 8, "seed": 21}
    script = ["Name a fruit.", "Name a colour.", "Name an animal.", "Name a city."]
    headers = {"Authorization": f"Bearer {BOOTSTRAP_KEY}"}
    with httpx.Client(base_url=second_server.base_url, headers=headers, timeout=120) as other:
        shared = create_session(client, sampling=sampling)
        for i, text in enumerate(script):
            t = turn((client, other)[i % 2], shared, user(text))
            assert t["turn"] == i + 1
        reference = create_session(client, sampling=sampling)
        for text in script:
            turn(client, reference, user(text))
        shared_items, reference_items = artifacts(other, shared), artifacts(client, reference)
    assert_tiles(shared_items)
    # Each process caught its cache up along the stored chunk recipe, so the replies equal a one-process session's.
    assert [(a["kind"], a["content"], a["token_span"]) for a in shared_items] == [
        (a["kind"], a["content"], a["token_span"]) for a in reference_items
    ]
