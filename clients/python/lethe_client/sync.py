"""`LetheClient`: the blocking Python client (httpx)."""

from __future__ import annotations

import builtins
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import httpx

from lethe_client import _calls as calls
from lethe_client import _flows as flows
from lethe_client._calls import (
    BatchItem,
    BytesSink,
    Call,
    ForgetResult,
    HistoryEntry,
    KeyPage,
    MemoryRecord,
    RecordPage,
    WriteResult,
)
from lethe_client._consistency import HEADER, TokenKeeper
from lethe_client.errors import LetheAPIError, raise_for_problem

T = TypeVar("T")


class LetheClient:
    """Every method raises a typed `LetheAPIError` subclass for a non-2xx answer (see lethe_client/errors.py)."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 60.0, http: httpx.Client | None = None) -> None:
        self._http = http or httpx.Client(base_url=base_url, timeout=timeout)
        self._auth = {"Authorization": f"Bearer {api_key}"}
        self._tokens = TokenKeeper()

    @property
    def consistency(self) -> str | None:
        """The newest `Lethe-Consistency` token this client has seen; every read sends it, so whichever replica
        answers, the answer is never older than this client's own writes and forgets."""
        return self._tokens.token

    def observe_consistency(self, token: str | None) -> None:
        """Adopt a token seen elsewhere (another client's write that this one must read), if it is newer."""
        self._tokens.observe(token)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LetheClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _headers(self, call: Call[Any]) -> dict[str, str]:
        headers = {**self._auth, **call.headers}
        if call.method == "GET":
            headers.update(self._tokens.read_headers())
        return headers

    def _run(self, call: Call[T]) -> T:
        response = self._http.request(
            call.method, call.path, json=call.json, params=call.params, headers=self._headers(call)
        )
        self._tokens.observe(response.headers.get(HEADER))
        raise_for_problem(response)
        return call.parse(response)

    def _stream_to(self, call: Call[Any], sink: BytesSink) -> int:
        """Perform `call` but hand its body to `sink` as it arrives instead of parsing it; the bytes written."""
        written = 0
        with self._http.stream(
            call.method, call.path, json=call.json, params=call.params, headers=self._headers(call)
        ) as response:
            self._tokens.observe(response.headers.get(HEADER))
            if not response.is_success:
                response.read()  # the problem+json body, for the typed error
                raise_for_problem(response)
            for chunk in response.iter_bytes():
                sink.write(chunk)
                written += len(chunk)
        return written

    def _drive(self, flow: flows.Flow[T]) -> T:
        try:
            step = next(flow)
            while True:
                if isinstance(step, flows.Sleep):
                    time.sleep(step.seconds)
                    step = flow.send(None)
                    continue
                try:
                    result = self._run(step)
                except LetheAPIError as error:
                    step = flow.throw(error)
                else:
                    step = flow.send(result)
        except StopIteration as done:
            value: T = done.value
            return value

    # ---- memory ------------------------------------------------------------------------------------------------

    def get(self, namespace: str, key: str) -> MemoryRecord:
        """Raises Forgotten (with the tombstone `version`) or NotFound (`version` 0)."""
        return self._run(calls.get(namespace, key))

    def put(
        self,
        namespace: str,
        key: str,
        value: Any,
        *,
        if_match: int | None = None,
        if_none_match: bool = False,
        source: str = "user",
    ) -> WriteResult:
        """Conditional write: `if_match` is the version you read (the tombstone's to re-establish a forgotten key);
        `if_none_match=True` creates a key that was never written. A stale version raises PreconditionFailed."""
        return self._run(
            calls.put(namespace, key, value, source=source, if_match=if_match, if_none_match=if_none_match)
        )

    def forget(self, namespace: str, key: str, *, source: str = "user") -> ForgetResult:
        """Tombstone the key; returns once the tombstone is committed. Idempotent."""
        return self._run(calls.forget(namespace, key, source=source))

    def batch(
        self, namespace: str, writes: Sequence[Mapping[str, Any]], *, atomic: bool = True
    ) -> builtins.list[BatchItem]:
        """writes: [{"key", "value", "base_version", "source"?}]. Atomic: any conflict raises PreconditionFailed
        (its `conflicts` lists them) and nothing is written; otherwise each item says 200/201/412."""
        return self._run(calls.batch(namespace, writes, atomic=atomic))

    def list(self, namespace: str, *, limit: int = 100, cursor: str | None = None) -> KeyPage:
        return self._run(calls.list_keys(namespace, limit=limit, cursor=cursor))

    def list_records(self, namespace: str, *, limit: int = 100, cursor: str | None = None) -> RecordPage:
        """A page of the namespace's live records with their values, in key order: one request a page."""
        return self._run(calls.list_records(namespace, limit=limit, cursor=cursor))

    def history(self, namespace: str, key: str) -> builtins.list[HistoryEntry]:
        return self._run(calls.history(namespace, key))

    def safe_forget_then_write(
        self, namespace: str, key: str, value: Any, source: str = "user_correction"
    ) -> WriteResult:
        return self._drive(flows.safe_forget_then_write(namespace, key, value, source=source))

    def confirm_forget(
        self,
        namespace: str,
        key: str,
        *,
        attempts: int = 3,
        interval: float = 0.5,
        confirmations: int = 2,
        source: str = "user",
    ) -> int:
        return self._drive(
            flows.confirm_forget(
                namespace, key, attempts=attempts, interval=interval, confirmations=confirmations, source=source
            )
        )

    # ---- sessions and forget jobs ------------------------------------------------------------------------------

    def create_session(self, **fields: Any) -> dict[str, Any]:
        return self._run(calls.create_session(fields))

    def get_session(self, session_id: str) -> dict[str, Any]:
        return self._run(calls.get_session(session_id))

    def post_turn(
        self, session_id: str, inputs: Sequence[Mapping[str, Any]], *, generate: bool = True
    ) -> dict[str, Any]:
        return self._run(calls.post_turn(session_id, inputs, generate=generate))

    def list_artifacts(self, session_id: str) -> builtins.list[dict[str, Any]]:
        return self._run(calls.list_artifacts(session_id))

    def create_forget(
        self,
        target: Mapping[str, Any],
        *,
        strategy: str = "selective_replay",
        dry_run: bool = False,
        wait: bool = False,
        reason: str | None = None,
    ) -> dict[str, Any]:
        """POST /v1/forget (named apart from `forget`, which tombstones a memory key)."""
        return self._run(calls.create_forget(target, strategy=strategy, dry_run=dry_run, wait=wait, reason=reason))

    def run_forget_plan(self, plan_id: str, *, strategy: str | None = None, wait: bool = False) -> dict[str, Any]:
        """Run the plan a deletion request in plain words produced (the turn's `forget_plan`)."""
        return self._run(calls.run_forget_plan(plan_id, strategy=strategy, wait=wait))

    def get_forget(self, forget_id: str) -> dict[str, Any]:
        return self._run(calls.get_forget(forget_id))

    def wait_forget(self, forget_id: str, *, timeout_s: float = 600.0, interval: float = 0.5) -> dict[str, Any]:
        return self._drive(flows.wait_forget(forget_id, timeout_s=timeout_s, interval=interval))

    # ---- data subjects and legal holds -------------------------------------------------------------------------

    def put_subject(self, subject_id: str, memory_namespaces: Sequence[str]) -> dict[str, Any]:
        """Link exactly these memory namespaces to the subject (made if new); the subject."""
        return self._run(calls.put_subject(subject_id, memory_namespaces))

    def get_subject(self, subject_id: str) -> dict[str, Any]:
        return self._run(calls.get_subject(subject_id))

    def export_subject(self, subject_id: str) -> dict[str, Any]:
        """The access request's export, parsed (held whole in memory: `export_subject_to` for a large subject)."""
        return self._run(calls.export_subject(subject_id))

    def export_subject_to(self, subject_id: str, sink: BytesSink) -> int:
        """Write the export's JSON bytes to `sink` (a file opened "wb") as the server streams them; the bytes written.
        A NotFound is raised before anything is written."""
        return self._stream_to(calls.export_subject(subject_id), sink)

    def subject_erase_plan(
        self, subject_id: str, *, also_text: Sequence[str] | None = None, also_query: str | None = None,
        also_min_similarity: float | None = None,
    ) -> dict[str, Any]:
        """What erasing the subject would erase now (a dry run): nothing changes. `also_text` and `also_query` (a
        semantic predicate; `also_min_similarity`, default 0.5 on the server) reach other subjects' sessions."""
        return self._run(calls.erase_subject(
            subject_id, dry_run=True, also_text=also_text, reason=None, also_query=also_query,
            also_min_similarity=also_min_similarity,
        ))

    def subject_erase_confirm(
        self, subject_id: str, *, also_text: Sequence[str] | None = None, also_query: str | None = None,
        also_min_similarity: float | None = None, reason: str | None = None, timeout_s: float = 600.0,
    ) -> dict[str, Any]:
        """Erase everything the subject owns; the ended forget job with its `subject` receipt (`also`: the forget
        queued in each other session `also_text` or `also_query` reached), waited for past the server's own wait
        (a large subject) up to `timeout_s`. Raises LegalHold (`hold_id`) when a hold covers the subject; a hold
        placed after the erasure was queued answers the job `held`, with its `hold_id`."""
        job = self._run(calls.erase_subject(
            subject_id, dry_run=False, also_text=also_text, reason=reason, also_query=also_query,
            also_min_similarity=also_min_similarity,
        ))
        if job.get("status") in calls.TERMINAL_FORGET_STATUSES:
            return job
        return self.wait_forget(job["id"], timeout_s=timeout_s)

    def place_hold(
        self,
        *,
        subject_id: str | None = None,
        session_id: str | None = None,
        namespace: str | None = None,
        reason: str,
    ) -> dict[str, Any]:
        """Hold exactly one of a subject, a session or a namespace: erasures of what it covers raise LegalHold."""
        return self._run(
            calls.place_hold(subject_id=subject_id, session_id=session_id, namespace=namespace, reason=reason)
        )

    def get_hold(self, hold_id: str) -> dict[str, Any]:
        return self._run(calls.get_hold(hold_id))

    def release_hold(self, hold_id: str) -> dict[str, Any]:
        """Release the hold; its `erasures` are the forget jobs of the erasures it had deferred, run now."""
        return self._run(calls.release_hold(hold_id))
