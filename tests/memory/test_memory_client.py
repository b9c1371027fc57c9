"""The Python client (`lethe_client`, clients/python) against the running service: every method, its typed errors."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from lethe_client import (
    AsyncLetheClient,
    Conflict,
    ForgetNotDurable,
    Forgotten,
    LetheAPIError,
    LetheClient,
    NotFound,
    PayloadTooLarge,
    PreconditionFailed,
    PreconditionRequired,
    RateLimited,
    ServerError,
    SessionBusy,
    Unauthorized,
    ValidationError,
)
from lethe_client.errors import error_for

from tests.memory.memory_helpers import create, write


def test_get_put_forget_history(lethe: LetheClient, ns: str) -> None:
    created = lethe.put(ns, "diet", {"kind": "vegan"}, if_none_match=True, source="agent")
    assert created.version == 1 and created.created is True
    rec = lethe.get(ns, "diet")
    assert rec.value == {"kind": "vegan"} and rec.version == 1 and rec.source == "agent" and rec.updated_at
    updated = lethe.put(ns, "diet", "vegetarian", if_match=rec.version)
    assert updated.version == 2 and updated.created is False

    with pytest.raises(PreconditionFailed) as stale:
        lethe.put(ns, "diet", "stale", if_match=1)
    assert stale.value.current_version == 2 and stale.value.forgotten is False and stale.value.status == 412

    forgot = lethe.forget(ns, "diet")
    assert (forgot.version, forgot.already_forgotten) == (3, False)
    assert forgot.forget_id is not None and forgot.forget_id.startswith("fgt_")
    assert lethe.forget(ns, "diet").already_forgotten is True
    with pytest.raises(Forgotten) as gone:
        lethe.get(ns, "diet")
    assert gone.value.version == 3 and isinstance(gone.value, NotFound)
    with pytest.raises(PreconditionFailed) as stale:
        lethe.put(ns, "diet", "stale", if_match=2)
    assert stale.value.forgotten is True and stale.value.current_version == 3
    with pytest.raises(NotFound) as never:
        lethe.get(ns, "never")
    assert not isinstance(never.value, Forgotten) and never.value.version == 0

    history = lethe.history(ns, "diet")
    assert [(h.version, h.op, h.value, h.erased) for h in history] == [
        (1, "write", None, True),
        (2, "write", None, True),
        (3, "forget", None, False),
    ]
    with pytest.raises(ValueError):
        lethe.put(ns, "diet", 1)  # neither precondition: refused before any request


def test_odd_keys_are_path_encoded(lethe: LetheClient, ns: str) -> None:
    key = "user:42 prefs?#%é"
    lethe.put(ns, key, 1, if_none_match=True)
    assert lethe.get(ns, key).key == key
    assert lethe.list(ns).keys == [key]


def test_batch_and_list(lethe: LetheClient, ns: str) -> None:
    items = lethe.batch(ns, [{"key": f"k{i}", "value": i, "base_version": 0} for i in range(5)])
    assert [(i.key, i.status, i.version) for i in items] == [(f"k{i}", 201, 1) for i in range(5)]
    with pytest.raises(PreconditionFailed) as rejected:
        lethe.batch(ns, [{"key": "k0", "value": 9, "base_version": 1}, {"key": "k1", "value": 9, "base_version": 0}])
    assert [c["key"] for c in rejected.value.conflicts] == ["k1"]
    assert lethe.get(ns, "k0").version == 1  # nothing written
    mixed = lethe.batch(
        ns, [{"key": "k0", "value": 9, "base_version": 1}, {"key": "k1", "value": 9, "base_version": 0}], atomic=False
    )
    assert [(i.status, i.current_version) for i in mixed] == [(200, 2), (412, 1)]

    lethe.forget(ns, "k2")
    first = lethe.list(ns, limit=2)
    assert first.keys == ["k0", "k1"] and first.next_cursor
    rest = lethe.list(ns, limit=2, cursor=first.next_cursor)
    assert rest.keys == ["k3", "k4"] and rest.next_cursor is None


def test_safe_forget_then_write(lethe: LetheClient, ns: str) -> None:
    lethe.put(ns, "allergy.peanut", True, if_none_match=True, source="user")
    corrected = lethe.safe_forget_then_write(ns, "allergy.peanut", False)
    assert corrected.version == 3
    rec = lethe.get(ns, "allergy.peanut")
    assert rec.value is False and rec.source == "user_correction"
    assert [(h.op, h.value) for h in lethe.history(ns, "allergy.peanut")] == [
        ("write", None),
        ("forget", None),
        ("write", False),
    ]
    with pytest.raises(PreconditionFailed):  # the summarizer's pre-forget version stays stale
        lethe.put(ns, "allergy.peanut", True, if_match=1, source="summarizer")
    # works on a key that never existed too: its tombstone is version 1
    assert lethe.safe_forget_then_write(ns, "fresh", "x").version == 2


def test_confirm_forget(lethe: LetheClient, ns: str) -> None:
    lethe.put(ns, "k", 1, if_none_match=True)
    tombstone = lethe.forget(ns, "k").version
    assert lethe.confirm_forget(ns, "k", interval=0.01) == tombstone
    # a resurrected key (here: re-established after the forget) is forgotten again, then confirmed
    lethe.put(ns, "k", "back", if_match=tombstone)
    assert lethe.confirm_forget(ns, "k", interval=0.01) == tombstone + 2
    with pytest.raises(Forgotten):
        lethe.get(ns, "k")
    assert lethe.confirm_forget(ns, "never", interval=0.01) == 0
    lethe.put(ns, "live", 1, if_none_match=True)
    with pytest.raises(ForgetNotDurable):
        lethe.confirm_forget(ns, "live", attempts=0, interval=0.01)


def test_error_mapping_from_real_answers(client: httpx.Client, anon: httpx.Client, ns: str) -> None:
    create(client, ns, "k", 1)
    cases: list[tuple[httpx.Response, type[LetheAPIError]]] = [
        (anon.get(f"/v1/memory/{ns}/k"), Unauthorized),
        (client.put(f"/v1/memory/{ns}/k", json={"value": 2}), PreconditionRequired),
        (write(client, ns, "k", 2, base=7), PreconditionFailed),
        (client.put(f"/v1/memory/{ns}/k", json={"nope": 1}, headers={"If-Match": '"1"'}), ValidationError),
        (
            client.put(f"/v1/memory/{ns}/k", json={"value": "x" * 1_100_000}, headers={"If-Match": '"1"'}),
            PayloadTooLarge,
        ),
        (client.get(f"/v1/memory/{ns}/none"), NotFound),
    ]
    client.delete(f"/v1/memory/{ns}/k")
    cases.append((client.get(f"/v1/memory/{ns}/k"), Forgotten))
    for response, expected in cases:
        error = error_for(response)
        assert type(error) is expected, (response.status_code, response.text, type(error))
        assert error.status == response.status_code and error.problem_type.startswith("https://")


def test_error_mapping_of_statuses_the_memory_api_does_not_answer() -> None:
    def answer(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> LetheAPIError:
        return error_for(httpx.Response(status, json=body, headers=headers))

    busy = answer(409, {"type": "https://lethe.dev/problems/session_busy"}, {"Retry-After": "2"})
    assert isinstance(busy, SessionBusy) and isinstance(busy, Conflict) and busy.retry_after == 2.0
    assert type(answer(409, {"type": "https://lethe.dev/problems/conflict"})) is Conflict
    limited = answer(429, {}, {"Retry-After": "5"})
    assert isinstance(limited, RateLimited) and limited.retry_after == 5.0
    assert isinstance(answer(503, {}), ServerError)
    assert isinstance(error_for(httpx.Response(502, text="bad gateway")), ServerError)


def test_session_and_forget_job_methods_reach_their_paths(lethe: LetheClient) -> None:
    """Each session and forget-job method reaches its route: a session is created and read back, and an unknown id
    answers the route's own 404, raised as NotFound."""
    created = lethe.create_session(system_prompt="hi", sampling={"max_tokens": 2})
    assert created["id"].startswith("ses_") and lethe.get_session(created["id"])["id"] == created["id"]
    assert [a["kind"] for a in lethe.list_artifacts(created["id"])] == ["system"]
    unknown = [
        lambda: lethe.get_session("ses_unknown"),
        lambda: lethe.post_turn("ses_unknown", [{"type": "user", "content": "hi"}]),
        lambda: lethe.list_artifacts("ses_unknown"),
        lambda: lethe.create_forget({"artifact_id": "art_unknown"}, dry_run=True),
        lambda: lethe.get_forget("fgt_unknown"),
        lambda: lethe.wait_forget("fgt_unknown", timeout_s=1, interval=0.01),
    ]
    for call in unknown:
        with pytest.raises(NotFound) as raised:
            call()
        assert raised.value.status == 404


async def test_async_client(live_server: Any, api_key: str, ns: str) -> None:
    async with AsyncLetheClient(live_server.base_url, api_key) as lethe:
        assert (await lethe.put(ns, "k", "v1", if_none_match=True)).version == 1
        assert (await lethe.get(ns, "k")).value == "v1"
        assert (await lethe.put(ns, "k", "v2", if_match=1)).version == 2
        with pytest.raises(PreconditionFailed):
            await lethe.put(ns, "k", "stale", if_match=1)
        assert (await lethe.forget(ns, "k")).version == 3
        with pytest.raises(Forgotten):
            await lethe.get(ns, "k")
        assert await lethe.confirm_forget(ns, "k", interval=0.01) == 3
        corrected = await lethe.safe_forget_then_write(ns, "k", "v4")
        assert corrected.version == 4  # already forgotten: the same tombstone (3) re-establishes it
        items = await lethe.batch(ns, [{"key": "k", "value": "v5", "base_version": 4}], atomic=False)
        assert items[0].status == 200
        assert (await lethe.list(ns)).keys == ["k"]
        assert [h.value for h in await lethe.history(ns, "k")] == [None, None, None, "v4", "v5"]
        with pytest.raises(NotFound):
            await lethe.get_forget("fgt_unknown")
