"""A forgotten value is gone everywhere: history, the head row, no hash of it, and never in a log line. Values are
sealed at rest, so no row holds one in the clear even before the forget (tests/memory/test_memory_at_rest.py goes
down to the files and the keys)."""

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


def _sealed(database_url: str, ns: str) -> list[tuple[int, bool]]:
    """(version, holds a ciphertext) of every history row of the namespace."""
    rows = sql(
        database_url, "SELECT version, value_sealed IS NOT NULL AS s FROM memory_versions WHERE namespace = $1 "
        "ORDER BY version", ns,
    )
    return [(r["version"], r["s"]) for r in rows]


def test_forget_erases_every_earlier_value_from_the_database(client: httpx.Client, ns: str, database_url: str) -> None:
    first, second = f"peanut-{uuid.uuid4().hex}", f"sesame-{uuid.uuid4().hex}"
    create(client, ns, "allergy", first)
    write(client, ns, "allergy", {"nested": [second]}, base=1, source="summarizer")
    assert _rows_holding(database_url, first) == [] and _rows_holding(database_url, second) == []  # sealed
    assert _sealed(database_url, ns) == [(1, True), (2, True)]

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
    assert client.get(f"/v1/memory/{ns}/allergy").json()["value"] == third
    assert _sealed(database_url, ns) == [(1, False), (2, False), (3, False), (4, True)]
    [head] = sql(database_url, "SELECT value, value_sealed FROM memory_records WHERE namespace = $1", ns)
    assert head["value"] is None and head["value_sealed"] is not None
    client.delete(f"/v1/memory/{ns}/allergy")
    assert _rows_holding(database_url, third) == []
    rows = sql(
        database_url,
        "SELECT version, op, value IS NULL AND value_sealed IS NULL AS erased FROM memory_versions"
        " WHERE namespace = $1 ORDER BY version",
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
