"""Helpers of the forget tests: turn scripts over HTTP, the counterfactual run, waiting for jobs, searching tables,
comparing what a replay recomputed with what the turns wrote."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from tests.support import sql, stored_artifacts

SYSTEM = "You are a helpful personal assistant. Answer briefly."
Script = list[list[dict[str, Any]]]  # one list of inputs per turn; [] = an empty transition


def user(text: str) -> dict[str, Any]:
    return {"type": "user", "content": text}


def run_script(
    client: httpx.Client, script: Script, sampling: dict[str, Any], **config: Any
) -> tuple[str, list[list[str]]]:
    """Create a session and run the script; returns the session id and each turn's input artifact ids."""
    config.setdefault("system_prompt", SYSTEM)
    r = client.post("/v1/sessions", json={"sampling": sampling, **config})
    assert r.status_code == 201, r.text
    session_id: str = r.json()["id"]
    ids = [post_turn(client, session_id, inputs) for inputs in script]
    return session_id, ids


def post_turn(client: httpx.Client, session_id: str, inputs: list[dict[str, Any]]) -> list[str]:
    body: dict[str, Any] = {"inputs": inputs} if inputs else {"inputs": [], "generate": False}
    r = client.post(f"/v1/sessions/{session_id}/turns", json=body)
    assert r.status_code == 200, r.text
    return [i["artifact_id"] for i in r.json()["inputs"]]


def artifacts(client: httpx.Client, session_id: str) -> list[dict[str, Any]]:
    r = client.get(f"/v1/sessions/{session_id}/artifacts")
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["artifacts"]
    return items


def shape(items: list[dict[str, Any]], database_url: str) -> list[tuple[str, int, str, list[int], list[int]]]:
    """What must equal between a forgotten session and its counterfactual, token for token: kind, transition,
    content, span and token ids of every artifact (ids differ: the counterfactual is another session). The API does
    not show token ids, so they are read from the table."""
    rows = stored_artifacts(database_url, "WHERE id = ANY($1::text[])", [a["id"] for a in items])
    tokens = {r["id"]: list(r["token_ids"]) for r in rows}
    return [(a["kind"], a["turn"], a["content"], a["token_span"], tokens[a["id"]]) for a in items]


def assert_tiles(items: list[dict[str, Any]]) -> None:
    offset = 0
    for a in items:
        assert a["token_span"][0] == offset, (a["id"], a["token_span"], offset)
        offset = a["token_span"][1]


def forget(client: httpx.Client, target: dict[str, Any], **options: Any) -> dict[str, Any]:
    """POST /v1/forget; with `wait`, also past the server's own wait (a loaded machine can outlast it: 202)."""
    r = client.post("/v1/forget", json={"target": target, **options})
    assert r.status_code in (200, 202), r.text
    job: dict[str, Any] = r.json()
    if options.get("wait") and not options.get("dry_run") and job["status"] in ("queued", "running"):
        assert r.status_code == 202
        return wait_job(client, job["id"])
    return job


def wait_job(client: httpx.Client, job_id: str, timeout: float = 240) -> dict[str, Any]:
    """The job once it ended (or waits for a tool result, or on a legal hold); a job still running after `timeout`
    fails the test."""
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = client.get(f"/v1/forget/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "needs_input", "held"):
            return job
        assert time.monotonic() < deadline, f"forget job {job_id} still {job['status']} after {timeout} s"
        time.sleep(0.1)  # polling the job as a client would


def tables_holding(database_url: str, needle: str, within: str | None = None) -> list[str]:
    """Every table (of the public schema) with a row whose text form contains `needle`: a dump of the database,
    searched. Case-insensitive, so a re-cased copy counts too. With `within` (a session id), only rows that name it
    count: other tests' sessions on the shared database may hold the same words."""
    names = [r["tablename"] for r in sql(database_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
    found = []
    for name in names:
        query = f'SELECT count(*) AS n FROM "{name}" t WHERE strpos(lower(t::text), lower($1)) > 0'
        if within is not None:
            query += " AND strpos(t::text, $2) > 0"
        rows = sql(database_url, query, needle, *([within] if within is not None else []))
        if rows[0]["n"]:
            found.append(name)
    return found


def recorded_rows(database_url: str, session_id: str, below_turn: int) -> list[dict[str, Any]]:
    """The session's artifacts of the transitions before `below_turn`, as the tables hold them (`meta` parsed)."""
    names = ("id", "kind", "turn", "position", "content", "token_start", "token_end", "token_ids", "source_ids",
             "committed", "archived_by", "meta")
    where = "WHERE session_id = $1 AND turn < $2 ORDER BY position"
    rows = stored_artifacts(database_url, where, session_id, below_turn)
    return [{**{n: r[n] for n in names}, "meta": json.loads(r["meta"])} for r in rows]


def provenance_parents(database_url: str, session_id: str) -> dict[str, set[str]]:
    edges = sql(database_url, "SELECT parent_id, child_id FROM provenance_edges WHERE session_id = $1", session_id)
    parents: dict[str, set[str]] = {}
    for edge in edges:
        parents.setdefault(edge["child_id"], set()).add(edge["parent_id"])
    return parents


def checkpoint_offsets(database_url: str, session_id: str, below_turn: int) -> list[tuple[int, int]]:
    rows = sql(database_url, "SELECT turn, token_offset FROM checkpoints WHERE session_id = $1 AND turn < $2 "
               "ORDER BY turn, token_offset", session_id, below_turn)
    return [(r["turn"], r["token_offset"]) for r in rows]


def assert_recomputed_equal(database_url: str, session_id: str, before: list[dict[str, Any]],
                            parents_before: dict[str, set[str]], below_turn: int) -> None:
    """The transitions before `below_turn`, recomputed by a forget, wrote what the turns wrote (`before`, read with
    `recorded_rows`): kind, position, content, token ids and span, `meta` (the chunk recipe, the finish reason),
    `committed`, what a compaction archived, sources and provenance parents, with ids mapped to the recomputed ones."""
    after = recorded_rows(database_url, session_id, below_turn)
    assert [(r["turn"], r["position"], r["kind"]) for r in after] == [
        (r["turn"], r["position"], r["kind"]) for r in before
    ]
    ids = {old["id"]: new["id"] for old, new in zip(before, after, strict=True)}
    assert any(old != new for old, new in ids.items()), "nothing was recomputed: the test would prove nothing"
    parents_after = provenance_parents(database_url, session_id)

    def mapped(value: Any) -> Any:
        """A value of the original run with its artifact ids replaced by the recomputed ones'."""
        if isinstance(value, str):
            return ids.get(value, value)
        if isinstance(value, list):
            return [mapped(v) for v in value]
        if isinstance(value, dict):
            return {k: mapped(v) for k, v in value.items()}
        return value

    for old, new in zip(before, after, strict=True):
        where = (old["turn"], old["kind"], old["position"])
        for field in ("content", "token_ids", "token_start", "token_end", "committed", "archived_by"):
            assert new[field] == old[field], (where, field, old[field], new[field])
        assert new["meta"] == mapped(old["meta"]), (where, old["meta"], new["meta"])
        assert sorted(new["source_ids"]) == sorted(mapped(old["source_ids"])), where
        assert parents_after.get(new["id"], set()) == {ids.get(p, p) for p in parents_before.get(old["id"], set())}
