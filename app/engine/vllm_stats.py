"""How long a request waited for the in-process vLLM engine: vLLM's own per-request timestamps, without its stat logs.

A forget's engine wait (lethe_forget_engine_wait_seconds, app/engine/priority.py) is, on vLLM, the time each of its
requests spent in vLLM's waiting queue before the step that first scheduled it: behind the step in flight when it
arrived, or for a free slot. vLLM's engine core stamps both moments (`RequestStateStats.queued_ts`, `scheduled_ts`,
one monotonic clock in the engine core) only when stats are on, and turning them on also starts a logger that prints
throughput every few seconds and a Prometheus logger that registers vLLM's metrics in the process (and, under
`lethe serve`, in Lethe's multi-process metrics directory, where they would appear in Lethe's `/metrics`). vLLM adds
its Prometheus logger only when no logger given to it is one: `QuietStats` is one that records nothing, so the
timestamps are kept (vllm_common.py `queue_wait` reads them) and nothing is logged or registered. vLLM calls these
interfaces unstable; tests/engine_vllm/test_vllm_local.py pins them
(`test_a_request_reports_its_wait_and_vllm_registers_no_metrics`).
"""

from __future__ import annotations

from typing import Any

from vllm.v1.metrics.loggers import PrometheusStatLogger


class QuietStats(PrometheusStatLogger):
    """Takes the Prometheus logger's place and records nothing."""

    def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:  # registers nothing
        return None

    def record(self, *args: Any, **kwargs: Any) -> None:
        return None

    def record_sleep_state(self, *args: Any, **kwargs: Any) -> None:
        return None

    def record_admission_rejection(self, *args: Any, **kwargs: Any) -> None:
        return None

    def log(self) -> None:
        return None

    def log_engine_initialized(self) -> None:
        return None
