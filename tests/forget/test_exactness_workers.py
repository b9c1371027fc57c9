"""Exactness through the engine process: `lethe serve` with LETHE_HTTP_WORKERS=2, where every turn and every forget's
replay reaches the model over the engine wire (app/engine/process/), makes the comparisons the single-process tests
make (test_forget_exactness.py, test_one_transition_function.py, tests/retrieval/test_retrieval_forget.py): a
session after a forget equals, token for token, its counterfactual twin built on the same server (selective replay,
greedy and at seeded temperature 0.7; a retrieval session's selective regeneration), and a full reset recomputes
every transition exactly as the turns computed it (their token ids, chunk recipes, finish reasons, provenance).

The server has its own data directory and embedded PostgreSQL, as tests/foundation/test_http_workers.py's: no other
process of the run can claim its forget jobs, so every replay here runs on one of its HTTP workers, through the
engine process. Scripts are short (three turns, a dozen tokens a reply): starting the server is the module's cost.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from pgserver.utils import PostmasterInfo

from bench.serve import LetheServer, stop_postgres
from tests.forget.forget_helpers import (
    Script,
    artifacts,
    assert_recomputed_equal,
    assert_tiles,
    checkpoint_offsets,
    forget,
    post_turn,
    provenance_parents,
    recorded_rows,
    run_script,
    shape,
    user,
    wait_job,
)
from tests.retrieval.retrieval_helpers import PERSONA, retrieval_session, say
from tests.support import BOOTSTRAP_KEY

GREEDY = {"temperature": 0, "max_tokens": 12, "seed": 7}
SEEDED = {"temperature": 0.7, "top_p": 0.95, "max_tokens": 12, "seed": 11}
ADDRESS = "12 Rue Cler"
SCRIPT: Script = [
    [user("Hi! Please help me plan my week.")],
    [user(f"My home address is {ADDRESS}, Paris.")],
    [user("Suggest a place for a morning run near my home.")],
]
TARGET = "My PIN is 5512."


class Workers:
    def __init__(self, server: LetheServer, database_url: str) -> None:
        self.server, self.database_url = server, database_url


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    data_dir = tmp_path_factory.mktemp("exactness-workers")
    server = LetheServer(data_dir, None, LETHE_HTTP_WORKERS="2", LETHE_BOOTSTRAP_API_KEY=BOOTSTRAP_KEY)
    try:
        server.wait_ready()
        kids = psutil.Process(server.proc.pid).children()
        assert sum("engine-process" in p.cmdline() for p in kids) == 1
        assert sum("http-worker" in p.cmdline() for p in kids) == 2
        postmaster = PostmasterInfo.read_from_pgdata(Path(data_dir) / "pg")  # the server's embedded PostgreSQL
        assert postmaster is not None
        yield Workers(server, postmaster.get_uri())
    finally:
        try:
            assert server.stop() == 0
        finally:
            stop_postgres(data_dir / "pg")


@pytest.fixture
def client(workers: Workers) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {BOOTSTRAP_KEY}"}
    with httpx.Client(base_url=workers.server.url, headers=headers, timeout=120) as c:
        yield c


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded-t0.7"])
def test_selective_replay_through_the_engine_process_equals_the_session_that_never_saw_the_target(
    client: httpx.Client, workers: Workers, sampling: dict[str, Any]
) -> None:
    session_id, ids = run_script(client, SCRIPT, sampling)
    job = wait_job(client, forget(client, {"artifact_id": ids[1][0]})["id"])
    assert job["status"] == "succeeded", job
    receipt = job["sessions"][0]
    assert (receipt["tau"], receipt["T"], receipt["transitions_replayed"]) == (2, 3, 2)
    assert receipt["exactness"] == "exact"
    # the clean prefix came from the cache the engine process kept for the session
    assert receipt["tokens"]["reused"] == receipt["checkpoint"]["token_offset"] > 0

    reference_id, _ = run_script(client, [t if i != 1 else [] for i, t in enumerate(SCRIPT)], sampling)
    after = artifacts(client, session_id)
    expected = shape(artifacts(client, reference_id), workers.database_url)
    assert shape(after, workers.database_url) == expected
    assert_tiles(after)
    replies = [tokens for kind, *_, tokens in expected if kind == "assistant"]
    assert len(replies) == 2 and all(replies), "no reply was sampled: the comparison would prove little"
    assert ids[1][0] not in {a["id"] for a in after} and ADDRESS not in str([a["content"] for a in after])


def test_selective_regeneration_of_a_retrieval_session_equals_the_session_that_never_saw_the_message(
    client: httpx.Client, workers: Workers
) -> None:
    """The embedder behind the retrieval is the engine process's too (proxies.py)."""
    messages = PERSONA[:3]  # Paris, the guitar, then "Which city is my home in?", which retrieves Paris
    contaminated, ids = retrieval_session(client, messages, top_k=2, sampling=SEEDED)
    clean, _ = retrieval_session(client, [], top_k=2, sampling=SEEDED)
    post_turn(client, clean, [])  # the transition Paris entered, empty
    for _, text in messages[1:]:
        say(client, clean, text)

    job = forget(client, {"artifact_id": ids["paris"]}, wait=True)
    assert job["status"] == "succeeded", job
    assert job["sessions"][0]["transitions_replayed"] >= 1

    items = artifacts(client, contaminated)
    assert shape(items, workers.database_url) == shape(artifacts(client, clean), workers.database_url)
    live = {a["id"] for a in items}
    assert ids["home.reply"] not in live and ids["paris"] not in live  # regenerated, and gone


def test_a_full_reset_through_the_engine_process_recomputes_what_the_turns_wrote(
    client: httpx.Client, workers: Workers
) -> None:
    """test_one_transition_function's check, through the engine process: every transition before the target is
    recomputed from a cold cache (a document included, at seeded temperature 0.7) and writes what the turn wrote."""
    created = client.post("/v1/sessions", json={"system_prompt": "You are a helpful assistant. Answer briefly.",
                                                "sampling": SEEDED})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    post_turn(client, sid, [user("Read this."), {"type": "document", "content": "Rent due: 700 EUR.",
                                                 "source": "mail"}])
    post_turn(client, sid, [user("Anything else due?")])
    target_turn = client.post(f"/v1/sessions/{sid}/turns", json={"inputs": [user(TARGET)]}).json()["turn"]

    db = workers.database_url
    before = recorded_rows(db, sid, target_turn)
    assert {"document", "assistant"} <= {r["kind"] for r in before}
    parents_before, checkpoints_before = provenance_parents(db, sid), checkpoint_offsets(db, sid, target_turn)
    job = forget(client, {"session_id": sid, "text": TARGET}, strategy="full_reset", wait=True)
    assert job["status"] == "succeeded", job
    assert job["sessions"][0]["transitions_replayed"] == target_turn  # every transition, from a cold cache
    assert_recomputed_equal(db, sid, before, parents_before, target_turn)
    assert checkpoint_offsets(db, sid, target_turn) == checkpoints_before
