"""Hostile input on every route, against the live app: a NUL, an unpaired surrogate or an oversized value in any
string field, path parameter or query parameter answers 404 (an id that cannot exist) or 422 (text that cannot be
stored, naming the field), never a 5xx, and nothing of it is stored. And authentication comes first: without a
valid key a malformed request answers 401, whatever is wrong with its body.

The table holds one valid body per request shape; every string inside it (and every member name of a free-form
JSON object) is mutated in turn, and a coverage check walks openapi.yaml's request schemas so a string field
added later without a row here fails the test.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.support import problem, sql

MARK = "zqhardenzq"  # in every hostile string, so a scan of the database finds any that was stored
NUL = f"{MARK}\u0000x"
SURROGATE = f"{MARK}\ud800x"  # json.dumps writes it as the escape \ud800, which Python's JSON parser accepts
BAD = {"nul": NUL, "surrogate": SURROGATE}
SES, ART, FGT = "ses_" + "0" * 26, "art_" + "0" * 26, "fgt_" + "0" * 26  # plausible ids nobody has

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "description": "a city"}}}


@dataclass(frozen=True)
class Shape:
    """One request shape: a route and a valid body for it."""

    method: str
    path: str
    body: dict[str, Any]


def shapes(session_id: str) -> list[Shape]:
    turns = f"/v1/sessions/{session_id}/turns"
    target = {"session_id": session_id}
    return [
        Shape("POST", "/v1/sessions", {
            "system_prompt": "s", "memory_namespace": "ns", "context_policy": "full",
            "checkpoint_policy": "every_turn",
            "tools": [{"name": "get_city", "description": "d", "parameters": PARAMETERS, "kind": "read_only"}],
            "sampling": {"stop": ["END"]}, "subject_id": "s1",
        }),
        Shape("POST", turns, {"inputs": [{"type": "user", "content": "c"}]}),
        Shape("POST", turns, {"inputs": [{"type": "document", "content": "c", "source": "https://e.example"}]}),
        Shape("POST", turns, {"inputs": [{"type": "tool_result", "tool_call_id": "call_1", "content": "c"}]}),
        Shape("POST", "/v1/forget", {"target": {"artifact_id": ART}, "strategy": "selective_replay", "reason": "r",
                                         "shred": "horizon"}),
        Shape("POST", "/v1/forget", {"target": {**target, "artifact_ids": [ART]}}),
        Shape("POST", "/v1/forget", {"target": {**target, "text": "t"}, "dry_run": True}),
        Shape("POST", "/v1/forget", {"target": {"memory": {"namespace": "ns", "key": "k"}}}),
        Shape("POST", "/v1/forget", {"target": {**target, "keyword": "k"}}),
        Shape("POST", "/v1/forget", {"target": {**target, "query": "q", "min_similarity": 0.5}}),
        Shape("POST", "/v1/forget", {"plan_id": FGT}),
        Shape("POST", f"/v1/forget/{FGT}/tool_results", {"tool_call_id": "call_1", "content": "c"}),
        Shape("PUT", "/v1/memory/ns/k", {"value": {"city": ["Paris", {"street": "Rue"}]}, "source": "user"}),
        Shape("POST", "/v1/memory/ns:batch", {
            "atomic": True, "writes": [{"key": "k", "value": "v", "base_version": 0, "source": "user", "ttl_s": 60}],
        }),
        Shape("POST", "/v1/memory:search", {
            "namespace_prefix": "ns", "query": "q", "fields": ["text"], "filter": {"color": {"$ne": "red"}},
        }),
        Shape("PUT", "/v1/subjects/s1", {"memory_namespaces": ["ns"]}),
        Shape("POST", "/v1/subjects/s1/erase", {"dry_run": True, "also": {"text": ["t"]}, "reason": "r"}),
        Shape("POST", "/v1/subjects/s1/erase", {"dry_run": True, "also": {"query": "q", "min_similarity": 0.5}}),
        Shape("POST", "/v1/holds", {"subject_id": "s1", "reason": "r"}),
        Shape("POST", "/v1/holds", {"session_id": SES, "reason": "r"}),
        Shape("POST", "/v1/holds", {"namespace": "ns", "reason": "r"}),
        # Numbers only: a renamed member (an unknown field) must still answer 422 without echoing it.
        Shape("PUT", "/v1/retention", {"sessions_max_idle_days": 30, "memory_max_age_days": 30}),
        Shape("PUT", "/v1/retention/subjects/s1", {"sessions_max_idle_days": 30, "memory_max_age_days": 30}),
        Shape("PUT", "/v1/retention/namespaces/ns", {"memory_max_age_days": 30}),
        *thread_shapes(),
    ]


def thread_shapes() -> list[Shape]:
    """The LangGraph checkpoint routes: serialized values travel as {"type", "data"} (base64)."""
    thread = "/v1/threads/t1"
    blob = {"channel": "messages", "version": "1", "type": "json", "data": "e30="}
    write = {"checkpoint_ns": "", "checkpoint_id": "c1", "task_id": "task", "idx": 0}
    return [
        Shape("PUT", f"{thread}/checkpoints/c2", {
            "checkpoint_ns": "ns", "parent_id": "c1", "checkpoint": {"type": "json", "data": "e30="},
            "metadata": {"source": "loop"}, "channel_versions": {"messages": "1"}, "blobs": [blob],
        }),
        Shape("POST", f"{thread}/checkpoints/c1/writes", {
            "checkpoint_ns": "ns", "task_id": "task", "task_path": "p",
            "writes": [{"idx": 0, "channel": "messages", "type": "json", "data": "e30="}],
        }),
        Shape("POST", "/v1/threads:delete_for_runs", {"run_ids": ["run"]}),
        Shape("POST", "/v1/threads:prune", {"thread_ids": ["t1"], "strategy": "delete"}),
        Shape("POST", f"{thread}/copy", {"target_thread_id": "t2"}),
        Shape("POST", f"{thread}/rewrite", {
            "revision": 1, "blobs": [{"checkpoint_ns": "ns", **blob}],
            "writes": [{**write, "type": "json", "data": "e30="}], "drop_writes": [write],
        }),
    ]


def leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str]]:
    """(path, kind) of every string and of every member name in a JSON value; kind is "value" or "member"."""
    if isinstance(value, str):
        yield path, "value"
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, (*path, i))
    elif isinstance(value, dict):
        for member, item in value.items():
            yield (*path, member), "member"
            yield from leaves(item, (*path, member))


def mutated(body: dict[str, Any], path: tuple[Any, ...], kind: str, bad: str) -> dict[str, Any]:
    out = copy.deepcopy(body)
    parent = out
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if kind == "value":
        parent[last] = bad
    else:
        parent[bad] = parent.pop(last)
    return out


def schema_name(path: tuple[Any, ...]) -> str:
    return ".".join("[]" if isinstance(p, int) else str(p) for p in path).replace(".[]", "[]")


def send(client: httpx.Client, method: str, url: str, body: Any) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if method == "PUT":
        headers["if-none-match"] = "*"
    return client.request(method, url, content=json.dumps(body).encode(), headers=headers)


def no_5xx(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.request.method, response.request.url, response.text)


def stored_marks(database_url: str) -> list[str]:
    """Tables in which any row mentions MARK (each row read as text, every column included)."""
    tables = [r["tablename"] for r in sql(database_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
    return [t for t in tables if sql(database_url, f'SELECT 1 FROM "{t}" x WHERE x::text LIKE $1 LIMIT 1', f"%{MARK}%")]


@pytest.fixture(scope="module")
def session_id(live_server: Any) -> str:
    from tests.support import BOOTSTRAP_KEY

    with httpx.Client(base_url=live_server.base_url, headers={"Authorization": f"Bearer {BOOTSTRAP_KEY}"}) as c:
        response = c.post("/v1/sessions", json={"system_prompt": "hardening"})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])


def test_every_string_field_refuses_unstorable_and_oversized_text(
    client: httpx.Client, session_id: str, database_url: str
) -> None:
    spec = client.get("/openapi.json").json()
    limits = max_lengths(spec)
    checked = 0
    for shape in shapes(session_id):
        for path, kind in leaves(shape.body):
            field = schema_name(path)
            for name, bad in BAD.items():
                response = send(client, shape.method, shape.path, mutated(shape.body, path, kind, bad))
                body = problem(response, 422)
                assert MARK not in response.text, "a refused input is never echoed"
                if kind == "value":  # a renamed member is an unknown field, or a free-form object's member
                    assert any(_names(e, path) for e in body["errors"]), (shape.path, field, name, body["errors"])
                checked += 1
            limit = limits.get(field)
            if kind == "value" and limit is not None:
                response = send(client, shape.method, shape.path, mutated(shape.body, path, kind, "x" * (limit + 1)))
                problem(response, 422)
                checked += 1
    assert checked > 150
    assert stored_marks(database_url) == []


UNION_TAGS = {"user", "document", "tool_result"}  # pydantic puts a discriminated union's tag into the location


def _names(error: dict[str, Any], path: tuple[Any, ...]) -> bool:
    """Whether an error (loc ["body", "inputs", 0, "user", "content"]) names the field at `path` (("inputs", 0,
    "content")): exactly, or as the list or free-form object holding it with the place inside in its message
    ("... (at [0])")."""
    loc = error["loc"]
    steps = tuple(step for step in loc[1:] if step not in UNION_TAGS)
    if loc[:1] != ["body"] or not steps or path[: len(steps)] != steps:
        return False
    return steps == path or "(at " in error["msg"] or (path[-1] == "type" and steps == path[:-1])


def max_lengths(spec: dict[str, Any]) -> dict[str, int]:
    """maxLength of every string field of every request body, by schema name ("tools[].description")."""
    out: dict[str, int] = {}
    for name, schema in string_fields(spec):
        if "maxLength" in schema:
            out[name] = int(schema["maxLength"])
    return out


def is_compat(operation: dict[str, Any]) -> bool:
    """An operation of the OpenAI-compatible router (its own error format), by the tag that router gives its routes."""
    return "openai-compatible" in operation.get("tags", [])


def string_fields(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every string field (and free-form JSON field) of every JSON request body in the spec."""
    for methods in spec["paths"].values():
        for operation in methods.values():
            if is_compat(operation):
                continue  # the OpenAI-compatible routes (their own error format) are not in this table yet
            content = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if content is not None:
                yield from _walk(spec, content["schema"], "", set())


def _walk(spec: dict[str, Any], schema: dict[str, Any], name: str, seen: set[str]) -> Iterator[tuple[str, Any]]:
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref in seen:
            return
        target = spec
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
        yield from _walk(spec, target, name, seen | {ref})
        return
    for key in ("anyOf", "oneOf", "allOf"):
        for option in schema.get(key, []):
            yield from _walk(spec, option, name, seen)
    kind = schema.get("type")
    if kind == "string":
        yield name, schema
    elif kind == "array":
        yield from _walk(spec, schema.get("items", {}), name + "[]", seen)
    elif kind == "object" and "properties" in schema:
        for member, inner in schema["properties"].items():
            yield from _walk(spec, inner, f"{name}.{member}".lstrip("."), seen)
    elif (kind == "object" or not kind) and not any(k in schema for k in ("anyOf", "oneOf", "allOf", "if")):
        yield name, {"type": "any"}  # free-form JSON: its strings and member names are checked (an `if`: a rule)


def test_the_table_covers_every_string_field_of_the_spec(client: httpx.Client, session_id: str) -> None:
    spec = client.get("/openapi.json").json()
    covered = {schema_name(path) for shape in shapes(session_id) for path, _ in leaves(shape.body)}
    fields = {name for name, _ in string_fields(spec)}
    webhook = {"session_id", "artifact_id", "text", "detector"}  # the detector webhook's: tests/forget/test_webhook.py
    missing = sorted(f for f in fields - webhook if not any(c == f or c.startswith(f + ".") or
                                                             c.startswith(f + "[") for c in covered))
    assert missing == [], f"string fields without a row in shapes(): {missing}"


# -- path and query parameters --------------------------------------------------------------------------------

ID_ROUTES = [
    ("GET", "/v1/sessions/{id}"),
    ("DELETE", "/v1/sessions/{id}"),
    ("POST", "/v1/sessions/{id}/turns"),
    ("GET", "/v1/sessions/{id}/artifacts"),
    ("GET", "/v1/sessions/{id}/artifacts/{artifact_id}/descendants"),
    ("POST", "/v1/sessions/{id}/compact"),
    ("GET", "/v1/forget/{id}"),
    ("POST", "/v1/forget/{id}/tool_results"),
]
ID_BODIES = {
    "/v1/sessions/{id}/turns": {"inputs": [{"type": "user", "content": "c"}]},
    "/v1/forget/{id}/tool_results": {"tool_call_id": "call_1", "content": "c"},
}
# Percent-encoded path segments: a NUL, an UTF-8-encoded surrogate (invalid UTF-8), and an id longer than any.
BAD_SEGMENTS = {"nul": quote(NUL), "surrogate": f"{MARK}%ED%A0%80x", "long": "ses_" + "a" * 300}


@pytest.mark.parametrize(("method", "template"), ID_ROUTES)
@pytest.mark.parametrize("segment", sorted(BAD_SEGMENTS))
def test_a_path_id_that_cannot_exist_is_404(
    client: httpx.Client, session_id: str, method: str, template: str, segment: str
) -> None:
    bad = BAD_SEGMENTS[segment]
    fine = template.format(id=session_id, artifact_id=ART)
    for url in {template.format(id=bad, artifact_id=ART), template.format(id=session_id, artifact_id=bad)} - {fine}:
        response = client.request(method, url, json=ID_BODIES.get(template, {}))
        body = problem(response, 404)
        body.pop("instance")  # the path requested, as RFC 9457 has it
        assert MARK not in json.dumps(body)


MEMORY_ROUTES = [
    ("GET", "/v1/memory/{ns}"), ("POST", "/v1/memory/{ns}:batch"), ("GET", "/v1/memory/{ns}/{key}"),
    ("PUT", "/v1/memory/{ns}/{key}"), ("DELETE", "/v1/memory/{ns}/{key}"), ("GET", "/v1/memory/{ns}/{key}/history"),
]


@pytest.mark.parametrize(("method", "template"), MEMORY_ROUTES)
def test_memory_names_that_cannot_be_stored_are_422(
    client: httpx.Client, method: str, template: str, database_url: str
) -> None:
    bodies = {"POST": {"writes": [{"key": "k", "value": 1, "base_version": 0}]}, "PUT": {"value": 1}}
    # (A percent-encoded surrogate is invalid UTF-8: the server decodes it to U+FFFD, a storable name.)
    for bad in [BAD_SEGMENTS["nul"], BAD_SEGMENTS["long"], "n" * 201, "a%01b", "a%7Fb"]:
        fine = template.format(ns="ns", key="k")
        for url in {template.format(ns=bad, key="k"), template.format(ns="ns", key=bad)} - {fine}:
            response = client.request(method, url, json=bodies.get(method), headers={"if-none-match": "*"})
            problem(response, 422)
    for query in (f"cursor={quote(NUL)}", f"cursor={'A' * 401}", "limit=-1", "limit=%00"):
        problem(client.get(f"/v1/memory/ns?{query}"), 422)
    problem(client.delete(f"/v1/memory/ns/k?source={quote(NUL)}"), 422)
    assert stored_marks(database_url) == []


@pytest.mark.parametrize("template", ["/v1/retention/subjects/{}", "/v1/retention/namespaces/{}"])
def test_retention_names_that_cannot_be_stored_are_422(client: httpx.Client, template: str, database_url: str) -> None:
    # (A valid name is not sent: it would set a retention limit on the shared tenant.)
    for bad in [BAD_SEGMENTS["nul"], BAD_SEGMENTS["long"], "n" * 201, "a%01b", "a%7Fb"]:
        response = client.put(template.format(bad), json={"memory_max_age_days": 30})
        body = problem(response, 422)
        assert MARK not in json.dumps(body["errors"])
    assert stored_marks(database_url) == []


def test_every_string_query_parameter_refuses_unstorable_text(client: httpx.Client, database_url: str) -> None:
    spec = client.get("/openapi.json").json()
    # Cursors that decode to a NUL: a memory listing's (the last key) and a keyset listing's ([created_at, id]).
    keyset = json.dumps(["2026-01-01T00:00:00+00:00", NUL]).encode()
    forged = {True: base64.urlsafe_b64encode(NUL.encode()).decode(), False: base64.urlsafe_b64encode(keyset).decode()}
    checked = 0
    for template, methods in spec["paths"].items():
        for method, operation in methods.items():
            if is_compat(operation):
                continue  # (as in string_fields)
            for parameter in operation.get("parameters", []):
                # (A parameter declared by its media type, a JSON object, is checked by its route's own tests.)
                if parameter["in"] != "query" or "string" not in json.dumps(parameter.get("schema", {})):
                    continue
                url = re.sub(r"\{[^}]+\}", "ns", template)  # (only the memory routes have both)
                values = [NUL, "x" * (max_length(parameter["schema"]) + 1)]
                if parameter["name"] == "cursor":
                    values.append(forged[template.startswith("/v1/memory")])
                for value in values:
                    response = client.request(method.upper(), url, params={parameter["name"]: value})
                    body = problem(response, 422)
                    assert MARK not in json.dumps(body["errors"] if "errors" in body else body["detail"])
                    checked += 1
    assert checked >= 10
    assert stored_marks(database_url) == []


def max_length(schema: dict[str, Any]) -> int:
    """A query parameter's maxLength (its string option's, when it may also be absent); 400 for an enum, which
    no text that long can match."""
    for option in [schema, *schema.get("anyOf", [])]:
        if "maxLength" in option:
            return int(option["maxLength"])
    assert "enum" in json.dumps(schema), f"a string query parameter without maxLength: {schema}"
    return 400


def test_invalid_utf8_and_cesu_encoded_surrogates_in_a_body_are_refused(client: httpx.Client) -> None:
    headers = {"content-type": "application/json"}
    for raw in (b'{"system_prompt": "\xff"}', b'{"system_prompt": "a\xed\xa0\x80b"}', b'{"system_prompt": "a\x00"}'):
        response = client.post("/v1/sessions", content=raw, headers=headers)
        no_5xx(response)
        assert response.status_code in (400, 422), response.text


# -- authentication before validation -------------------------------------------------------------------------

def operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, bool]]:
    """(method, path template, whether the OpenAI-compatible router serves it) of every authenticated route."""
    for path, methods in spec["paths"].items():
        if path.startswith("/v1/") and path != "/v1/webhooks/detector":  # which authenticates by its signature
            for method, operation in methods.items():
                yield method.upper(), path, is_compat(operation)


MALFORMED: dict[str, dict[str, Any]] = {
    "not json": {"content": b"{not json", "headers": {"content-type": "application/json"}},
    "invalid utf-8": {"content": b'{"a": "\xff"}', "headers": {"content-type": "application/json"}},
    "wrong schema": {"content": b'{"no_such_field": [1, 2, 3]}', "headers": {"content-type": "application/json"}},
    "nul": {"content": json.dumps({"system_prompt": NUL, "inputs": NUL}).encode(),
            "headers": {"content-type": "application/json"}},
}


@pytest.mark.parametrize("credentials", ["none", "bad key", "bad scheme"])
def test_without_a_valid_key_a_malformed_request_is_401(anon: httpx.Client, credentials: str) -> None:
    auth = {"none": {}, "bad key": {"Authorization": "Bearer lethe_nope"}, "bad scheme": {"Authorization": "Basic x"}}
    spec = anon.get("/openapi.json").json()
    checked = 0
    for method, template, compat in operations(spec):
        for segment in ("x", quote(NUL)):
            url = re.sub(r"\{[^}]+\}", segment, template)
            for name, request in MALFORMED.items():
                response = anon.request(
                    method, url, content=request["content"], headers={**request["headers"], **auth[credentials]}
                )
                if compat:  # OpenAI's error body, which the SDK parses
                    assert response.status_code == 401, (method, url, name, response.text)
                    assert response.json()["error"]["type"], response.text
                else:
                    body = problem(response, 401)
                    assert "errors" not in body, (method, url, name)
                checked += 1
    assert checked >= 100
