"""What happens after a turn commits does not change how the turn is answered.

A turn over the session's token budget is followed, under the same lease, by an automatic compaction. A client that
hangs up while that compaction runs must not turn the committed turn into a cancelled request (499), and the
compaction still completes. Forced, not timed: the compaction's commit writes the summary back into memory, and the
test holds that memory row locked until the compaction is provably parked on it, then closes the client's connection.
"""

from __future__ import annotations

import socket
import threading
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.support import BOOTSTRAP_KEY, HeldLock, sql, until

LiveServer = Any
# Long enough that the session passes its 64-token budget with this turn (after one short turn it is under it).
LONG = "Tell me more about the history of Paris, its museums, its food and its people, in detail please."


def _status_count(client: httpx.Client, status: str) -> float:
    text = client.get("/metrics").text
    prefix = 'lethe_http_requests_total{method="POST",route="/v1/sessions/{id}/turns",status="' + status + '"}'
    line = next((x for x in text.splitlines() if x.startswith(prefix)), None)
    return 0.0 if line is None else float(line.split()[-1])


def _turn_then_hang_up(base_url: str, session_id: str, text: str, sent: threading.Event, hang_up: threading.Event
                       ) -> None:
    """POST a turn on a raw socket, then close it when told (the client is gone; nobody reads the answer)."""
    url = urlsplit(base_url)
    body = ('{"inputs": [{"type": "user", "content": "' + text + '"}]}').encode()
    request = (
        f"POST /v1/sessions/{session_id}/turns HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Authorization: Bearer {BOOTSTRAP_KEY}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(request)
        sent.set()
        hang_up.wait(600)


def test_a_client_hanging_up_during_auto_compaction_leaves_a_committed_turn(
    client: httpx.Client, live_server: LiveServer, database_url: str
) -> None:
    namespace = "after-commit"
    r = client.post("/v1/sessions", json={
        "system_prompt": "You are a helpful assistant.", "memory_namespace": namespace,
        "sampling": {"temperature": 0, "max_tokens": 8, "seed": 3},
        "compaction": {"max_tokens": 64, "keep_last_turns": 1, "write_back": True},
    })
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    first = client.post(f"/v1/sessions/{sid}/turns", json={"inputs": [{"type": "user", "content": "Hi there."}]})
    assert first.status_code == 200, first.text
    # the summary record the compaction writes back, made beforehand so the test can hold its row
    key = f"summary.{sid}"  # (one turn leaves nothing older to compact: no summary yet)
    made = client.put(f"/v1/memory/{namespace}/{key}", json={"value": "x"}, headers={"If-None-Match": "*"})
    assert made.status_code == 201, made.text
    session = client.get(f"/v1/sessions/{sid}").json()
    turns_before = session["turns"]
    assert turns_before == 1 and session["token_count"] < 64, session
    ok_before, cancelled_before = _status_count(client, "200"), _status_count(client, "499")

    sent, hang_up = threading.Event(), threading.Event()
    with HeldLock(database_url, "SELECT 1 FROM memory_records WHERE namespace = $1 AND key = $2 FOR UPDATE",
                  namespace, key) as lock:
        caller = threading.Thread(
            target=_turn_then_hang_up, args=(live_server.base_url, sid, LONG, sent, hang_up), daemon=True
        )
        caller.start()
        assert sent.wait(60)
        lock.wait_blocked()  # the turn committed; its compaction is parked writing the summary back
        assert client.get(f"/v1/sessions/{sid}").json()["turns"] == turns_before + 1
        hang_up.set()
        caller.join(60)
        # The turn's request cannot be answered now; it must still end as what it is, a success.
    # the lock is released: the compaction completes under the same lease, and the request ends, counted as a
    # success (it is counted when its handler returns, just after the compaction's commit)
    until(lambda: _status_count(client, "200") + _status_count(client, "499") > ok_before + cancelled_before,
          "the turn's request ended")
    assert _status_count(client, "200") == ok_before + 1
    session = client.get(f"/v1/sessions/{sid}").json()
    assert session["turns"] == turns_before + 2 and session["status"] == "idle"
    kinds = [a["kind"] for a in client.get(f"/v1/sessions/{sid}/artifacts").json()["artifacts"]]
    assert "summary" in kinds
    assert _status_count(client, "499") == cancelled_before
    summary = sql(database_url, "SELECT value FROM memory_records WHERE namespace = $1 AND key = $2", namespace, key)
    assert summary and summary[0]["value"] != '"x"'
