"""The service's pooled connections die under it (a PostgreSQL restart or failover does this; here every backend the
service holds is terminated): a request on a dead connection answers 503 with Retry-After, never a 500, and the
pool reconnects by itself, so the requests after it succeed and nothing written before is lost."""

from __future__ import annotations

import httpx

from app.db.session import APPLICATION_NAME
from tests.support import sql


def _terminate_the_services_connections(database_url: str) -> int:
    rows = sql(database_url, """
        SELECT pg_terminate_backend(pid) FROM pg_stat_activity
        WHERE application_name = $1 AND datname = current_database() AND pid <> pg_backend_pid()""",
        APPLICATION_NAME)
    return len(rows)


def test_dead_connections_answer_503_once_then_reconnect(client: httpx.Client, database_url: str) -> None:
    path = "/v1/memory/outage/fact"
    assert client.put(path, json={"value": {"n": 1}}, headers={"If-None-Match": "*"}).status_code == 201
    for _ in range(3):  # several pooled connections in use
        assert client.get(path).status_code == 200
    assert _terminate_the_services_connections(database_url) >= 1

    statuses = []
    for _ in range(25):
        response = client.get(path)
        statuses.append(response.status_code)
        if response.status_code == 503:
            assert response.headers["Retry-After"] == "1"
            assert response.json()["type"].endswith("/database-unavailable")
        if statuses[-3:] == [200, 200, 200]:
            break
    assert statuses[0] == 503, statuses  # no pre-ping round trip: the dead connection is found by the request
    assert set(statuses) <= {200, 503}, statuses
    assert statuses[-3:] == [200, 200, 200], statuses  # reconnected
    assert client.get(path).json()["value"] == {"n": 1}
