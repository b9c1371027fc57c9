"""Prometheus metrics. One registry per app so tests can build several apps in one process."""

from __future__ import annotations

import os
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess


class FleetAnswer(Protocol):
    """What the vllm-remote engine reports of one session request (app/engine/fleet.py FleetRequest)."""

    @property
    def affinity(self) -> str: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def reused_tokens(self) -> int: ...


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
            "lethe_http_requests_in_flight", "HTTP requests being served.", registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.session_waiters = Gauge(
            "lethe_session_waiters", "Requests of this process waiting for a session another request holds.",
            registry=self.registry, multiprocess_mode="livesum",
        )
        self.ready = Gauge(
            "lethe_ready", "1 when the database and the engine are ready.", registry=self.registry,
            multiprocess_mode="livemax",
        )
        # Replay cost (deploy/grafana/dashboards/lethe.json plots these).
        self.forget_jobs = Counter(
            "lethe_forget_jobs_total", "Forget jobs finished, by strategy and final status.",
            ["strategy", "status"], registry=self.registry,
        )
        self.forget_duration = Histogram(
            "lethe_forget_duration_seconds", "Wall time of a forget job from claim to receipt.",
            ["strategy"], registry=self.registry, buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900),
        )
        self.forget_transitions = Histogram(
            "lethe_forget_transitions_replayed", "Transitions recomputed per forgotten session.",
            ["strategy"], registry=self.registry, buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256),
        )
        self.forget_tokens = Counter(
            "lethe_forget_tokens_total",
            "Tokens a forget reused from cache, prefilled, decoded, or verified (accepted from recorded replies).",
            ["strategy", "kind"], registry=self.registry,
        )
        self.forget_full_reset = Counter(
            "lethe_forget_full_reset_estimate_tokens_total",
            "Tokens a cold full reset of the same sessions would have computed (the saving's denominator).",
            ["strategy"], registry=self.registry,
        )
        self.forget_engine_wait = Histogram(
            "lethe_forget_engine_wait_seconds",
            "Time a forgotten session's engine work waited for the engine (queued behind other work, or paused for "
            "more urgent work), by the job's priority (forget, detector); measured by the hf engine's queue and in "
            "vLLM's (in-process), not on a fleet.",
            ["priority"], registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.forget_queue_depth = Gauge(
            "lethe_forget_queue_depth", "Forget jobs queued or running (all processes), as this process last saw.",
            registry=self.registry, multiprocess_mode="livemax",
        )
        # Erasure at rest (docs/erasure-at-rest.md): forgets whose keys are not destroyed yet, and how long the
        # oldest has waited; alert when that passes the horizon (the promise every receipt makes).
        self.erasure_pending = Gauge(
            "lethe_erasure_pending_shreds", "Forgets whose erased keys are not destroyed in the key provider yet.",
            registry=self.registry, multiprocess_mode="livemax",
        )
        self.erasure_oldest_pending = Gauge(
            "lethe_erasure_oldest_pending_seconds",
            "Age of the oldest forget whose keys are not destroyed yet (0: none); past the horizon: a broken promise.",
            registry=self.registry, multiprocess_mode="livemax",
        )
        self.erasure_horizon = Gauge(
            "lethe_erasure_horizon_seconds", "LETHE_ERASURE_HORIZON_S: the bound a forget's erasure at rest keeps.",
            registry=self.registry, multiprocess_mode="livemax",
        )
        self.key_token_expiry = Gauge(
            "lethe_key_provider_token_expiry_timestamp_seconds",
            "When the OpenBao/Vault token Lethe presents expires, as Unix time (0: never); Lethe renews it at half of "
            "every term, so a value closer than that to time() means renewals fail or the max TTL is near.",
            registry=self.registry, multiprocess_mode="livemin",
        )
        # A vLLM fleet behind vllm-router (engine vllm-remote): every request a session makes, by its affinity
        # (app/engine/fleet.py): kept (it found its prefix cache), lost (it had one on the fleet and found none: a
        # failover), new (nothing to find yet), failed (the fleet went away under it: the client got a 503).
        self.fleet_requests = Counter(
            "lethe_fleet_requests_total", "Session requests to the vLLM fleet, by session affinity.",
            ["affinity"], registry=self.registry,
        )
        self.fleet_prompt_tokens = Counter(
            "lethe_fleet_prompt_tokens_total", "Prompt tokens of session requests to the vLLM fleet, by affinity.",
            ["affinity"], registry=self.registry,
        )
        self.fleet_reused_tokens = Counter(
            "lethe_fleet_reused_tokens_total",
            "Of those, tokens the fleet served from its prefix cache (the cache hit rate's numerator), by affinity.",
            ["affinity"], registry=self.registry,
        )

        # Data-subject erasures and retention (docs/subjects.md): what each erased, by why: `subject` (an erasure
        # request), `retention` (the sweep); `kind` is session or memory_key; `held` counts what a hold kept.
        self.erasures = Counter(
            "lethe_erasures_total", "Sessions and memory keys erased, by reason (subject, retention) and kind.",
            ["reason", "kind"], registry=self.registry,
        )
        self.erasures_held = Counter(
            "lethe_erasures_held_total", "Parts an erasure skipped because a legal hold covers them, by reason.",
            ["reason"], registry=self.registry,
        )

        # Read replicas (app/db/replicas.py): where reads that may leave the primary went, and how far behind each
        # replica is (untokened reads see that lag; tokened ones wait for it or read the primary).
        self.reads = Counter(
            "lethe_reads_total",
            "Reads a replica may serve, by who served them: replica (reason: token or untokened) or primary (reason: "
            "lagging past the wait bound, replica_down, other_timeline).",
            ["served_by", "reason"], registry=self.registry,
        )
        self.replica_up = Gauge(
            "lethe_replica_up", "1 when the replica answered the last probe.", ["replica"], registry=self.registry,
            multiprocess_mode="livemin",
        )
        self.replica_lag_bytes = Gauge(
            "lethe_replica_lag_bytes", "WAL the replica has not replayed yet, at the last probe.", ["replica"],
            registry=self.registry, multiprocess_mode="livemax",
        )
        self.replica_lag_seconds = Gauge(
            "lethe_replica_lag_seconds",
            "Seconds since the replica last replayed a transaction while it is behind (0 when caught up).",
            ["replica"], registry=self.registry, multiprocess_mode="livemax",
        )

    def fleet_request(self, request: FleetAnswer) -> None:
        """One session request to the fleet (VLLMRemoteEngine.observe)."""
        self.fleet_requests.labels(affinity=request.affinity).inc()
        self.fleet_prompt_tokens.labels(affinity=request.affinity).inc(request.prompt_tokens)
        self.fleet_reused_tokens.labels(affinity=request.affinity).inc(request.reused_tokens)

    def replica_state(self, replica: str, *, up: bool, lag_bytes: int | None, lag_seconds: float | None) -> None:
        self.replica_up.labels(replica=replica).set(1 if up else 0)
        if lag_bytes is not None:
            self.replica_lag_bytes.labels(replica=replica).set(lag_bytes)
        if lag_seconds is not None:
            self.replica_lag_seconds.labels(replica=replica).set(lag_seconds)

    def job_finished(self, strategy: str, status: str, duration_ms: int) -> None:
        self.forget_jobs.labels(strategy=strategy, status=status).inc()
        self.forget_duration.labels(strategy=strategy).observe(duration_ms / 1000)

    def render(self) -> bytes:
        """The exposition text. Under `lethe serve` with HTTP workers every process writes its samples to
        PROMETHEUS_MULTIPROC_DIR (app/serving.py) and any of them answers for all: counters and histograms summed,
        gauges by their `multiprocess_mode`."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return bytes(generate_latest(registry))
        return bytes(generate_latest(self.registry))
