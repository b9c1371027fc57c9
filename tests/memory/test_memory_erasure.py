"""A forgotten value is gone everywhere: history, the head row, no hash of it, and never in a log line."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import uuid

import httpx

from app.observability.logging import JsonFormatter
from tests.memory.memory_helpers import create, write
from tests.support import sql


def _rows_holding(database_url: str, needle: str) -> list[str]:
    """Every memory row (any column, as JSON text) that contains `needle`."""
    rows = sql(
        database_url,
        """
        SELECT 'memory_records' AS t, row_to_json(r)::text AS j FROM memory_records r
        UNION ALL
        SELECT 'memory_versions', row_to_json(v)::text FROM memory_versions v
        """,
    )
    return [f"{r['t']}: {r['j']}" for r in rows if needle in r["j"]]


def test_forget_erases_every_earlier_value_from_the_database(client: httpx.Client, ns: str, database_url: str) -> None:
    first, second = f"peanut-{uuid.uuid4().hex}", f"sesame-{uuid.uuid4().hex}"
    create(client, ns, "allergy", first)
    write(client, ns, "allergy", {"nested": [second]}, base=1, source="summarizer")
    assert _rows_holding(database_url, first) and _rows_holding(database_url, second)

    assert client.delete(f"/v1/memory/{ns}/allergy").json()["version"] == 3

    assert _rows_holding(database_url, first) == []
    assert _rows_holding(database_url, second) == []
    for secret in (first, second, json.dumps(first), json.dumps({"nested": [second]})):
        for digest in (hashlib.sha256(secret.encode()).hexdigest(), hashlib.md5(secret.encode()).hexdigest()):
            assert _rows_holding(database_url, digest) == [], "a hash of a forgotten value is kept"
    history = client.get(f"/v1/memory/{ns}/allergy/history").json()["versions"]
    assert [v["value"] for v in history] == [None, None, None]
    assert first not in json.dumps(history) and second not in json.dumps(history)

    # a value written after the forget is kept until the next forget, which erases it too
    third = f"none-{uuid.uuid4().hex}"
    write(client, ns, "allergy", third, base=3, source="user_correction")
    assert len(_rows_holding(database_url, third)) == 2  # the head and its history row
    client.delete(f"/v1/memory/{ns}/allergy")
    assert _rows_holding(database_url, third) == []
    rows = sql(
        database_url,
        "SELECT version, op, value IS NULL AS erased FROM memory_versions WHERE namespace = $1 ORDER BY version",
        ns,
    )
    assert [(r["version"], r["op"], r["erased"]) for r in rows] == [
        (1, "write", True),
        (2, "write", True),
        (3, "forget", True),
        (4, "write", True),
        (5, "forget", True),
    ]


def test_logs_never_hold_memory_values(client: httpx.Client, ns: str) -> None:
    secret = f"log-secret-{uuid.uuid4().hex}"
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    previous = root.level
    root.setLevel(logging.DEBUG)
    try:
        create(client, ns, "k", secret)
        client.get(f"/v1/memory/{ns}/k")
        write(client, ns, "k", {"again": secret}, base=9)  # 412
        client.put(f"/v1/memory/{ns}/k", json={"value": secret, "bogus": secret}, headers={"If-Match": '"1"'})  # 422
        client.put(f"/v1/memory/{ns}/k", json={"value": secret})  # 428
        client.post(f"/v1/memory/{ns}:batch", json={"writes": [{"key": "k", "value": secret, "base_version": 0}]})
        client.post(
            f"/v1/memory/{ns}:batch",
            json={"atomic": False, "writes": [{"key": "j", "value": secret, "base_version": 0}]},
        )
        client.get(f"/v1/memory/{ns}/k/history")
        client.delete(f"/v1/memory/{ns}/k")
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)
    logged = buffer.getvalue()
    assert "memory key forgotten" in logged  # the capture works: the forget is logged (without its value)
    assert secret not in logged
