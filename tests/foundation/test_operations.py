"""Health, readiness and Prometheus metrics."""

from __future__ import annotations

import re

import httpx


def test_healthz_and_readyz(anon: httpx.Client) -> None:
    assert anon.get("/healthz").json() == {"status": "ok"}
    ready = anon.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "engine": "ok"}


def test_metrics_are_prometheus_text_labelled_by_route_template(client: httpx.Client, anon: httpx.Client) -> None:
    client.get("/v1/forget/fgt_aaaa")
    client.get("/v1/forget/fgt_bbbb")
    text = anon.get("/metrics")
    assert text.status_code == 200
    assert text.headers["content-type"].startswith("text/plain")
    body = text.text
    assert "# HELP lethe_http_request_duration_seconds" in body
    assert 'route="/v1/forget/{id}"' in body
    assert "fgt_aaaa" not in body  # ids never become label values
    assert re.search(r'lethe_http_requests_total\{.*route="/v1/forget/\{id\}".*\} [1-9]', body)
    assert "lethe_ready 1.0" in body
