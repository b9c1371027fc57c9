"""Turns over HTTP: KV reuse, exact spans, provenance, token accounting, determinism, and bad input."""

from __future__ import annotations

from typing import Any

import httpx

from app.engine.protocol import KVEngine
from tests.runtime.runtime_helpers import artifacts, assert_tiles, create_session, session, turn, user
from tests.support import problem, sql, stored_artifacts


def test_turns_reuse_the_prefix_tile_the_log_and_taint_later_replies(client: httpx.Client) -> None:
    sid = create_session(client)
    created = session(client, sid)
    assert (created["turns"], created["epoch"], created["status"], created["pending_tool_calls"]) == (0, 0, "idle", [])
    system_tokens = created["token_count"]
    assert system_tokens > 0

    usages = []
    previous = system_tokens
    for i, text in enumerate(["My dog is called Rex.", "I work as a nurse.", "What is my dog called?"], start=1):
        t = turn(client, sid, user(text))
        assert t["turn"] == i and t["epoch"] == 0 and t["reply"]["artifact_id"] and t["reply"]["tool_calls"] == []
        u = t["usage"]
        assert u["prompt_tokens"] == u["reused_tokens"] + u["prefill_tokens"], u
        assert u["decode_tokens"] >= 1 and u["closing_tokens"] >= 2, u
        # The cache covers exactly the log at the end of a transition: the next turn reuses all of it.
        assert u["reused_tokens"] == (0 if i == 1 else previous), (u, previous)
        previous = session(client, sid)["token_count"]
        usages.append(u)
    assert usages[0]["prefill_tokens"] == usages[0]["prompt_tokens"]  # system block prefilled with the first turn

    items = artifacts(client, sid)
    assert [a["kind"] for a in items] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert_tiles(items)
    assert items[-1]["token_span"][1] == previous
    assert [a["turn"] for a in items] == [0, 1, 1, 2, 2, 3, 3]

    # Observations are their own sources; a reply carries every source of its context.
    observations = [a for a in items if a["kind"] != "assistant"]
    assert all(a["source_ids"] == [a["id"]] and a["parents"] == [] for a in observations)
    last = items[-1]
    assert set(last["source_ids"]) == {a["id"] for a in observations}
    # Stored parents are the transitive reduction: what came since the previous reply, plus that reply.
    ids = [a["id"] for a in items]
    assert items[2]["parents"] == ids[0:2]
    assert items[4]["parents"] == [ids[2], ids[3]]
    assert last["parents"] == [ids[4], ids[5]]

    r = client.get(f"/v1/sessions/{sid}/artifacts/{ids[1]}/descendants")
    assert r.status_code == 200
    closure = [a["id"] for a in r.json()["artifacts"]]
    assert closure == [ids[1], ids[2], ids[4], ids[6]]  # itself, then every later reply, in log order
    r = client.get(f"/v1/sessions/{sid}/artifacts/{ids[5]}/descendants")
    assert [a["id"] for a in r.json()["artifacts"]] == [ids[5], ids[6]]


def test_empty_transition_takes_an_index_and_changes_nothing_else(client: httpx.Client) -> None:
    sid = create_session(client)
    turn(client, sid, user("Hello there."))
    before_items, before = artifacts(client, sid), session(client, sid)
    t = turn(client, sid, generate=False)
    assert t["turn"] == 2 and t["inputs"] == [] and t["reply"] is None
    assert t["usage"] == {"prompt_tokens": 0, "reused_tokens": 0, "prefill_tokens": 0, "decode_tokens": 0,
                          "closing_tokens": 0}
    after = session(client, sid)
    assert artifacts(client, sid) == before_items
    assert (after["turns"], after["token_count"]) == (2, before["token_count"])
    nxt = turn(client, sid, user("Still there?"))
    assert nxt["turn"] == 3 and nxt["usage"]["reused_tokens"] == before["token_count"]


def test_generate_false_records_observations_and_the_next_reply_depends_on_them(client: httpx.Client) -> None:
    sid = create_session(client)
    t = turn(
        client, sid,
        {"type": "document", "content": "Invoice 17: total 98.70 EUR.", "source": "file://invoice.txt"},
        {"type": "tool_result", "tool_call_id": "call_abc", "content": "balance: 120.00 EUR"},
        generate=False,
    )
    assert t["reply"] is None and len(t["inputs"]) == 2
    u = t["usage"]
    assert u["decode_tokens"] == 0 and u["closing_tokens"] == 0
    assert u["prompt_tokens"] == u["reused_tokens"] + u["prefill_tokens"] == session(client, sid)["token_count"]
    reply = turn(client, sid, user("Can I pay it?"))
    items = artifacts(client, sid)
    assert_tiles(items)
    doc, tool, question, answer = items[1:]
    assert (doc["kind"], doc["content"], doc["source"]) == ("document", "Invoice 17: total 98.70 EUR.",
                                                             "file://invoice.txt")
    assert (tool["kind"], tool["tool_call_id"], tool["content"]) == ("tool_result", "call_abc", "balance: 120.00 EUR")
    assert answer["id"] == reply["reply"]["artifact_id"]
    assert answer["parents"] == [items[0]["id"], doc["id"], tool["id"], question["id"]]
    assert {doc["id"], tool["id"]} <= set(answer["source_ids"])


def test_rendering_of_documents_and_tool_results(client: httpx.Client, database_url: str, live_server: Any,
                                                 server_engine: KVEngine) -> None:
    """The documented rendering: a document is a user block with a source header, a tool result a tool block
    without the call id (ids are random: a replay could not reproduce a prompt holding one)."""
    sid = create_session(client)
    turn(client, sid, {"type": "document", "content": "Page text.", "source": "https://example.org"},
         {"type": "document", "content": "No source."},
         {"type": "tool_result", "tool_call_id": "call_1", "content": "42"}, generate=False)
    rows = stored_artifacts(database_url, "WHERE session_id = $1 ORDER BY position", sid)
    chat = server_engine.chat
    expected = chat.render_block("user", "Document (source: https://example.org):\nPage text.")
    assert list(rows[1]["token_ids"]) == expected
    assert list(rows[2]["token_ids"]) == chat.render_block("user", "Document:\nNo source.")
    assert list(rows[3]["token_ids"]) == chat.render_block("tool", "42")


def test_a_stop_string_cut_keeps_tokens_and_content_in_agreement(client: httpx.Client, database_url: str,
                                                                  live_server: Any, server_engine: KVEngine) -> None:
    sid = create_session(client, sampling={"temperature": 0, "max_tokens": 24, "seed": 2, "stop": [" "]})
    t = turn(client, sid, user("Write a long sentence about the sea."))
    content = t["reply"]["content"]
    assert " " not in content and t["reply"]["finish_reason"] == "stop"
    row = stored_artifacts(database_url, "WHERE id = $1", t["reply"]["artifact_id"])[0]
    chat = server_engine.chat
    assert row["content"] == content
    assert list(row["token_ids"]) == [*chat.assistant_header(), *chat.encode(content), *chat.end_of_turn()]
    assert_tiles(artifacts(client, sid))
    # The re-rendered log is what the cache holds: the next turn reuses all of it.
    logged = session(client, sid)["token_count"]
    assert turn(client, sid, user("Thanks."))["usage"]["reused_tokens"] == logged


def _run_script(client: httpx.Client, sampling: dict[str, Any]) -> list[tuple[str, str, tuple[int, int]]]:
    sid = create_session(client, sampling=sampling)
    for text in ["I like jogging.", "Suggest a breakfast."]:
        turn(client, sid, user(text))
    return [(a["kind"], a["content"], tuple(a["token_span"])) for a in artifacts(client, sid)]


def test_the_same_script_with_the_same_seed_gives_the_same_artifacts(client: httpx.Client) -> None:
    greedy = {"temperature": 0, "max_tokens": 10, "seed": 5}
    sampled = {"temperature": 0.7, "top_p": 0.95, "max_tokens": 10, "seed": 5}
    assert _run_script(client, greedy) == _run_script(client, greedy)
    first = _run_script(client, sampled)
    assert first == _run_script(client, sampled)


def test_provenance_edges_grow_linearly(client: httpx.Client, database_url: str) -> None:
    sid = create_session(client, sampling={"temperature": 0, "max_tokens": 1, "seed": 0})
    counts = []
    for i in range(6):
        turn(client, sid, user(f"Message {i}."))
        rows = sql(database_url, "SELECT count(*) AS n FROM provenance_edges WHERE session_id = $1", sid)
        counts.append(rows[0]["n"])
    # Two new edges per turn (the new message and the previous reply; the system block for the first): O(n), not O(n²).
    assert counts == [2 * (i + 1) for i in range(6)], counts


def test_a_prompt_over_the_context_is_413_and_writes_nothing(client: httpx.Client) -> None:
    sid = create_session(client)
    before = session(client, sid)
    r = client.post(f"/v1/sessions/{sid}/turns", json={"inputs": [user("lorem ipsum " * 16_000)]})
    body = problem(r, 413)
    assert body["context_tokens"] > 0 and body["prompt_tokens"] > body["context_tokens"]
    assert session(client, sid) == before
    assert turn(client, sid, user("Short now."))["turn"] == 1


def test_bad_input_is_422_never_5xx(client: httpx.Client) -> None:
    sid = create_session(client)
    bad_turns = [
        {"inputs": [{"type": "shout", "content": "hi"}]},
        {"inputs": [{"type": "user"}]},
        {"inputs": [{"type": "tool_result", "content": "x"}]},
        {"inputs": [user("hi")], "temperature": 3},
        {"inputs": "hi"},
        {"inputs": [user("hi")], "generate": "maybe"},
    ]
    for body in bad_turns:
        problem(client.post(f"/v1/sessions/{sid}/turns", json=body), 422)
    for config in [{"sampling": {"temperature": -1}}, {"checkpoint_policy": "sometimes"}, {"colour": "blue"},
                   {"context_policy": "everything"}, {"sampling": {"max_tokens": 0}}]:
        problem(client.post("/v1/sessions", json=config), 422)
    r = client.post(f"/v1/sessions/{sid}/turns", content=b"{not json", headers={"Content-Type": "application/json"})
    problem(r, 422)
    assert session(client, sid)["turns"] == 0
