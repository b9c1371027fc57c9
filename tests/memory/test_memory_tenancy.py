"""Tenant scoping: another tenant's namespace is invisible, indistinguishable from one never written."""

from __future__ import annotations

import httpx

from tests.memory.memory_helpers import create, write
from tests.support import problem


def test_another_tenant_sees_nothing_and_changes_nothing(
    client: httpx.Client, other_tenant: httpx.Client, ns: str
) -> None:
    create(client, ns, "diet", "vegan")
    write(client, ns, "diet", "vegetarian", base=1)
    client.delete(f"/v1/memory/{ns}/gone")

    # reads: a live key and a forgotten one both look never written, so neither existence nor a forget leaks
    for key in ("diet", "gone"):
        body = problem(other_tenant.get(f"/v1/memory/{ns}/{key}"), 404)
        assert body["version"] == 0 and body["forgotten"] is False
        problem(other_tenant.get(f"/v1/memory/{ns}/{key}/history"), 404)
    assert other_tenant.get(f"/v1/memory/{ns}").json() == {"keys": [], "next_cursor": None}

    # writes based on the first tenant's versions are stale in the second tenant's space
    body = problem(write(other_tenant, ns, "diet", "hijack", base=2), 412)
    assert body["current_version"] == 0
    batch = {"writes": [{"key": "diet", "value": "x", "base_version": 2}]}
    atomic = other_tenant.post(f"/v1/memory/{ns}:batch", json=batch)
    assert problem(atomic, 412)["conflicts"][0]["current_version"] == 0

    # the second tenant's own key of the same name is a separate record with its own versions
    assert create(other_tenant, ns, "diet", "omnivore") == 1
    forgot = other_tenant.delete(f"/v1/memory/{ns}/diet").json()
    assert forgot == {"version": 2, "forget_id": forgot["forget_id"], "already_forgotten": False}
    assert other_tenant.get(f"/v1/forget/{forgot['forget_id']}").status_code == 200
    assert other_tenant.get(f"/v1/memory/{ns}").json()["keys"] == []

    mine = client.get(f"/v1/memory/{ns}/diet").json()
    assert mine["value"] == "vegetarian" and mine["version"] == 2
    assert client.get(f"/v1/memory/{ns}").json()["keys"] == ["diet"]
    assert [v["value"] for v in client.get(f"/v1/memory/{ns}/diet/history").json()["versions"]] == [
        "vegan",
        "vegetarian",
    ]
    assert problem(client.get(f"/v1/memory/{ns}/gone"), 404)["forgotten"] is True


def test_unauthenticated_memory_calls_are_401(anon: httpx.Client, ns: str) -> None:
    for method, path in [
        ("GET", f"/v1/memory/{ns}/k"),
        ("PUT", f"/v1/memory/{ns}/k"),
        ("DELETE", f"/v1/memory/{ns}/k"),
        ("GET", f"/v1/memory/{ns}"),
        ("POST", f"/v1/memory/{ns}:batch"),
        ("GET", f"/v1/memory/{ns}/k/history"),
    ]:
        problem(anon.request(method, path, json={"value": 1}), 401)
