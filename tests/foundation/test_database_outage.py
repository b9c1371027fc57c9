"""The service's pooled connections die under it (a PostgreSQL restart or failover does this; here every backend the
service holds is terminated): a request on a dead connection answers 503 with Retry-After, never a 500, and the
pools reconnect by themselves, so the requests after it succeed and nothing written before is lost.

Two pools: SQLAlchemy's (units of work; here the session listing) finds a dead connection by using it, so its first
request answers 503; the memory hot path's asyncpg pool (`Database.pg`) sees the server's termination message
arrive on the event loop and replaces that connection at its next checkout, so reads may succeed at once."""

from __future__ import annotations

import httpx

from app.db.database import APPLICATION_NAME
from tests.support import sql


def _terminate_the_services_connections(database_url: str) -> int:
    rows = sql(database_url, """
        SELECT pg_terminate_backend(pid) FROM pg_stat_activity
        WHERE application_name = $1 AND datname = current_database() AND pid <> pg_backend_pid()""",
        APPLICATION_NAME)
    return len(rows)


def _statuses_until_recovered(client: httpx.Client, path: str) -> list[int]:
    statuses = []
    for _ in range(25):
        response = client.get(path)
        statuses.append(response.status_code)
        if response.status_code == 503:
            assert response.headers["Retry-After"] == "1"
            assert response.json()["type"].endswith("/database-unavailable")
        if statuses[-3:] == [200, 200, 200]:
            break
    return statuses


def test_dead_connections_answer_503_once_then_reconnect(client: httpx.Client, database_url: str) -> None:
    path = "/v1/memory/outage/fact"
    assert client.put(path, json={"value": {"n": 1}}, headers={"If-None-Match": "*"}).status_code == 201
    for _ in range(3):  # several pooled connections in use
        assert client.get(path).status_code == 200
        assert client.get("/v1/sessions").status_code == 200
    assert _terminate_the_services_connections(database_url) >= 1

    units_of_work = _statuses_until_recovered(client, "/v1/sessions")
    assert units_of_work[0] == 503, units_of_work  # no pre-ping round trip: the dead connection is found by use
    assert set(units_of_work) <= {200, 503}, units_of_work
    assert units_of_work[-3:] == [200, 200, 200], units_of_work  # reconnected

    hot_path = _statuses_until_recovered(client, path)
    assert set(hot_path) <= {200, 503}, hot_path
    assert hot_path[-3:] == [200, 200, 200], hot_path
    assert client.get(path).json()["value"] == {"n": 1}
