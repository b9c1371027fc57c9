"""Prometheus metrics. One registry per app so tests can build several apps in one process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.http_requests = Counter(
            "lethe_http_requests_total", "HTTP requests by route template, method and status.",
            ["route", "method", "status"], registry=self.registry,
        )
        self.http_latency = Histogram(
            "lethe_http_request_duration_seconds", "HTTP request latency by route template and method.",
            ["route", "method"], registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.http_in_flight = Gauge(
            "lethe_http_requests_in_flight", "HTTP requests being served.", registry=self.registry
        )
        self.ready = Gauge(
            "lethe_ready", "1 when the database and the engine are ready.", registry=self.registry
        )
