"""The thread routes (app/threads/) over real HTTP: the delete/write barrier in PostgreSQL, the rewrite's versions,
and bad input (413, 404 for another tenant's or a missing thread, 422 for malformed ids, namespaces and values, 409
for a copy onto itself).
The LangGraph side (LetheSaver, the conformance suite, a real graph) is clients/python/tests/test_langgraph_saver.py."""

from __future__ import annotations

import base64
import threading
import uuid
from typing import Any

import httpx

from tests.support import HeldLock, problem


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def checkpoint(parent: str | None = None, ns: str = "", **extra: Any) -> dict[str, Any]:
    return {"checkpoint_ns": ns, "parent_id": parent, "checkpoint": {"type": "msgpack", "data": b64(b"\x80")},
            "metadata": {"source": "loop", "step": 0}, "channel_versions": {"messages": "1"},
            "blobs": [{"channel": "messages", "version": "1", "type": "msgpack", "data": b64(b"hello")}], **extra}


def put(client: httpx.Client, thread: str, cid: str, body: dict[str, Any]) -> httpx.Response:
    return client.put(f"/v1/threads/{thread}/checkpoints/{cid}", json=body)


def new_thread(client: httpx.Client) -> str:
    thread = "t-" + uuid.uuid4().hex[:12]
    assert put(client, thread, "c1", checkpoint()).status_code == 200
    return thread


def test_a_put_waiting_on_the_thread_when_it_is_deleted_is_refused(client: httpx.Client, database_url: str) -> None:
    """The delete takes the thread's row first; the put waits behind it in PostgreSQL, then sees the deleted
    parent and is refused: an ordered barrier, not a check made before the delete committed."""
    thread = new_thread(client)
    answers: dict[str, httpx.Response] = {}

    def send(name: str, method: str, path: str, body: Any = None) -> threading.Thread:
        def run() -> None:
            answers[name] = client.request(method, path, json=body)
        worker = threading.Thread(target=run)
        worker.start()
        return worker

    with HeldLock(database_url, "SELECT 1 FROM threads WHERE thread_id = $1 FOR UPDATE", thread) as lock:
        deleting = send("delete", "DELETE", f"/v1/threads/{thread}")
        lock.wait_blocked(1)
        writing = send("put", "PUT", f"/v1/threads/{thread}/checkpoints/c2", checkpoint(parent="c1"))
        lock.wait_blocked(2)
    deleting.join(60)
    writing.join(60)
    assert answers["delete"].status_code == 200 and answers["delete"].json()["deleted_checkpoints"] == 1
    assert problem(answers["put"], 412)["type"].endswith("/thread-deleted")
    assert client.get(f"/v1/threads/{thread}/checkpoints").json()["checkpoints"] == []
    # writes for the refused checkpoint are refused too; a fresh start (no parent) is a new thread
    late = client.post(f"/v1/threads/{thread}/checkpoints/c2/writes",
                       json={"task_id": "t", "writes": [{"idx": 0, "channel": "x", "type": "msgpack", "data": ""}]})
    assert problem(late, 412)["type"].endswith("/thread-deleted")
    assert put(client, thread, "c3", checkpoint()).status_code == 200
    assert [c["checkpoint_id"] for c in client.get(f"/v1/threads/{thread}/checkpoints").json()["checkpoints"]] == ["c3"]


def test_a_rewrite_is_refused_after_a_write_and_refuses_writers_of_the_old_values(client: httpx.Client) -> None:
    thread = new_thread(client)
    values = client.get(f"/v1/threads/{thread}/values").json()
    assert [b["data"] for b in values["blobs"]] == [b64(b"hello")] and values["generation"] == 0
    assert put(client, thread, "c2", checkpoint(parent="c1", generation=0)).status_code == 200  # moves the revision
    blob = {"checkpoint_ns": "", "channel": "messages", "version": "1", "type": "msgpack", "data": b64(b"")}
    stale = client.post(f"/v1/threads/{thread}/rewrite", json={"revision": values["revision"], "blobs": [blob]})
    assert problem(stale, 412)["type"].endswith("/thread-changed")

    values = client.get(f"/v1/threads/{thread}/values").json()
    done = client.post(f"/v1/threads/{thread}/rewrite", json={"revision": values["revision"], "blobs": [blob]})
    assert done.status_code == 200 and done.json()["generation"] == 1
    assert client.get(f"/v1/threads/{thread}/checkpoints/c1").json()["blobs"][0]["data"] == b64(b"")
    # a writer that read generation 0 is refused; one naming nothing is judged by its parent's generation (0 too)
    for claim in ({"generation": 0}, {}):
        refused = put(client, thread, "c3", checkpoint(parent="c2", **claim))
        assert problem(refused, 412)["type"].endswith("/thread-rewritten")
    assert put(client, thread, "c3", checkpoint(parent="c2", generation=1)).status_code == 200


def test_an_oversized_checkpoint_answers_413(client: httpx.Client) -> None:
    thread = "t-" + uuid.uuid4().hex[:12]
    body = checkpoint()
    body["blobs"][0]["data"] = b64(b"x" * 600_000)  # over LETHE_THREAD_MAX_CHECKPOINT_BYTES, under the body limit
    assert problem(put(client, thread, "c1", body), 413)["limit"] == 524_288
    assert client.get(f"/v1/threads/{thread}/checkpoints").json()["checkpoints"] == []


def test_another_tenants_thread_answers_404(client: httpx.Client, other_tenant: httpx.Client) -> None:
    thread = new_thread(client)
    problem(other_tenant.get(f"/v1/threads/{thread}/checkpoints/c1"), 404)
    problem(other_tenant.delete(f"/v1/threads/{thread}"), 404)
    problem(other_tenant.get(f"/v1/threads/{thread}/values"), 404)
    problem(other_tenant.post(f"/v1/threads/{thread}/copy", json={"target_thread_id": thread + "-x"}), 404)
    problem(other_tenant.post(f"/v1/threads/{thread}/rewrite", json={"revision": 1}), 404)
    assert other_tenant.get(f"/v1/threads/{thread}/checkpoints").json()["checkpoints"] == []
    assert other_tenant.post("/v1/threads:prune", json={"thread_ids": [thread], "strategy": "delete"}).json() == {
        "deleted_checkpoints": 0}
    assert client.get(f"/v1/threads/{thread}/checkpoints/c1").status_code == 200  # the owner's thread is intact


def test_a_missing_thread_answers_404(client: httpx.Client) -> None:
    thread = "t-" + uuid.uuid4().hex[:12]
    problem(client.get(f"/v1/threads/{thread}/checkpoints/c1"), 404)
    problem(client.delete(f"/v1/threads/{thread}"), 404)
    problem(client.get(f"/v1/threads/{thread}/values"), 404)
    problem(client.post(f"/v1/threads/{thread}/copy", json={"target_thread_id": thread + "-x"}), 404)


def test_malformed_input_answers_422(client: httpx.Client) -> None:
    thread = new_thread(client)
    problem(put(client, "has space", "c1", checkpoint()), 422)
    problem(put(client, "x" * 201, "c1", checkpoint()), 422)
    problem(put(client, thread, "c9", checkpoint(ns="bad\nnamespace")), 422)
    problem(client.get(f"/v1/threads/{thread}/checkpoints", params={"checkpoint_ns": "tab\there"}), 422)
    bad_data = checkpoint()
    bad_data["checkpoint"]["data"] = "not base64!"
    problem(put(client, thread, "c9", bad_data), 422)
    problem(put(client, thread, "c9", {**checkpoint(), "surprise": 1}), 422)
    problem(client.get(f"/v1/threads/{thread}/checkpoints", params={"metadata": "{not json"}), 422)
    problem(client.get(f"/v1/threads/{thread}/checkpoints", params={"metadata": "[1]"}), 422)
    problem(client.get(f"/v1/threads/{thread}/checkpoints", params={"cursor": "bm9wZQ"}), 422)
    problem(client.post("/v1/threads:prune", json={"thread_ids": [thread], "strategy": "all"}), 422)
    problem(client.get(f"/v1/threads/{thread}/checkpoints", params={"metadata": "{" * 10_001}), 422)
    bad_padding = checkpoint()
    bad_padding["checkpoint"]["data"] = "e30"  # "{}" without its padding
    problem(put(client, thread, "c9", bad_padding), 422)
    problem(put(client, thread, "c9", {**checkpoint(), "channel_versions": {"bad\nchannel": "1"}}), 422)
    problem(client.post(f"/v1/threads/{thread}/copy", json={"target_thread_id": thread}), 409)


def test_pages_follow_the_cursor_newest_first(client: httpx.Client) -> None:
    thread = "t-" + uuid.uuid4().hex[:12]
    parent = None
    for i in range(5):
        assert put(client, thread, f"c{i}", checkpoint(parent=parent)).status_code == 200
        parent = f"c{i}"
    seen, cursor = [], None
    while True:
        page = client.get(f"/v1/threads/{thread}/checkpoints",
                          params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
        seen += [c["checkpoint_id"] for c in page["checkpoints"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ["c4", "c3", "c2", "c1", "c0"]


def test_the_tenant_listing_spans_threads_newest_first_and_pages(
    client: httpx.Client, other_tenant: httpx.Client
) -> None:
    """`GET /v1/threads:checkpoints` (LangGraph's list(None)): every thread's checkpoints by id, newest first, ties
    in thread order, filtered and paged like a thread's; another tenant's listing never shows them."""
    run = uuid.uuid4().hex[:12]
    first, second = f"ta-{run}", f"tb-{run}"
    marked = {"source": "loop", "step": 0, "run": run}
    for thread, ids in ((first, ["c1", "c3"]), (second, ["c2", "c3"])):
        parent = None
        for cid in ids:
            assert put(client, thread, f"{run}-{cid}", checkpoint(parent=parent, metadata=marked)).status_code == 200
            parent = f"{run}-{cid}"
    assert put(client, second, f"{run}-c4", checkpoint(parent=f"{run}-c3", ns="inner", metadata=marked)).status_code \
        == 200
    assert put(client, first, f"{run}-c5", checkpoint(parent=f"{run}-c3")).status_code == 200  # unmarked
    everything = [(second, "c4"), (second, "c3"), (first, "c3"), (second, "c2"), (first, "c1")]
    by_run = {"metadata": f'{{"run":"{run}"}}'}

    def listing(http: httpx.Client, **params: Any) -> tuple[list[tuple[str, str]], str | None]:
        answer = http.get("/v1/threads:checkpoints", params={**by_run, **params})
        assert answer.status_code == 200, answer.text
        page = answer.json()
        return ([(c["thread_id"], c["checkpoint_id"].removeprefix(f"{run}-")) for c in page["checkpoints"]],
                page["next_cursor"])

    assert listing(client)[0] == everything
    seen, cursor = [], None
    while True:
        got, cursor = listing(client, limit=2, **({"cursor": cursor} if cursor else {}))
        assert len(got) <= 2
        seen += got
        if cursor is None:
            break
    assert seen == everything
    assert listing(client, before=f"{run}-c3")[0] == [(second, "c2"), (first, "c1")]
    assert listing(client, checkpoint_ns="inner")[0] == [(second, "c4")]
    assert listing(client, checkpoint_ns="")[0] == everything[1:]
    # the checkpoint's values come opened, as a thread's listing has them
    top = client.get("/v1/threads:checkpoints", params={**by_run, "limit": 1}).json()["checkpoints"][0]
    assert top["blobs"][0]["data"] == b64(b"hello") and top["metadata"] == marked
    assert listing(other_tenant) == ([], None)
    # a thread's cursor is not this listing's, nor the other way round
    thread_cursor = client.get(f"/v1/threads/{first}/checkpoints", params={"limit": 1}).json()["next_cursor"]
    problem(client.get("/v1/threads:checkpoints", params={"cursor": thread_cursor}), 422)
    _, tenant_cursor = listing(client, limit=1)
    assert tenant_cursor is not None
    problem(client.get(f"/v1/threads/{first}/checkpoints", params={"cursor": tenant_cursor}), 422)
    problem(client.get("/v1/threads:checkpoints", params={"metadata": "[1]"}), 422)
    problem(client.get("/v1/threads:checkpoints", params={"metadata": "{" * 10_001}), 422)
    problem(client.get("/v1/threads:checkpoints", params={"before": "has space"}), 422)
    problem(client.get("/v1/threads:checkpoints", params={"limit": 0}), 422)
