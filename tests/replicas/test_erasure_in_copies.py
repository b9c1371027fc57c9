"""Erasure at rest, end to end, as an operator would check it (issue 42; docs/erasure-at-rest.md, "The guarantee"):
what a forget erased is in no copy of the database, and a database restored from a backup taken *before* the
forgets, served by `lethe serve` with the same key store, gives none of it back while every survivor stays readable.

One real primary with a WAL archive (`archive_command`) and a streaming replica (tests/replicas/conftest.py: this
module asks for the archive), one real `lethe serve` on them with the real tiny model. A made-up passport number
enters through four doors, each forgotten through its own: a memory value (DELETE), a turn of a full-context session
and one of a retrieval session (text forgets, selective replay), an OpenAI conversation item (its deletion). A base
backup is taken after the writes and before the forgets. Then `grep -a` over the primary's data directory, the
replica's, the WAL archive, the base backup and the server's log finds neither the number nor a turn's token ids;
and the backup, restored and served, answers each door as forgotten or erased.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from bench.replication import ReplicaPair, Server, query
from bench.serve import LetheServer, serving
from tests.forget.test_webhook import headers as webhook_headers
from tests.replicas.replica_helpers import client_of, lethe_on
from tests.support import BOOTSTRAP_KEY, WEBHOOK_SECRET, files_holding, stored_artifacts, until

FAST = {"temperature": 0, "max_tokens": 4, "seed": 3}
TERMINAL = {"succeeded", "failed", "needs_input"}


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicaPair]:
    replicated = ReplicaPair.create(durable=False, archive=True)
    try:
        yield replicated
    finally:
        replicated.destroy()


@pytest.fixture(scope="module")
def key_dir(data_dir: Path) -> Path:
    """The run's key store (tests/conftest.py exports it): the server and the one serving the restored backup are
    one deployment, with one provider."""
    return Path(os.environ["LETHE_KEY_DIR"])


@dataclass
class Scene:
    secret: str
    survivor: str
    namespace: str
    sessions: dict[str, str] = field(default_factory=dict)  # door → session id
    token_runs: list[bytes] = field(default_factory=list)  # the token ids of each turn that held the secret
    conversation: str = ""
    item: str = ""
    jobs: list[dict[str, Any]] = field(default_factory=list)


def _turn(http: httpx.Client, session_id: str, text: str) -> str:
    r = http.post(f"/v1/sessions/{session_id}/turns", json={"inputs": [{"type": "user", "content": text}]})
    assert r.status_code == 200, r.text
    artifact_id: str = r.json()["inputs"][0]["artifact_id"]
    return artifact_id


def _session(http: httpx.Client, policy: str, **config: Any) -> str:
    r = http.post("/v1/sessions", json={"sampling": FAST, "context_policy": policy, "system_prompt": "Be brief.",
                                         **config})
    assert r.status_code == 201, r.text
    session_id: str = r.json()["id"]
    return session_id


def _token_run(database_url: str, artifact_id: str) -> bytes:
    """The turn's token ids as the clear `int[]` column held them (int32 each): the text, in another form."""
    [row] = stored_artifacts(database_url, "WHERE id = $1", artifact_id)
    return np.asarray(row["token_ids"], dtype="<i4").tobytes()


def _settled(http: httpx.Client, job_id: str) -> dict[str, Any]:
    job: dict[str, Any] = {}

    def done() -> bool:
        nonlocal job
        job = http.get(f"/v1/forget/{job_id}").json()
        return job["status"] in TERMINAL and job.get("erasure", {}).get("at_rest") in (None, "complete", "none")

    until(done, f"forget {job_id} finished with its erasure at rest complete")
    return job


def _secret_session(http: httpx.Client, scene: Scene, door: str, database_url: str, **config: Any) -> str:
    """A session for `door`: a survivor turn, the secret's turn, one more; the secret's artifact id."""
    session_id = _session(http, **config)
    _turn(http, session_id, f"My city code is {scene.survivor}.")
    secret_turn = _turn(http, session_id, f"My passport number is {scene.secret}.")
    _turn(http, session_id, "Thanks.")
    scene.sessions[door] = session_id
    scene.token_runs.append(_token_run(database_url, secret_turn))
    return secret_turn


@pytest.fixture(scope="module")
def scene(pair: ReplicaPair, key_dir: Path) -> Iterator[tuple[Scene, LetheServer, Server]]:
    scene = Scene(secret=f"P{uuid.uuid4().int % 10**9:09d}X", survivor=f"S{uuid.uuid4().hex[:10]}",
                  namespace="copies-" + uuid.uuid4().hex[:8])
    with lethe_on(pair, LETHE_KEY_DIR=str(key_dir), LETHE_BOOTSTRAP_WEBHOOK_SECRET=WEBHOOK_SECRET) as server, \
            client_of(server) as http:
        # The writes: the secret through every door, a survivor beside it in each.
        memory = f"/v1/memory/{scene.namespace}"
        for key, value in (("passport", scene.secret), ("city", scene.survivor)):
            r = http.put(f"{memory}/{key}", json={"value": {"text": value}, "source": "user"},
                         headers={"If-None-Match": "*"})
            assert r.status_code == 201, r.text
        injected = _session(http, "full", memory_namespace=scene.namespace)  # the record reached a session
        _turn(http, injected, "Hello.")
        scene.sessions["cascade"] = injected
        targets = {
            "text": _secret_session(http, scene, "text", pair.primary.url, policy="full"),
            "retrieval": _secret_session(http, scene, "retrieval", pair.primary.url, policy="retrieval"),
            "dellm": _secret_session(http, scene, "dellm", pair.primary.url, policy="full"),
            "webhook": _secret_session(http, scene, "webhook", pair.primary.url, policy="full"),
        }
        # The survivor in a transition of its own: observations replayed with the target (its own transition
        # and after) are sealed again under new leaves, so a backup from before the forget no longer opens them.
        conv = http.post("/v1/conversations", json={"items": [
            {"role": "user", "content": f"My city code is {scene.survivor}."},
        ]})
        assert conv.status_code == 200, conv.text
        scene.conversation = conv.json()["id"]
        added = http.post(f"/v1/conversations/{scene.conversation}/items", json={"items": [
            {"role": "user", "content": f"My passport number is {scene.secret}."},
        ]})
        assert added.status_code == 200, added.text
        scene.item = next(i["id"] for i in added.json()["data"] if scene.secret in str(i))

        # The backup an operator took last night: after the writes, before the forgets.
        restored = pair.base_backup("backup")

        # The forgets, one per door.
        assert http.delete(f"{memory}/passport").status_code == 200  # and its cascade into `injected`
        reason = f"erasure request about {scene.secret}"
        for door, target in (("text", {"session_id": scene.sessions["text"], "text": scene.secret}),
                             ("retrieval", {"session_id": scene.sessions["retrieval"], "text": scene.secret}),
                             ("dellm", {"artifact_id": targets["dellm"]})):
            strategy = "delete_dependents" if door == "dellm" else "selective_replay"
            r = http.post("/v1/forget", json={"target": target, "strategy": strategy, "reason": reason})
            assert r.status_code == 202, r.text
        body = json.dumps({"session_id": scene.sessions["webhook"], "artifact_id": targets["webhook"],
                           "text": scene.secret, "detector": "pii", "score": 0.99}).encode()
        r = httpx.post(f"{server.url}/v1/webhooks/detector", content=body, headers=webhook_headers("copies", body))
        assert r.status_code == 202, r.text
        r = http.delete(f"/v1/conversations/{scene.conversation}/items/{scene.item}")
        assert r.status_code == 200, r.text
        until(lambda: all(j["status"] in TERMINAL for j in http.get("/v1/forget").json()["jobs"]), "every job ends")
        scene.jobs = [_settled(http, j["id"]) for j in http.get("/v1/forget").json()["jobs"]]
        assert not any(j["erasure"]["overdue"] for j in scene.jobs)
        metrics = http.get("/metrics").text
        assert "lethe_erasure_horizon_seconds 300.0" in metrics
        until(lambda: "lethe_erasure_pending_shreds 0.0" in http.get("/metrics").text, "no shred left pending")

        # Everything on disk: dirty pages written, the WAL segment finished and archived, the replica caught up
        # and its own pages written (a restartpoint).
        query(pair.primary.url, "CHECKPOINT")
        [segment] = query(pair.primary.url, "SELECT pg_walfile_name(pg_switch_wal()) AS name")
        until(lambda: (pair.archive / segment["name"]).exists(), "the WAL segment of the forgets is archived")
        pair.wait_caught_up()
        query(pair.replica.url, "CHECKPOINT")
        yield scene, server, restored


def test_no_copy_of_the_database_holds_what_was_forgotten(
    pair: ReplicaPair, scene: tuple[Scene, LetheServer, Server]
) -> None:
    story, server, restored = scene
    assert [j["id"] for j in story.jobs if j["status"] != "succeeded"] == [], story.jobs
    assert len(story.jobs) == 6  # the memory DELETE (with its cascade), three forgets, the webhook's, the item's
    [deleted] = [job for job in story.jobs if job["memory"]]
    assert [s["session_id"] for s in deleted["sessions"]] == [story.sessions["cascade"]]
    # The survivor was never forgotten, and is not in the clear either: everything is sealed, not only the forgotten.
    needles = [story.secret.encode(), story.survivor.encode(), *story.token_runs]
    places = {
        "primary": pair.primary.pgdata, "replica": pair.replica.pgdata, "WAL archive": pair.archive,
        "base backup": restored.pgdata,
    }
    # The scans see what the database wrote: ids are in the clear, in every copy.
    for name, root in places.items():
        assert files_holding(root, [story.conversation.encode()])[story.conversation.encode()], name
    held = {name: {needle: hits for needle, hits in files_holding(root, needles).items() if hits}
            for name, root in places.items()}
    assert held == {name: {} for name in places}
    assert story.secret not in server.log.read_text(errors="replace")


def test_a_backup_from_before_the_forgets_restored_gives_none_of_it_back(
    scene: tuple[Scene, LetheServer, Server], key_dir: Path, tmp_path: Path
) -> None:
    story, _, restored = scene
    restored.start()
    try:
        url = restored.url
        with serving(tmp_path, ready_s=600, LETHE_DATABASE_URL=url, LETHE_BOOTSTRAP_API_KEY=BOOTSTRAP_KEY,
                     LETHE_KEY_DIR=str(key_dir)) as server, client_of(server) as http:
            memory = f"/v1/memory/{story.namespace}"
            gone = http.get(f"{memory}/passport")
            assert gone.status_code == 404 and gone.json()["forgotten"] is True, gone.text
            kept = http.get(f"{memory}/city")
            assert kept.status_code == 200 and kept.json()["value"] == {"text": story.survivor}

            for door, session_id in story.sessions.items():
                listed = http.get(f"/v1/sessions/{session_id}/artifacts")
                assert listed.status_code == 200, listed.text
                artifacts = listed.json()["artifacts"]
                assert story.secret not in listed.text, door
                assert any(a["erased"] for a in artifacts), door  # the target and what derived from it
                if door != "cascade":  # there the record was injected first: every later transition replayed
                    assert any(a["content"] == f"My city code is {story.survivor}." for a in artifacts), door

            items = http.get(f"/v1/conversations/{story.conversation}/items")
            assert items.status_code == 200, items.text
            assert story.secret not in items.text and story.survivor in items.text
            assert [i["id"] for i in items.json()["data"] if i["id"] == story.item] == []  # left out, not blank
            assert http.get(f"/v1/conversations/{story.conversation}/items/{story.item}").status_code == 404

            # A session whose later transitions cannot be opened resumes before the first of them: its next turn
            # is transition 2 again (1 is the survivor's), at a new epoch, and no 5xx.
            session_id = story.sessions["text"]
            before = http.get(f"/v1/sessions/{session_id}").json()
            turn = http.post(f"/v1/sessions/{session_id}/turns",
                             json={"inputs": [{"type": "user", "content": "What is my city code?"}]})
            assert turn.status_code == 200, turn.text
            assert turn.json()["turn"] == 2 and turn.json()["epoch"] == before["epoch"] + 1
            artifacts = http.get(f"/v1/sessions/{session_id}/artifacts").json()["artifacts"]
            assert not any(a["erased"] for a in artifacts) and story.secret not in str(artifacts)
            assert artifacts[1]["content"] == f"My city code is {story.survivor}."

            verified = server.cli("keys", "verify")
            assert verified.returncode == 0, verified.stdout + verified.stderr
            assert " 0 tampered" in verified.stdout and " 0 missing" in verified.stdout
            assert story.secret not in server.log.read_text(errors="replace")
    finally:
        restored.stop()


