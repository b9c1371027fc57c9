"""The memory contract of ../shared/API.md through real HTTP: preconditions, ETags, tombstones, batches, listing."""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx
import pytest

from tests.memory.memory_helpers import create, write
from tests.support import problem


def test_put_without_precondition_is_428(client: httpx.Client, ns: str) -> None:
    body = problem(client.put(f"/v1/memory/{ns}/k", json={"value": 1}), 428)
    assert "If-Match" in body["detail"]
    # If-Match: * proves nothing about what the writer saw, so it is not a precondition here either.
    problem(client.put(f"/v1/memory/{ns}/k", json={"value": 1}, headers={"If-Match": "*"}), 428)
    problem(client.get(f"/v1/memory/{ns}/k"), 404)  # nothing landed


def test_create_read_and_etag(client: httpx.Client, ns: str) -> None:
    r = client.put(
        f"/v1/memory/{ns}/diet", json={"value": {"kind": "vegan"}, "source": "agent"}, headers={"If-None-Match": "*"}
    )
    assert r.status_code == 201
    assert r.headers["etag"] == '"1"'
    assert r.json()["version"] == 1 and r.json()["created"] is True
    r = client.get(f"/v1/memory/{ns}/diet")
    assert r.status_code == 200
    assert r.headers["etag"] == '"1"'
    body = r.json()
    assert body["namespace"] == ns and body["key"] == "diet"
    assert body["value"] == {"kind": "vegan"} and body["version"] == 1 and body["source"] == "agent"
    assert body["updated_at"]


@pytest.mark.parametrize("if_match", ['"1"', "1", 'W/"1"'])
def test_if_match_forms(client: httpx.Client, ns: str, if_match: str) -> None:
    create(client, ns, "k", "a")
    r = client.put(f"/v1/memory/{ns}/k", json={"value": "b"}, headers={"If-Match": if_match})
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 2 and r.json()["created"] is False and r.headers["etag"] == '"2"'


def test_stale_write_is_412_with_current_version(client: httpx.Client, ns: str) -> None:
    create(client, ns, "k", "a")
    assert write(client, ns, "k", "b", base=1).status_code == 200
    body = problem(write(client, ns, "k", "c", base=1), 412)
    assert body["current_version"] == 2 and body["forgotten"] is False
    assert client.get(f"/v1/memory/{ns}/k").json()["value"] == "b"
    # create-if-absent on a key that exists is stale too
    body = problem(client.put(f"/v1/memory/{ns}/k", json={"value": "x"}, headers={"If-None-Match": "*"}), 412)
    assert body["current_version"] == 2
    # a version from the future is as wrong as one from the past
    assert problem(write(client, ns, "k", "d", base=9), 412)["current_version"] == 2


def test_never_written_is_404_version_0(client: httpx.Client, ns: str) -> None:
    r = client.get(f"/v1/memory/{ns}/nothing")
    body = problem(r, 404)
    assert body["version"] == 0 and body["forgotten"] is False
    assert r.headers["etag"] == '"0"'
    # the "0" it hands out creates the key, exactly like If-None-Match: *
    r = write(client, ns, "nothing", "now", base=0)
    assert r.status_code == 201 and r.json()["version"] == 1
    # a write based on a version the key never had is stale, and creates nothing
    body = problem(write(client, ns, "other", "x", base=3), 412)
    assert body["current_version"] == 0 and body["forgotten"] is False
    problem(client.get(f"/v1/memory/{ns}/other"), 404)


def test_forget_is_a_versioned_idempotent_tombstone(client: httpx.Client, ns: str) -> None:
    path = f"/v1/memory/{ns}/allergy.peanut"
    create(client, ns, "allergy.peanut", True)
    r = client.delete(path)
    assert r.status_code == 200
    first = r.json()
    # The cascade into sessions runs as a forget job (none of them saw this key, so it has nothing to replay).
    assert first["forget_id"].startswith("fgt_")
    assert first == {"version": 2, "forget_id": first["forget_id"], "already_forgotten": False}
    assert r.headers["etag"] == '"2"'
    job = client.get(f"/v1/forget/{first['forget_id']}").json()
    assert job["memory"] == {"namespace": ns, "key": "allergy.peanut", "tombstone_version": 2}

    r = client.get(path)
    body = problem(r, 404)
    assert body["forgotten"] is True and body["version"] == 2 and r.headers["etag"] == '"2"'

    again = client.delete(path)
    assert again.status_code == 200 and again.json() == {"version": 2, "forget_id": None, "already_forgotten": True}

    body = problem(write(client, ns, "allergy.peanut", True, base=1, source="summarizer"), 412)
    assert body["forgotten"] is True and body["current_version"] == 2
    body = problem(client.put(path, json={"value": True}, headers={"If-None-Match": "*"}), 412)
    assert body["forgotten"] is True

    # re-establishing needs the tombstone version: the writer proves it saw the forget
    r = write(client, ns, "allergy.peanut", False, base=2, source="user_correction")
    assert r.status_code == 200 and r.json()["version"] == 3
    body = client.get(path).json()
    assert body["value"] is False and body["source"] == "user_correction" and body["version"] == 3


def test_forgetting_a_never_written_key_writes_tombstone_1(client: httpx.Client, ns: str) -> None:
    r = client.delete(f"/v1/memory/{ns}/ghost")
    assert r.status_code == 200
    assert r.json() == {"version": 1, "forget_id": r.json()["forget_id"], "already_forgotten": False}
    # a stale "create if absent" issued before the forget can no longer land after it
    problem(client.put(f"/v1/memory/{ns}/ghost", json={"value": 1}, headers={"If-None-Match": "*"}), 412)
    body = problem(client.get(f"/v1/memory/{ns}/ghost"), 404)
    assert body["forgotten"] is True and body["version"] == 1
    assert write(client, ns, "ghost", "back", base=1).json()["version"] == 2


def test_versions_only_grow(client: httpx.Client, ns: str) -> None:
    seen = [create(client, ns, "k", 0)]
    for i in range(3):
        seen.append(write(client, ns, "k", i, base=seen[-1]).json()["version"])
        seen.append(client.delete(f"/v1/memory/{ns}/k").json()["version"])
    assert seen == list(range(1, 8))


def test_history_shows_values_only_after_the_last_tombstone(client: httpx.Client, ns: str) -> None:
    create(client, ns, "k", "one")
    write(client, ns, "k", "two", base=1, source="agent")
    client.delete(f"/v1/memory/{ns}/k", params={"source": "user"})
    write(client, ns, "k", "three", base=3, source="user_correction")
    write(client, ns, "k", "four", base=4)
    r = client.get(f"/v1/memory/{ns}/k/history")
    assert r.status_code == 200
    versions = r.json()["versions"]
    assert [(v["version"], v["op"], v["value"], v["erased"]) for v in versions] == [
        (1, "write", None, True),
        (2, "write", None, True),
        (3, "forget", None, False),
        (4, "write", "three", False),
        (5, "write", "four", False),
    ]
    assert [v["source"] for v in versions] == ["user", "agent", "user", "user_correction", "user"]
    assert all(v["at"] for v in versions)
    problem(client.get(f"/v1/memory/{ns}/never/history"), 404)


def test_atomic_batch_rejects_whole_and_lists_every_conflict(client: httpx.Client, ns: str) -> None:
    create(client, ns, "a", "a1")
    create(client, ns, "b", "b1")
    write(client, ns, "b", "b2", base=1)
    client.delete(f"/v1/memory/{ns}/c")  # tombstone 1
    writes = [
        {"key": "new", "value": 1, "base_version": 0},
        {"key": "a", "value": "a2", "base_version": 1},
        {"key": "b", "value": "stale", "base_version": 1, "source": "summarizer"},
        {"key": "c", "value": "stale", "base_version": 0},
    ]
    body = problem(client.post(f"/v1/memory/{ns}:batch", json={"atomic": True, "writes": writes}), 412)
    assert body["conflicting_keys"] == ["b", "c"]
    by_key = {c["key"]: c for c in body["conflicts"]}
    assert by_key["b"]["current_version"] == 2 and by_key["b"]["forgotten"] is False
    assert by_key["c"]["current_version"] == 1 and by_key["c"]["forgotten"] is True
    # nothing was written
    problem(client.get(f"/v1/memory/{ns}/new"), 404)
    assert client.get(f"/v1/memory/{ns}/a").json()["version"] == 1

    ok = [
        {"key": "z", "value": 1, "base_version": 0},
        {"key": "a", "value": "a2", "base_version": 1, "source": "summarizer"},
        {"key": "a", "value": "a3", "base_version": 2},  # the same key twice, in request order
        {"key": "b", "value": "b3", "base_version": 2},
    ]
    r = client.post(f"/v1/memory/{ns}:batch", json={"atomic": True, "writes": ok})
    assert r.status_code == 200, r.text
    assert [(x["key"], x["status"], x["version"]) for x in r.json()["results"]] == [
        ("z", 201, 1),
        ("a", 200, 2),
        ("a", 200, 3),
        ("b", 200, 3),
    ]
    assert client.get(f"/v1/memory/{ns}/a").json()["value"] == "a3"
    assert client.get(f"/v1/memory/{ns}/a/history").json()["versions"][1]["source"] == "summarizer"


def test_non_atomic_batch_applies_each_write_independently(client: httpx.Client, ns: str) -> None:
    create(client, ns, "a", 1)
    client.delete(f"/v1/memory/{ns}/gone")
    writes = [
        {"key": "a", "value": 2, "base_version": 1},
        {"key": "a", "value": "stale", "base_version": 1},
        {"key": "fresh", "value": 1, "base_version": 0},
        {"key": "gone", "value": "stale", "base_version": 0},
        {"key": "gone", "value": "back", "base_version": 1, "source": "user_correction"},
    ]
    r = client.post(f"/v1/memory/{ns}:batch", json={"atomic": False, "writes": writes})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [(x["key"], x["status"], x["version"], x["current_version"], x["forgotten"]) for x in results] == [
        ("a", 200, 2, 2, False),
        ("a", 412, None, 2, False),
        ("fresh", 201, 1, 1, False),
        ("gone", 412, None, 1, True),
        ("gone", 200, 2, 2, False),
    ]
    assert client.get(f"/v1/memory/{ns}/gone").json()["value"] == "back"


def test_list_is_live_keys_keyset_paginated(client: httpx.Client, ns: str) -> None:
    keys = [f"k{i:02d}" for i in range(25)]
    writes = [{"key": k, "value": i, "base_version": 0} for i, k in enumerate(keys)]
    assert client.post(f"/v1/memory/{ns}:batch", json={"writes": writes}).status_code == 200
    for k in keys[::5]:
        client.delete(f"/v1/memory/{ns}/{k}")
    live = [k for i, k in enumerate(keys) if i % 5]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, str | int] = {"limit": 7}
        if cursor:
            params["cursor"] = cursor
        page = client.get(f"/v1/memory/{ns}", params=params).json()
        assert len(page["keys"]) <= 7
        seen += page["keys"]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == live and pages == 3
    assert client.get(f"/v1/memory/{ns}").json() == {"keys": live, "next_cursor": None}
    assert client.get(f"/v1/memory/{ns}-empty").json() == {"keys": [], "next_cursor": None}
    problem(client.get(f"/v1/memory/{ns}", params={"limit": 0}), 422)
    problem(client.get(f"/v1/memory/{ns}", params={"limit": 1001}), 422)
    assert len(client.get(f"/v1/memory/{ns}", params={"limit": 1000}).json()["keys"]) == len(live)
    problem(client.get(f"/v1/memory/{ns}", params={"cursor": "not a cursor!"}), 422)


def test_list_with_values_answers_each_live_record_once_a_page(
    client: httpx.Client, ns: str, other_tenant: httpx.Client
) -> None:
    """`?values=true`: the page's live records with their values and versions, in key order, paged like the keys;
    tombstones and expired records left out; another tenant's namespace of the same name lists nothing."""
    keys = [f"k{i:02d}" for i in range(12)]
    writes = [{"key": k, "value": {"n": i}, "base_version": 0} for i, k in enumerate(keys)]
    assert client.post(f"/v1/memory/{ns}:batch", json={"writes": writes}).status_code == 200
    assert write(client, ns, "k01", {"n": "again"}, base=1).status_code == 200
    client.delete(f"/v1/memory/{ns}/k02")
    expiring = {"key": "k03", "value": "soon", "base_version": 1, "ttl_s": 0.001}
    assert client.post(f"/v1/memory/{ns}:batch", json={"writes": [expiring]}).json()["results"][0]["status"] == 200
    live = [k for k in keys if k not in ("k02", "k03")]
    records: list[dict[str, object]] = []
    cursor, pages = None, 0
    while True:
        params: dict[str, str | int] = {"values": "true", "limit": 4, **({"cursor": cursor} if cursor else {})}
        page = client.get(f"/v1/memory/{ns}", params=params).json()
        assert page["keys"] == [r["key"] for r in page["records"]]
        records += page["records"]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [r["key"] for r in records] == live and pages == 3
    by_key = {r["key"]: r for r in records}
    assert by_key["k01"]["value"] == {"n": "again"} and by_key["k01"]["version"] == 2
    assert by_key["k00"]["value"] == {"n": 0} and by_key["k00"]["version"] == 1
    read = client.get(f"/v1/memory/{ns}/k05").json()
    assert by_key["k05"] == read  # as a read answers it
    assert set(client.get(f"/v1/memory/{ns}", params={"limit": 1}).json()) == {"keys", "next_cursor"}  # the shape
    assert other_tenant.get(f"/v1/memory/{ns}", params={"values": "true"}).json() == {
        "keys": [], "next_cursor": None, "records": []}
    # At most 100 records a page whatever `limit` asks: a page still walks every key, just in more requests.
    many = client.get(f"/v1/memory/{ns}", params={"values": "true", "limit": 1000}).json()
    assert [r["key"] for r in many["records"]] == live and many["next_cursor"] is None
    # With include_forgotten: the catalog's page (tombstones named in `forgotten`), the live ones with their values.
    both = client.get(f"/v1/memory/{ns}", params={"values": "true", "include_forgotten": "true"}).json()
    assert "k02" in both["keys"] and both["forgotten"] == ["k02"] and "k03" in both["keys"], both
    assert [r["key"] for r in both["records"]] == live and both["records"] == records
    problem(client.get(f"/v1/memory/{ns}", params={"values": "maybe"}), 422)


def test_keys_may_hold_any_printable_text(client: httpx.Client, ns: str) -> None:
    odd = "user:42 prefs?#%é"
    quoted = f"/v1/memory/{ns}/{quote(odd, safe='')}"
    r = client.put(quoted, json={"value": 1}, headers={"If-None-Match": "*"})
    assert r.status_code == 201, r.text
    assert client.get(quoted).json()["key"] == odd
    assert client.get(f"/v1/memory/{ns}").json()["keys"] == [odd]


BAD_REQUESTS: list[tuple[str, str, dict[str, object]]] = [
    ("PUT", "/v1/memory/a:b/k", {"json": {"value": 1}, "headers": {"If-None-Match": "*"}}),
    ("GET", "/v1/memory/a:b", {}),
    ("POST", "/v1/memory/a:b:batch", {"json": {"writes": [{"key": "k", "value": 1, "base_version": 0}]}}),
    ("PUT", "/v1/memory/ns/" + "k" * 201, {"json": {"value": 1}, "headers": {"If-None-Match": "*"}}),
    ("GET", "/v1/memory/" + "n" * 201 + "/k", {}),
    ("PUT", "/v1/memory/ns/bad%0Akey", {"json": {"value": 1}, "headers": {"If-None-Match": "*"}}),
    ("PUT", "/v1/memory/ns/bad%00key", {"json": {"value": 1}, "headers": {"If-None-Match": "*"}}),
    ("DELETE", "/v1/memory/ns/k%7F", {}),
    ("PUT", "/v1/memory/ns/k", {"json": {"value": 1, "source": ""}, "headers": {"If-None-Match": "*"}}),
    ("PUT", "/v1/memory/ns/k", {"json": {"value": 1, "source": "x" * 101}, "headers": {"If-None-Match": "*"}}),
    ("PUT", "/v1/memory/ns/k", {"json": {"value": 1, "source": "a\u0000"}, "headers": {"If-None-Match": "*"}}),
    ("PUT", "/v1/memory/ns/k", {"json": {"source": "user"}, "headers": {"If-None-Match": "*"}}),
    ("PUT", "/v1/memory/ns/k", {"json": {"value": 1, "extra": 2}, "headers": {"If-None-Match": "*"}}),
    ("PUT", "/v1/memory/ns/k", {"json": {"value": "nul\u0000"}, "headers": {"If-None-Match": "*"}}),
    ("PUT", "/v1/memory/ns/k", {"json": {"value": {"a\u0000": 1}}, "headers": {"If-None-Match": "*"}}),
    ("PUT", "/v1/memory/ns/k", {"content": b'{"value": NaN}', "headers": {"If-None-Match": "*"}}),
    ("PUT", "/v1/memory/ns/k", {"content": b'{"value": [1, Infinity]}', "headers": {"If-None-Match": "*"}}),
    ("PUT", "/v1/memory/ns/k", {"content": b'{"value": "\\ud800"}', "headers": {"If-None-Match": "*"}}),
    ("PUT", "/v1/memory/ns/k", {"content": b'{"value": ', "headers": {"If-None-Match": "*"}}),
    ("PUT", "/v1/memory/ns/k", {"json": {"value": 1}, "headers": {"If-Match": "abc"}}),
    ("PUT", "/v1/memory/ns/k", {"json": {"value": 1}, "headers": {"If-Match": '"1", "2"'}}),
    ("PUT", "/v1/memory/ns/k", {"json": {"value": 1}, "headers": {"If-Match": '"-1"'}}),
    ("PUT", "/v1/memory/ns/k", {"json": {"value": 1}, "headers": {"If-Match": '"1"', "If-None-Match": "*"}}),
    ("PUT", "/v1/memory/ns/k", {"json": {"value": 1}, "headers": {"If-None-Match": '"3"'}}),
    ("POST", "/v1/memory/ns:batch", {"json": {"writes": []}}),
    ("POST", "/v1/memory/ns:batch", {"json": {"writes": [{"key": "k", "value": 1, "base_version": -1}]}}),
    ("POST", "/v1/memory/ns:batch", {"json": {"writes": [{"key": "a/b", "value": 1, "base_version": 0}]}}),
    ("POST", "/v1/memory/ns:batch", {"json": {"writes": [{"key": "k", "value": "\u0000", "base_version": 0}]}}),
    ("POST", "/v1/memory/ns:batch", {"content": b'{"writes": [{"key": "\\udc00", "value": 1, "base_version": 0}]}'}),
    ("POST", "/v1/memory/ns:batch", {"json": {"writes": [{"key": "k", "base_version": 0}]}}),
    ("POST", "/v1/memory/ns:batch", {"json": {"writes": [{"key": "k", "value": 1}]}}),
    ("DELETE", "/v1/memory/ns/k", {"params": {"source": ""}}),
]


@pytest.mark.parametrize(("method", "path", "kwargs"), BAD_REQUESTS)
def test_bad_input_is_422_never_5xx(client: httpx.Client, method: str, path: str, kwargs: dict[str, object]) -> None:
    kwargs = dict(kwargs)
    headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}  # type: ignore[dict-item]
    r = client.request(method, path, headers=headers, **kwargs)  # type: ignore[arg-type]
    assert r.status_code in (400, 422), (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/problem+json")
    body = {k: v for k, v in r.json().items() if k != "instance"}  # `instance` is the request path, by design
    assert "\\u0000" not in json.dumps(body) and "Traceback" not in r.text  # never echo the offending input


def test_oversized_value_is_413(client: httpx.Client, ns: str) -> None:
    big = "x" * 1_100_000
    problem(client.put(f"/v1/memory/{ns}/k", json={"value": big}, headers={"If-None-Match": "*"}), 413)
    problem(client.get(f"/v1/memory/{ns}/k"), 404)


def test_nesting_is_bounded_so_every_stored_value_can_be_read_back(client: httpx.Client, ns: str) -> None:
    deepest = 64
    value: object = "leaf"
    for i in range(deepest):
        value = [value] if i % 2 else {"k": value}
    create(client, ns, "deep", value)
    assert client.get(f"/v1/memory/{ns}/deep").json()["value"] == value
    assert client.get(f"/v1/memory/{ns}/deep/history").json()["versions"][0]["value"] == value
    problem(client.put(f"/v1/memory/{ns}/deeper", json={"value": [value]}, headers={"If-None-Match": "*"}), 422)
    too_deep = b'{"value": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    r = client.put(
        f"/v1/memory/{ns}/deepest", content=too_deep, headers={"If-None-Match": "*", "Content-Type": "application/json"}
    )
    assert r.status_code in (400, 422)
