"""`lethe serve` with LETHE_HTTP_WORKERS=2: two HTTP workers in front of one engine process (app/serving.py).

What must hold: the model is loaded once (only the engine process maps torch), every turn of a session reaches the
process holding its warm cache, memory is served by the workers themselves, engine routes (streams included) are
forwarded unchanged, a forget queued by a worker is run by the engine process, /metrics answers for all processes,
an engine process that dies is started again while memory keeps answering, and nothing outlives a SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from bench.serve import LetheServer, stop_postgres

KEY = "workers-key-" + "5" * 28
HEADERS = {"Authorization": f"Bearer {KEY}"}
POLL_S = 0.25


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LetheServer]:
    data_dir = tmp_path_factory.mktemp("workers")
    proc = LetheServer(data_dir, None, LETHE_HTTP_WORKERS="2", LETHE_BOOTSTRAP_API_KEY=KEY)
    try:
        proc.wait_ready()
        yield proc
    finally:
        try:
            assert proc.stop() == 0
        finally:
            stop_postgres(data_dir / "pg")


@pytest.fixture
def client(server: LetheServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=HEADERS, timeout=120) as c:
        yield c


def _children(server: LetheServer) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """(engine processes, HTTP workers) of the supervisor."""
    kids = psutil.Process(server.proc.pid).children()
    engines = [p for p in kids if "engine-process" in p.cmdline()]
    workers = [p for p in kids if "http-worker" in p.cmdline()]
    return engines, workers


def _maps_torch(process: psutil.Process) -> bool:
    return "libtorch" in Path(f"/proc/{process.pid}/maps").read_text()


def _until(condition: object, what: str, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(POLL_S)


def test_one_engine_process_holds_the_model_and_every_turn_finds_its_cache(
    server: LetheServer, client: httpx.Client
) -> None:
    engines, workers = _children(server)
    assert len(engines) == 1 and len(workers) == 2
    assert _maps_torch(engines[0])
    assert not any(_maps_torch(w) for w in workers), "an HTTP worker loaded the model's runtime"

    assert client.put("/v1/memory/w/diet", json={"value": "vegan"}, headers={"If-None-Match": "*"}).status_code == 201
    assert client.get("/v1/memory/w/diet").json()["value"] == "vegan"

    session = client.post("/v1/sessions", json={"memory_namespace": "w", "sampling": {"max_tokens": 8}})
    assert session.status_code == 201, session.text
    sid = session.json()["id"]
    turns = []
    for text in ("Hello there.", "And again."):  # many connections: the workers take turns accepting them
        with httpx.Client(base_url=server.url, headers=HEADERS, timeout=120) as fresh:
            r = fresh.post(f"/v1/sessions/{sid}/turns", json={"inputs": [{"type": "user", "content": text}]})
        assert r.status_code == 200, r.text
        turns.append(r.json())
    # the second turn reused the cache the first one left: the same process served both
    assert turns[1]["usage"]["reused_tokens"] >= turns[0]["usage"]["prompt_tokens"]

    with client.stream(
        "POST", f"/v1/sessions/{sid}/turns",
        json={"inputs": [{"type": "user", "content": "Stream it."}], "stream": True},
    ) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("event: ") for line in stream.iter_lines() if line.startswith("event: ")]
    assert events[-1] == "turn" and "delta" in events, events

    metrics = httpx.get(server.url + "/metrics").text  # any worker answers for every process
    counted = {line[line.index("{") + 1 : line.rindex("}")] for line in metrics.splitlines()
               if line.startswith("lethe_http_requests_total{")}
    assert any('route="/v1/memory/{namespace}/{key}"' in labels for labels in counted)  # served by a worker
    assert any('route="/v1/sessions/{id}/turns"' in labels for labels in counted)  # by the engine process


def test_a_client_hanging_up_mid_stream_is_passed_on_to_the_engine_process(client: httpx.Client) -> None:
    """As in test_cancellation, through a worker: the reply would run for minutes; the client leaves after its first
    token, and the session's next turn is answered at once (not 409 after the wait bound) as its first turn."""
    created = client.post("/v1/sessions", json={"system_prompt": "You are a helpful assistant.",
                                                "sampling": {"max_tokens": 4096}})
    sid = created.json()["id"]
    count = [{"type": "user", "content": "Count from 1 to 10000, separated by commas."}]
    with client.stream("POST", f"/v1/sessions/{sid}/turns", json={"inputs": count, "stream": True}) as stream:
        assert stream.status_code == 200
        assert next(line for line in stream.iter_lines() if line.startswith("event: ")) == "event: delta"
    # the connection to the worker is closed here, mid-reply
    after = client.post(f"/v1/sessions/{sid}/turns", json={"inputs": [{"type": "user", "content": "Hi"}],
                                                            "generate": False})
    assert after.status_code == 200, after.text
    assert client.get(f"/v1/sessions/{sid}").json()["turns"] == 1


def test_a_forget_queued_by_a_worker_runs_in_the_engine_process(client: httpx.Client) -> None:
    assert client.put("/v1/memory/cascade/city", json={"value": "Paris"},
                      headers={"If-None-Match": "*"}).status_code == 201
    sid = client.post("/v1/sessions", json={"memory_namespace": "cascade", "sampling": {"max_tokens": 4}}).json()["id"]
    forgot = client.delete("/v1/memory/cascade/city")  # memory: answered by a worker, the job queued there
    assert forgot.status_code == 200 and forgot.json()["forget_id"]
    job_path = f"/v1/forget/{forgot.json()['forget_id']}"
    _until(lambda: client.get(job_path).json()["status"] in ("succeeded", "failed"), "the cascade job finished")
    job = client.get(job_path).json()
    assert job["status"] == "succeeded", job
    assert [s["session_id"] for s in job["sessions"]] == [sid]
    artifacts = client.get(f"/v1/sessions/{sid}/artifacts").json()
    assert "Paris" not in json.dumps(artifacts)


def test_a_dead_engine_process_is_restarted_while_memory_keeps_answering(
    server: LetheServer, client: httpx.Client
) -> None:
    sid = client.post("/v1/sessions", json={"sampling": {"max_tokens": 4}}).json()["id"]
    [engine], _ = _children(server)
    os.kill(engine.pid, signal.SIGKILL)
    engine.wait(timeout=30)

    # while it is down or loading: engine routes say so (503, Retry-After), memory is unaffected
    unavailable = client.get(f"/v1/sessions/{sid}")
    if unavailable.status_code == 503:
        assert unavailable.headers["Retry-After"] == "1"
        assert unavailable.json()["type"].endswith("/not-ready")
    else:
        assert unavailable.status_code == 200  # already back: the restart was faster than this request
    assert client.put("/v1/memory/w/while-down", json={"value": 1}, headers={"If-None-Match": "*"}).status_code == 201

    _until(lambda: httpx.get(server.url + "/readyz", timeout=10).status_code == 200, "the engine process is back")
    [again], _ = _children(server)
    assert again.pid != engine.pid
    r = client.post(f"/v1/sessions/{sid}/turns", json={"inputs": [{"type": "user", "content": "Still here?"}]})
    assert r.status_code == 200, r.text


def test_sigterm_stops_every_process(tmp_path: Path) -> None:
    proc = LetheServer(tmp_path, None, LETHE_HTTP_WORKERS="2", LETHE_BOOTSTRAP_API_KEY=KEY)
    try:
        proc.wait_ready()
        engines, workers = _children(proc)
        assert len(engines) == 1 and len(workers) == 2
        assert proc.stop() == 0
        _gone, alive = psutil.wait_procs([*engines, *workers], timeout=30)
        assert not alive, [p.pid for p in alive]
        assert not (tmp_path / "pg" / "postmaster.pid").exists()  # the embedded PostgreSQL stopped too
    finally:
        proc.stop()
        stop_postgres(tmp_path / "pg")
