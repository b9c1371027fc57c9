"""`stream: true` turns: text/event-stream with token deltas, then the same object a plain turn answers."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.runtime.runtime_helpers import create_session, user
from tests.support import problem


def events(response: httpx.Response) -> list[tuple[str, Any]]:
    out = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_a_streamed_turn_sends_deltas_then_the_turn(client: httpx.Client) -> None:
    sampling = {"temperature": 0, "max_tokens": 24, "seed": 4}
    streamed = create_session(client, sampling=sampling)
    plain = create_session(client, sampling=sampling)
    body = {"inputs": [user("Name three colours.")]}
    with client.stream("POST", f"/v1/sessions/{streamed}/turns", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        r.read()
    got = events(r)
    deltas = [data["text"] for name, data in got if name == "delta"]
    assert [name for name, _ in got][-1] == "turn" and len(deltas) > 1  # token by token on the hf engine
    turn = got[-1][1]
    reference = client.post(f"/v1/sessions/{plain}/turns", json=body).json()
    assert "".join(deltas) == turn["reply"]["content"] == reference["reply"]["content"]
    assert turn["turn"] == 1 and turn["usage"]["decode_tokens"] == reference["usage"]["decode_tokens"]
    # the streamed turn committed like any other
    arts = client.get(f"/v1/sessions/{streamed}/artifacts").json()["artifacts"]
    assert arts[-1]["id"] == turn["reply"]["artifact_id"]


def test_errors_before_the_first_token_are_plain_problems(client: httpx.Client) -> None:
    problem(client.post("/v1/sessions/ses_nope/turns", json={"inputs": [user("hi")], "stream": True}), 404)
    session_id = create_session(client)
    r = client.post(f"/v1/sessions/{session_id}/turns", json={"inputs": [user("hi")], "stream": True,
                                                                "generate": False})
    assert r.status_code == 200 and r.json()["reply"] is None  # nothing to stream: a plain answer
