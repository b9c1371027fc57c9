"""Auth, problem+json errors, request ids and size limits, through real HTTP against the real app."""

from __future__ import annotations

import json
import select
import socket
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

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
    """Past authentication, the route itself answers: an unknown job is its 404 problem (not 401, and not a 500
    that `!= 401` would have let pass)."""
    response = client.get("/v1/forget/fgt_unknown")
    assert assert_problem(response, 404)["type"] == "https://lethe.dev/problems/not-found"


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


@pytest.mark.parametrize("method, path", [("PUT", "/v1/memory/limits/k"), ("POST", "/v1/sessions")])
def test_a_body_just_over_the_limit_is_read_before_the_413(live_server: Any, method: str, path: str) -> None:
    """The server reads the whole (bounded) body before it answers, so a client still sending gets the 413, not a
    reset: no answer is readable on the socket until the last byte was sent."""
    body = json.dumps({"value": "x" * (1_048_576 + 100)}).encode()
    url = urlsplit(live_server.base_url)
    head = (f"{method} {path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {BOOTSTRAP_KEY}\r\n"
            f"Content-Type: application/json\r\nIf-None-Match: *\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((url.hostname, url.port), timeout=120) as sock:
        sock.sendall(head)
        for start in range(0, len(body), 65536):
            readable, _, _ = select.select([sock], [], [], 0)
            assert not readable, f"the server answered (or closed) after {start} of {len(body)} bytes"
            sock.sendall(body[start:start + 65536])
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            assert chunk, f"closed before answering: {answer!r}"
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_request_id_is_echoed_or_generated(client: httpx.Client) -> None:
    mine = client.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert mine.headers["x-request-id"] == "abc-123"
    generated = client.get("/healthz")
    assert generated.headers["x-request-id"].startswith("req_")
    hostile = client.get("/healthz", headers={"X-Request-ID": "bad id\twith spaces"})
    assert hostile.headers["x-request-id"].startswith("req_")
