"""Data subjects (issue 43, the access slice; docs/subjects.md): sessions and conversations name their subject,
namespaces are linked with PUT, GET shows what is linked, and the export streams everything held about the person
and nothing about anyone else, with past forgets as ids and counts only.

Against the run's real server, PostgreSQL and tiny model.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import httpx

from tests.forget.forget_helpers import artifacts, forget, run_script, user
from tests.support import problem

FAST = {"temperature": 0, "max_tokens": 4, "seed": 3}


def _subject() -> str:
    return "user-" + uuid.uuid4().hex[:10]


def _export(client: httpx.Client, subject_id: str) -> dict[str, Any]:
    r = client.get(f"/v1/subjects/{subject_id}/export")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    exported: dict[str, Any] = json.loads(r.text)
    return exported


def _put_memory(client: httpx.Client, ns: str, key: str, value: Any) -> None:
    r = client.put(f"/v1/memory/{ns}/{key}", json={"value": value, "source": "user"}, headers={"If-None-Match": "*"})
    assert r.status_code == 201, r.text


def test_a_subjects_export_holds_their_sessions_conversations_and_memory_and_nothing_else(
    client: httpx.Client,
) -> None:
    alice, bob = _subject(), _subject()
    ns, other_ns = "subj-" + uuid.uuid4().hex[:8], "subj-" + uuid.uuid4().hex[:8]
    first, _ = run_script(client, [[user("Alice likes tea.")]], FAST, subject_id=alice)
    second, ids = run_script(client, [[user("Alice's IBAN is UK0099.")], [user("Thanks.")]], FAST, subject_id=alice)
    bobs, _ = run_script(client, [[user("Bob likes coffee.")]], FAST, subject_id=bob)
    conv = client.post("/v1/conversations", json={"metadata": {"lethe_subject_id": alice},
                                                  "items": [{"role": "user", "content": "Alice lives in Leeds."}]})
    assert conv.status_code == 200, conv.text
    _put_memory(client, ns, "drink", {"likes": "tea"})
    _put_memory(client, other_ns, "drink", {"likes": "coffee"})
    made = client.put(f"/v1/subjects/{alice}", json={"memory_namespaces": [ns, ns]})
    assert made.status_code == 200 and made.json()["memory_namespaces"] == [ns]  # made by her first session already
    assert client.put(f"/v1/subjects/{bob}", json={"memory_namespaces": [other_ns]}).status_code == 200
    assert forget(client, {"artifact_id": ids[0][0]}, wait=True, reason="Alice asked")["status"] == "succeeded"

    linked = client.get(f"/v1/subjects/{alice}").json()
    assert linked["sessions"] == 3 and set(linked["session_ids"]) == {first, second, conv.json()["lethe_session_id"]}
    assert linked["conversation_ids"] == [conv.json()["id"]] and linked["erased_at"] is None
    assert client.get(f"/v1/sessions/{first}").json()["subject_id"] == alice

    exported = _export(client, alice)
    text = json.dumps(exported)
    assert exported["subject"]["id"] == alice and exported["subject"]["memory_namespaces"] == [ns]
    by_id = {s["id"]: s for s in exported["sessions"]}
    assert set(by_id) == set(linked["session_ids"])
    assert [a["content"] for a in by_id[first]["artifacts"]] == [a["content"] for a in artifacts(client, first)]
    assert by_id[conv.json()["lethe_session_id"]]["conversation_id"] == conv.json()["id"]
    assert "Alice lives in Leeds." in text and "Alice likes tea." in text
    assert exported["memory"] == [{"namespace": ns, "key": "drink", "version": 1, "value": {"likes": "tea"},
                                   "updated_at": exported["memory"][0]["updated_at"]}]
    # Forgotten, and the forget's target and reason: not in the export; the forget itself, as ids and counts.
    assert "UK0099" not in text and "Alice asked" not in text
    [receipt] = exported["forget_receipts"]
    assert receipt["status"] == "succeeded" and receipt["sessions"][0]["session_id"] == second
    assert receipt["sessions"][0]["artifacts_erased"] >= 1
    # Nobody else's.
    assert "Bob" not in text and "coffee" not in text and bobs not in text


def test_a_subject_made_by_put_alone_exports_an_empty_document(client: httpx.Client) -> None:
    subject = _subject()
    made = client.put(f"/v1/subjects/{subject}", json={"memory_namespaces": []})
    assert made.status_code == 201 and made.json()["sessions"] == 0
    again = client.put(f"/v1/subjects/{subject}", json={"memory_namespaces": []})
    assert again.status_code == 200
    exported = _export(client, subject)
    assert exported["sessions"] == [] and exported["memory"] == [] and exported["forget_receipts"] == []


def test_concurrent_puts_make_the_subject_once(client: httpx.Client) -> None:
    subject, barrier, codes = _subject(), threading.Barrier(4), []

    def put() -> None:
        with httpx.Client(base_url=str(client.base_url), headers=dict(client.headers), timeout=60) as own:
            barrier.wait()
            codes.append(own.put(f"/v1/subjects/{subject}", json={"memory_namespaces": ["n"]}).status_code)

    threads = [threading.Thread(target=put) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [200, 200, 200, 201]


def test_other_tenants_and_unknown_subjects_answer_404(client: httpx.Client, other_tenant: httpx.Client) -> None:
    subject = _subject()
    assert client.put(f"/v1/subjects/{subject}", json={"memory_namespaces": []}).status_code == 201
    for path in (f"/v1/subjects/{subject}", f"/v1/subjects/{subject}/export"):
        problem(other_tenant.get(path), 404)
        problem(client.get(path.replace(subject, _subject())), 404)


def test_bad_input_answers_422_or_400_and_makes_nothing(client: httpx.Client) -> None:
    for bad in ("-starts-with-dash", "has space", "x" * 201, "semi;colon"):
        problem(client.get(f"/v1/subjects/{bad}"), 422)
        problem(client.put(f"/v1/subjects/{bad}", json={"memory_namespaces": []}), 422)
    subject = _subject()
    problem(client.put(f"/v1/subjects/{subject}", json={"memory_namespaces": ["a/b"]}), 422)
    problem(client.put(f"/v1/subjects/{subject}", json={"memory_namespaces": [f"n{i}" for i in range(101)]}), 422)
    problem(client.put(f"/v1/subjects/{subject}", json={"namespaces": []}), 422)
    problem(client.get(f"/v1/subjects/{subject}"), 404)  # nothing was made
    problem(client.post("/v1/sessions", json={"subject_id": "has space"}), 422)
    conv = client.post("/v1/conversations", json={"metadata": {"lethe_subject_id": "has space"}})
    assert conv.status_code == 400 and conv.json()["error"]["param"] == "metadata.lethe_subject_id", conv.text
