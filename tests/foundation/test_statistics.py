"""Forgotten text does not survive in PostgreSQL's planner statistics: columns holding user text carry none
(migrations 0006 and 0014), so an ANALYZE taken while the text was live leaves nothing for a forget to miss."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.forget.forget_helpers import artifacts, run_script, user, wait_job
from tests.support import sql

# Text, jsonb, bytea, vector and array columns may hold what users said; every one carries no statistics unless listed
# here as holding ids only (their statistics help the planner and reveal nothing).
KEPT = {("artifacts", "source_ids"), ("sessions", "flagged_sources")}
FAST = {"temperature": 0, "max_tokens": 8, "seed": 5}


def test_every_user_text_column_carries_no_statistics(live_server: Any, database_url: str) -> None:
    rows = sql(database_url, """
        SELECT c.relname, a.attname, a.attstattarget, t.typcategory, format_type(a.atttypid, a.atttypmod) AS type
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_type t ON t.oid = a.atttypid
        WHERE n.nspname = 'public' AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
    """)
    user_text = [r for r in rows if r["type"] in ("text", "jsonb", "bytea") or r["type"].startswith("vector")
                 or r["typcategory"] in (b"A", "A")]  # an array
    assert len(user_text) >= 18
    collecting = [(r["relname"], r["attname"]) for r in user_text
                  if (r["relname"], r["attname"]) not in KEPT and r["attstattarget"] != 0]
    assert collecting == [], "add these columns to a migration like 0006 (or to KEPT if they hold only ids)"


def markers_in_statistics(database_url: str, markers: list[str]) -> list[tuple[str, str]]:
    rows = sql(database_url, """
        SELECT tablename, attname,
               concat_ws(' ', most_common_vals::text, histogram_bounds::text, most_common_elems::text) AS seen
        FROM pg_stats WHERE schemaname = 'public'
    """)
    return [(r["tablename"], r["attname"]) for r in rows if any(m in (r["seen"] or "") for m in markers)]


def test_forgotten_text_is_not_in_pg_statistic(client: httpx.Client, database_url: str) -> None:
    tag = uuid.uuid4().hex[:8]
    message, value, request = f"qmsg{tag}", f"qmem{tag}", f"qreq{tag}"
    # Each marker several times, so a statistics sample would keep it as a most common value.
    session_id, ids = run_script(client, [[user(f"My code is {message}.")] for _ in range(3)], FAST)
    other, _ = run_script(client, [[user(f"I live in {request}.")], [user(f"I live in {request}.")]], FAST)
    for i in range(3):
        put = client.put(f"/v1/memory/stats-{tag}/k{i}", json={"value": value}, headers={"If-None-Match": "*"})
        assert put.status_code == 201, put.text
    sql(database_url, "ANALYZE")  # what autovacuum does on its own while the text is live

    for turn_ids in ids:
        job = client.post("/v1/forget", json={"target": {"artifact_id": turn_ids[0]}, "wait": True}).json()
        assert wait_job(client, job["id"])["status"] == "succeeded"
    for i in range(3):
        forgotten = client.delete(f"/v1/memory/stats-{tag}/k{i}").json()
        if forgotten["forget_id"]:
            wait_job(client, forgotten["forget_id"])
    plan = client.post(f"/v1/sessions/{other}/turns", json={"inputs": [user(f"Forget that I live in {request}")]})
    plan_id = plan.json()["forget_plan"]["id"]
    assert client.post("/v1/forget", json={"plan_id": plan_id}).status_code in (200, 202)
    assert wait_job(client, plan_id)["status"] == "succeeded"
    assert not [a for a in artifacts(client, session_id) + artifacts(client, other)
                if message in a["content"] or request in a["content"]]

    markers = [message, value, request]
    sql(database_url, "VACUUM FULL")
    assert markers_in_statistics(database_url, markers) == []
    sql(database_url, "ANALYZE")
    assert markers_in_statistics(database_url, markers) == []
