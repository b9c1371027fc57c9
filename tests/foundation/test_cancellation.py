"""A client that hangs up stops its generation, and the turn it abandoned writes nothing.

Each test starts a reply that would run for minutes (the tiny model counting to 10000, up to 4096 tokens), hangs up
while it provably runs (after its first streamed token; or, without a stream, once the turn holds its session
lease, seen in its row), then asks for another turn on the same session. That turn must be answered within
the session's wait bound (30 s, far below the abandoned reply's length) and be the session's first turn: the abandoned
generation stopped, and nothing of it was committed.
"""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import httpx

from tests.support import BOOTSTRAP_KEY, sql

LONG = {"max_tokens": 4096}
COUNT = [{"type": "user", "content": "Count from 1 to 10000, separated by commas."}]


def _long_session(client: httpx.Client) -> str:
    created = client.post("/v1/sessions", json={"system_prompt": "You are a helpful assistant.", "sampling": LONG})
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def _next_turn_is_the_first(client: httpx.Client, session_id: str) -> None:
    after = client.post(f"/v1/sessions/{session_id}/turns",
                        json={"inputs": [{"type": "user", "content": "Hi"}], "generate": False})
    assert after.status_code == 200, after.text  # not 409: the abandoned turn let go of the session
    assert client.get(f"/v1/sessions/{session_id}").json()["turns"] == 1


def test_a_disconnected_stream_stops_its_generation(client: httpx.Client) -> None:
    session_id = _long_session(client)
    with client.stream("POST", f"/v1/sessions/{session_id}/turns", json={"inputs": COUNT, "stream": True}) as stream:
        assert stream.status_code == 200
        events = stream.iter_lines()
        assert next(line for line in events if line.startswith("event: ")) == "event: delta"
    # The connection is closed here, mid-reply.
    _next_turn_is_the_first(client, session_id)


def test_a_disconnected_plain_request_stops_its_generation(client: httpx.Client, database_url: str) -> None:
    session_id = _long_session(client)
    body = json.dumps({"inputs": COUNT}).encode()
    url = urlsplit(str(client.base_url))
    conn = socket.create_connection((url.hostname, url.port))
    try:
        conn.sendall(
            f"POST /v1/sessions/{session_id}/turns HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: Bearer {BOOTSTRAP_KEY}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        _wait_for_the_turn_to_hold_its_session(database_url, session_id)
    finally:
        conn.close()
    _next_turn_is_the_first(client, session_id)


def _wait_for_the_turn_to_hold_its_session(database_url: str, session_id: str) -> None:
    """A barrier, not a sleep: the turn has taken its session's lease (it is inside the turn)."""
    deadline = time.monotonic() + 120
    held = "SELECT 1 FROM sessions WHERE id = $1 AND lease_owner IS NOT NULL AND status = 'running'"
    while not sql(database_url, held, session_id):
        assert time.monotonic() < deadline, "the turn never took its session"
        time.sleep(0.05)  # polling another process's state until the barrier holds
