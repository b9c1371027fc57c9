"""Auth, problem+json errors, request ids and size limits, through real HTTP against the real app."""

from __future__ import annotations

import json

import httpx

from tests.support import BOOTSTRAP_KEY

PROBLEM = "application/problem+json"


def assert_problem(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body = response.json()
    assert body["status"] == status
    assert isinstance(body["type"], str) and body["type"]
    assert isinstance(body["title"], str) and body["title"]
    assert "Traceback" not in response.text
    return dict(body)


def test_v1_route_without_key_is_401_problem(anon: httpx.Client) -> None:
    response = anon.post("/v1/sessions", json={})
    assert_problem(response, 401)
    assert response.headers["www-authenticate"].lower().startswith("bearer")


def test_bad_key_and_bad_scheme_are_401(anon: httpx.Client) -> None:
    assert_problem(anon.get("/v1/memory/ns/k", headers={"Authorization": "Bearer nope"}), 401)
    assert_problem(anon.get("/v1/memory/ns/k", headers={"Authorization": f"Basic {BOOTSTRAP_KEY}"}), 401)
    assert_problem(anon.get("/v1/forget/fgt_x", headers={"Authorization": "Bearer"}), 401)


def test_every_v1_route_requires_auth(live_server: object, anon: httpx.Client) -> None:
    spec = anon.get("/openapi.json").json()
    checked = 0
    for path, methods in spec["paths"].items():
        if not path.startswith("/v1/") or path.startswith("/v1/webhooks/"):
            continue  # webhooks authenticate by signature, not by key
        concrete = path.replace("{", "x").replace("}", "")
        for method in methods:
            response = anon.request(method.upper(), concrete, json={})
            assert response.status_code == 401, (method, path, response.status_code)
            checked += 1
    assert checked >= 10


def test_valid_key_passes_auth(client: httpx.Client) -> None:
    response = client.get("/v1/forget/fgt_unknown")
    assert response.status_code != 401


def test_validation_error_is_422_problem_without_echoing_input(client: httpx.Client) -> None:
    secret = "my-very-private-text-1234"
    response = client.post("/v1/forget", json={"target": {"text": secret}, "strategy": "nonsense"})
    body = assert_problem(response, 422)
    assert isinstance(body["errors"], list) and body["errors"]
    assert secret not in response.text


def test_malformed_json_is_422_problem(client: httpx.Client) -> None:
    response = client.post("/v1/sessions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert_problem(response, 422)


def test_unknown_field_is_rejected(client: httpx.Client) -> None:
    response = client.post("/v1/sessions", json={"system_promt": "typo"})
    assert_problem(response, 422)


def test_unknown_path_and_method_are_problems(client: httpx.Client) -> None:
    assert_problem(client.get("/v1/nowhere"), 404)
    assert_problem(client.patch("/healthz"), 405)


def test_body_over_limit_is_413_declared_and_streamed(client: httpx.Client) -> None:
    big = json.dumps({"system_prompt": "x" * 2_000_000}).encode()
    assert_problem(client.post("/v1/sessions", content=big, headers={"Content-Type": "application/json"}), 413)

    def chunks() -> object:
        for _ in range(40):
            yield b"x" * 65536

    # No Content-Length: the limit must hold on the bytes actually received.
    response = client.post("/v1/sessions", content=chunks(), headers={"Content-Type": "application/json"})  # type: ignore[arg-type]
    assert_problem(response, 413)


def test_request_id_is_echoed_or_generated(client: httpx.Client) -> None:
    mine = client.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert mine.headers["x-request-id"] == "abc-123"
    generated = client.get("/healthz")
    assert generated.headers["x-request-id"].startswith("req_")
    hostile = client.get("/healthz", headers={"X-Request-ID": "bad id\twith spaces"})
    assert hostile.headers["x-request-id"].startswith("req_")
