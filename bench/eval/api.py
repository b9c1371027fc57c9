"""The harness's only way into Lethe: the HTTP contract of ../shared/API.md, through `lethe_client.LetheClient` (typed
problem+json errors) plus the few calls that client does not wrap (compaction). Nothing here imports the service, so
the harness runs unchanged against any engine (`hf`, `vllm`, `vllm-remote`) and any deployment."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from lethe_client import LetheClient, RateLimited, SessionBusy
from lethe_client.errors import raise_for_problem

Json = dict[str, Any]


class JobFailed(RuntimeError):
    """A forget job ended `failed` or `needs_input`: the server's answer, recorded in the report, not retried."""


@dataclass(frozen=True)
class Turn:
    turn: int
    input_ids: list[str]
    reply: str
    tool_calls: list[Json]
    usage: Json


class Lethe:
    """One tenant's view of one Lethe deployment. Retries only what the contract says is transient (409
    `session_busy` and 429, both with Retry-After); every other error propagates as a typed `LetheAPIError`."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float = 900.0) -> None:
        self.base_url = base_url
        self.http = httpx.Client(base_url=base_url, timeout=timeout_s)
        self.client = LetheClient(base_url, api_key, http=self.http)
        self.auth = {"Authorization": f"Bearer {api_key}"}

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Lethe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _retrying(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        for attempt in range(20):
            try:
                return call(*args, **kwargs)
            except (SessionBusy, RateLimited) as exc:
                if attempt == 19:
                    raise
                time.sleep(min(5.0, exc.retry_after or 0.5))  # the server said when to come back
        raise AssertionError("unreachable")

    # ---- sessions ----------------------------------------------------------------------------------------------

    def create_session(self, **fields: Any) -> str:
        body: Json = self._retrying(self.client.create_session, **fields)
        return str(body["id"])

    def turn(self, session_id: str, inputs: Sequence[Mapping[str, Any]], *, generate: bool = True) -> Turn:
        body: Json = self._retrying(self.client.post_turn, session_id, inputs, generate=generate)
        reply = body.get("reply") or {}
        return Turn(
            turn=int(body["turn"]),
            input_ids=[i["artifact_id"] for i in body["inputs"]],
            reply=str(reply.get("content", "")),
            tool_calls=list(reply.get("tool_calls", [])),
            usage=dict(body.get("usage", {})),
        )

    def compact(self, session_id: str, *, keep_last_turns: int = 1, write_back: bool = False) -> Json:
        def call() -> Json:
            r = self.http.post(
                f"/v1/sessions/{session_id}/compact", headers=self.auth,
                json={"keep_last_turns": keep_last_turns, "write_back": write_back},
            )
            raise_for_problem(r)
            out: Json = r.json()
            return out

        result: Json = self._retrying(call)
        return result

    def session(self, session_id: str) -> Json:
        body: Json = self.client.get_session(session_id)
        return body

    def artifacts(self, session_id: str) -> list[Json]:
        items: list[Json] = self.client.list_artifacts(session_id)
        return items

    # ---- memory ------------------------------------------------------------------------------------------------

    def remember(self, namespace: str, key: str, value: str) -> None:
        self.client.put(namespace, key, value, if_none_match=True, source="user")

    def memory_values(self, namespace: str) -> dict[str, str]:
        """Every live record of the namespace, as text (write-backs included)."""
        out: dict[str, str] = {}
        cursor: str | None = None
        while True:
            page = self.client.list(namespace, limit=100, cursor=cursor)
            for key in page.keys:
                out[key] = str(self.client.get(namespace, key).value)
            if not page.next_cursor:
                return out
            cursor = page.next_cursor

    # ---- forget ------------------------------------------------------------------------------------------------

    def forget(self, target: Mapping[str, Any], strategy: str, *, timeout_s: float = 1800.0) -> tuple[Json, float]:
        """Run a forget job to its end; returns the job (with its receipt) and the client-side wall seconds."""
        start = time.perf_counter()
        job: Json = self._retrying(self.client.create_forget, target, strategy=strategy, wait=True)
        if job["status"] not in ("succeeded", "failed", "needs_input"):
            job = self.client.wait_forget(job["id"], timeout_s=timeout_s, interval=0.1)
        seconds = time.perf_counter() - start
        if job["status"] != "succeeded":
            raise JobFailed(f"forget {job['id']} ({strategy}) {job['status']}: {job.get('error')}")
        return job, seconds
