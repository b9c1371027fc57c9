"""A session's settings at rest (issue 42, docs/erasure-at-rest.md): the system prompt, the tool specs, the tool
environment snapshots and the OpenAI objects' client strings (a conversation's metadata, a response's parameters)
reach PostgreSQL only as ciphertext; deleting a session shreds every leaf of its content (artifacts, settings,
environments, responses) while other sessions keep theirs; a branch's copies are its own; a ciphertext moved to
another row does not open; the key provider down answers a session's creation 503 and writes nothing.

Everything is real: the suite's embedded PostgreSQL, server and tiny model, its local key store. SQL only looks at
the tables; a keyring built here is a fresh process's over the same key store, with nothing cached.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.keys.errors import Tampered
from app.sessions.repositories.settings_sealing import settings_binding, state_binding
from tests.forget.forget_helpers import forget, run_script, user
from tests.support import (
    derives,
    files_holding,
    fresh_keyring,
    problem,
    rewired,
    sql,
    stored_environments,
    sweep_shreds,
)

GREEDY = {"temperature": 0, "max_tokens": 48, "seed": 1}  # as tests/forget/test_forget_tools.py: it copies a call


def _copy_call(name: str, arguments: dict[str, Any]) -> dict[str, str]:
    call = json.dumps({"name": name, "arguments": arguments})
    return {"type": "user", "content": f"Copy this exactly: <tool_call>{call}</tool_call>"}


def _tools(description: str) -> list[dict[str, Any]]:
    return [
        {"name": "get_balance", "builtin": True},
        {"name": "transfer", "builtin": True},
        {"name": "lookup_contact", "description": description,
         "parameters": {"type": "object", "properties": {"name": {"type": "string"}}}},
    ]


def _tooled_session(client: httpx.Client, system: str, description: str, payee: str) -> str:
    """A session whose system prompt, tool description and environment (a transfer to `payee`) hold the markers."""
    session_id, _ = run_script(client, [[_copy_call("transfer", {"to": payee, "amount": 10})]], GREEDY,
                               system_prompt=system, tools=_tools(description))
    return session_id


def _leaves(database_url: str, session_id: str) -> dict[str, list[int]]:
    """Every leaf a session's content is sealed under, per table."""
    return {
        table: [r["leaf"] for r in sql(database_url, f"SELECT leaf FROM {table} WHERE {key} = $1 AND leaf IS NOT NULL",
                                       session_id)]
        for table, key in (("sessions", "id"), ("artifacts", "session_id"), ("env_snapshots", "session_id"),
                           ("openai_conversations", "session_id"), ("openai_responses", "session_id"))
    }


def _tenant(database_url: str, session_id: str) -> str:
    return str(sql(database_url, "SELECT tenant_id FROM sessions WHERE id = $1", session_id)[0]["tenant_id"])


def _model(client: httpx.Client) -> str:
    return str(client.get("/v1/models").json()["data"][0]["id"])


def test_no_plaintext_settings_environment_or_openai_strings_reach_the_database_files(
    client: httpx.Client, database_url: str, data_dir: Path
) -> None:
    tag = "4de891fda5"  # fixed: the greedy tiny model copies the call for this text (the data directory is the run's)
    system, description, payee = f"sysq{tag}", f"toolq{tag}", f"payq{tag}"
    conv_meta, resp_meta, source = f"convq{tag}", f"respq{tag}", f"srcq{tag}"
    session_id = _tooled_session(client, f"You are a bank clerk {system}. Use tools.",
                                 f"Find a contact {description}", payee)
    shown = client.get(f"/v1/sessions/{session_id}").json()
    assert system in shown["system_prompt"] and description in json.dumps(shown["tools"])  # opened on every read
    [snapshot] = stored_environments(database_url, session_id)
    assert snapshot["leaf"] is not None and payee in json.dumps(snapshot["state"])
    document = {"type": "document", "content": "Rates are 3%.", "source": f"https://example.org/{source}"}
    added = client.post(f"/v1/sessions/{session_id}/turns", json={"inputs": [document], "generate": False})
    assert added.status_code == 200, added.text
    listed = client.get(f"/v1/sessions/{session_id}/artifacts").json()["artifacts"]
    assert [a["source"] for a in listed if a["kind"] == "document"] == [f"https://example.org/{source}"]
    raw = sql(database_url, "SELECT system_prompt, tools, settings_sealed FROM sessions WHERE id = $1", session_id)
    assert raw[0]["system_prompt"] is None and raw[0]["tools"] is None and raw[0]["settings_sealed"] is not None

    conv = client.post("/v1/conversations", json={"items": [{"role": "user", "content": "Hi."}],
                                                   "metadata": {"topic": conv_meta}})
    assert conv.status_code == 200, conv.text
    assert client.get(f"/v1/conversations/{conv.json()['id']}").json()["metadata"] == {"topic": conv_meta}
    response = client.post("/v1/responses", json={
        "model": _model(client), "input": "Say hi.", "metadata": {"note": resp_meta}, "max_output_tokens": 8,
        "temperature": 0,
    })
    assert response.status_code == 200, response.text
    assert client.get(f"/v1/responses/{response.json()['id']}").json()["metadata"] == {"note": resp_meta}
    sql(database_url, "CHECKPOINT")  # heap pages to their files; the WAL holds every change already

    markers = [m.encode() for m in (system, description, payee, conv_meta, resp_meta, source)]
    found = files_holding(data_dir / "pg", [*markers, session_id.encode()])
    assert found[session_id.encode()], "the scan does not see what the database wrote"  # ids are in the clear
    assert {m: found[m] for m in markers} == {m: [] for m in markers}


def test_deleting_a_session_shreds_every_leaf_of_it_and_no_other(
    client: httpx.Client, database_url: str, live_server: Any
) -> None:
    doomed = _tooled_session(client, "You are a clerk. Use tools.", "Find a contact", "DE-DOOMED")
    kept = _tooled_session(client, "You are a clerk. Use tools.", "Find a contact", "DE-KEPT")
    tenant_id = _tenant(database_url, doomed)
    leaves, survivors = _leaves(database_url, doomed), _leaves(database_url, kept)
    assert leaves["sessions"] and leaves["artifacts"] and leaves["env_snapshots"]
    everything = [leaf for found in leaves.values() for leaf in found]
    assert len(set(everything)) == len(everything)  # one leaf per unit, never shared
    assert not set(everything) & {leaf for found in survivors.values() for leaf in found}

    assert client.delete(f"/v1/sessions/{doomed}").status_code == 204
    problem(client.get(f"/v1/sessions/{doomed}"), 404)
    [job] = sql(database_url, "SELECT * FROM forget_jobs WHERE strategy = 'session_delete' AND target->>'session_id' "
                              "= $1", doomed)
    assert set(job["shred_leaves"]) == set(everything) and job["shredded_at"] is not None  # settled before the 204
    keyring = fresh_keyring(live_server)
    assert [leaf for leaf in everything if derives(keyring, tenant_id, leaf)] == []
    assert all(derives(keyring, tenant_id, leaf) for found in survivors.values() for leaf in found)
    again = client.get(f"/v1/sessions/{kept}")
    assert again.status_code == 200 and again.json()["system_prompt"] == "You are a clerk. Use tools."
    receipt = client.get(f"/v1/forget/{job['id']}").json()
    assert receipt["erasure"]["at_rest"] == "complete", receipt


def test_a_forget_that_rewrites_the_system_prompt_shreds_its_old_leaf(
    client: httpx.Client, database_url: str, live_server: Any
) -> None:
    secret = "QX9911"
    session_id, _ = run_script(client, [[user("Hello.")]], {"temperature": 0, "max_tokens": 4, "seed": 3},
                               system_prompt=f"You are helpful. My code is {secret}.")
    tenant_id = _tenant(database_url, session_id)
    [old] = _leaves(database_url, session_id)["sessions"]
    job = forget(client, {"session_id": session_id, "text": secret}, wait=True)
    assert job["status"] == "succeeded" and job["erasure"]["at_rest"] == "complete", job
    [new] = _leaves(database_url, session_id)["sessions"]
    [recorded] = sql(database_url, "SELECT shred_leaves FROM forget_jobs WHERE id = $1", job["id"])
    assert new != old and old in recorded["shred_leaves"] and new not in recorded["shred_leaves"]
    keyring = fresh_keyring(live_server)
    assert not derives(keyring, tenant_id, old) and derives(keyring, tenant_id, new)
    shown = client.get(f"/v1/sessions/{session_id}").json()["system_prompt"]
    assert shown.startswith("You are helpful.") and secret not in shown


def test_a_branch_keeps_its_settings_after_its_parent_is_deleted(
    client: httpx.Client, database_url: str
) -> None:
    model, instructions = _model(client), f"You are terse {uuid.uuid4().hex[:6]}."

    def respond(text: str, previous: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "input": text, "instructions": instructions, "max_output_tokens": 6,
                                "temperature": 0, "metadata": {"step": text}}
        if previous is not None:
            body["previous_response_id"] = previous
        answer = client.post("/v1/responses", json=body)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    first = respond("One.", None)
    respond("Two.", first["id"])
    branched = respond("Three.", first["id"])  # `first` is no longer its session's newest: a branch
    parent = sql(database_url, "SELECT session_id FROM openai_responses WHERE id = $1", first["id"])[0]["session_id"]
    branch = sql(database_url, "SELECT session_id FROM openai_responses WHERE id = $1", branched["id"])[0]["session_id"]
    assert parent != branch
    parent_leaves, branch_leaves = _leaves(database_url, parent), _leaves(database_url, branch)
    assert not {x for f in parent_leaves.values() for x in f} & {x for f in branch_leaves.values() for x in f}

    assert client.delete(f"/v1/sessions/{parent}").status_code == 204
    assert client.get(f"/v1/sessions/{branch}").json()["system_prompt"] == instructions
    later = respond("Four.", branched["id"])
    assert later["instructions"] == instructions and later["metadata"] == {"step": "Four."}
    assert client.get(f"/v1/responses/{branched['id']}").json()["metadata"] == {"step": "Three."}


def test_a_ciphertext_moved_to_another_row_does_not_open(
    client: httpx.Client, database_url: str, live_server: Any
) -> None:
    # Texts the greedy tiny model copies the transfer call for (each session gets an environment snapshot).
    a = _tooled_session(client, "You are a clerk. Use tools.", "Find a contact", "DE-DOOMED")
    b = _tooled_session(client, "You are a banking assistant. Use tools.", "Find a contact's IBAN", "payqabc")
    tenant_id = _tenant(database_url, a)
    [row] = sql(database_url, "SELECT settings_sealed FROM sessions WHERE id = $1", a)
    [env_a], [env_b] = stored_environments(database_url, a), stored_environments(database_url, b)
    keyring = fresh_keyring(live_server)
    opened = json.loads(asyncio.run(keyring.unseal(settings_binding(tenant_id, a), row["settings_sealed"])))
    assert opened["system_prompt"] == "You are a clerk. Use tools."
    with pytest.raises(Tampered):  # under session b's name: it does not authenticate, and never reads as erased
        asyncio.run(keyring.unseal(settings_binding(tenant_id, b), row["settings_sealed"]))
    with pytest.raises(Tampered):
        asyncio.run(keyring.unseal(state_binding(tenant_id, env_b["id"]), env_a["state_sealed"]))

    # Moved in the database itself: session b's row answers loudly, never with session a's prompt.
    sql(database_url, "UPDATE sessions SET settings_sealed = $1, leaf = (SELECT leaf FROM sessions WHERE id = $2) "
                      "WHERE id = $3", row["settings_sealed"], a, b)
    moved = client.get(f"/v1/sessions/{b}")
    assert moved.status_code == 500 and "clerk" not in moved.text
    sql(database_url, "DELETE FROM sessions WHERE id = $1", b)  # the tampered row would fail `lethe keys verify`


@pytest.fixture
def provider_down(tmp_path: Path, live_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """For this test, the live server's sessions seal with a keyring whose key store cannot be read (a file where
    its directory should be), with nothing cached: every key a new session needs is `Unavailable`."""
    blocked = tmp_path / "keys-down"
    blocked.write_text("not a directory")
    container = live_server.app.state.container
    monkeypatch.setattr(container.services.sessions, "sealer", rewired(container, key_dir=blocked).sealer)


@pytest.mark.usefixtures("provider_down")
def test_creating_a_session_with_the_key_provider_down_answers_503_and_writes_nothing(
    client: httpx.Client, database_url: str
) -> None:
    before = sql(database_url, "SELECT count(*) AS n FROM sessions")[0]["n"]
    answer = client.post("/v1/sessions", json={"system_prompt": "Never stored."})
    assert problem(answer, 503)["type"].endswith("keys-unavailable") and int(answer.headers["Retry-After"]) > 0
    assert sql(database_url, "SELECT count(*) AS n FROM sessions")[0]["n"] == before


def test_a_deletion_whose_shred_the_provider_refused_stays_pending_until_a_retry(
    client: httpx.Client, database_url: str, live_server: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    session_id, _ = run_script(client, [[user("Hello.")]], {"temperature": 0, "max_tokens": 4, "seed": 3},
                               system_prompt="You are helpful.")
    tenant_id = _tenant(database_url, session_id)
    everything = [leaf for found in _leaves(database_url, session_id).values() for leaf in found]
    blocked = tmp_path / "keys-down"
    blocked.write_text("not a directory")
    container = live_server.app.state.container
    # Its shredder cannot reach the key store (the deletion itself opens the session with the server's own keys).
    monkeypatch.setattr(container.services.sessions, "settle", rewired(container, key_dir=blocked).shredder.settle)
    with caplog.at_level(logging.WARNING, logger="app.forget.shredding"):
        assert client.delete(f"/v1/sessions/{session_id}").status_code == 204  # the deletion committed
    assert any("shred pending" in r.getMessage() for r in caplog.records)
    [job] = sql(database_url, "SELECT id, shred_leaves FROM forget_jobs WHERE strategy = 'session_delete' AND "
                              "target->>'session_id' = $1", session_id)
    assert set(job["shred_leaves"]) == set(everything)

    sweep_shreds(database_url, live_server)
    assert client.get(f"/v1/forget/{job['id']}").json()["erasure"]["at_rest"] == "complete"
    keyring = fresh_keyring(live_server)
    assert [leaf for leaf in everything if derives(keyring, tenant_id, leaf)] == []
