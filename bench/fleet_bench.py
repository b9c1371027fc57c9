"""Lethe on a vLLM fleet: two `vllm serve` CPU workers behind vllm-router (README "A vLLM fleet").

    python -m bench.fleet_bench [--sessions 4] [--turns 4] [--max-tokens 16] [--seed 1] [--json PATH]

One run, one pair of workers (bench/fleet.py), two routers in front of them: `consistent_hash` (what the README
runs) and `round_robin`, each with its own `lethe serve` (engine vllm-remote) on one embedded PostgreSQL. The same
`--sessions` conversations (system prompts of 400-800 tokens, the same user messages, greedy) run through both, round
by round: in each round every session sends its next turn, in an order shuffled per round (seeded; the same order for
both configurations), as interleaved traffic would arrive. (In a fixed order round_robin would hand a session the same
worker every round when the number of sessions is even, and the other one every round when it is odd.) One request at
a time, the two configurations alternating, so both see the same machine. Per turn: the worker that served it (the
workers' own request counters), `usage.reused_tokens` of `prompt_tokens`, and the latency the client saw.

Then failover, on the consistent_hash side: the worker holding most of its sessions is killed (SIGKILL to its process
group), and right away each of those sessions sends its next turn, all at once, as clients would (a 503 is retried
after its Retry-After): per session the time from the kill to that turn's 200 and how long the successful attempt
itself took (a cold prefill on the other worker), its `reused_tokens` (0: the cache is rebuilt there) and the next
turn's; and when the router marked the worker unhealthy. Last, a forget (selective_replay of a session's second user
message, `wait: true`) on the surviving worker: its latency as the client saw it and its receipt.

Prints a markdown summary; writes bench/results/fleet_bench.json (or `--json`). The machine is shared and noisy:
compare the two configurations' figures from one run, not absolute times across runs.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from app.db.embedded import start_embedded_postgres
from app.engine.model_store import resolve_model
from bench.fleet import Router, VLLMWorker
from bench.serve import MODEL_CACHE, LetheServer

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
API_KEY = "bench-key-" + "0" * 24
POLICIES = ("consistent_hash", "round_robin")
USER = [
    "Hi! Please help me plan my week.", "I like jogging in the morning.", "Suggest a time for my runs.",
    "Summarize the plan in one sentence.", "What day should I rest?", "Which shoes should I buy?",
]
FAILOVER_LIMIT_S = 120.0


def system_prompt(index: int) -> str:
    """Session `index`'s system prompt: 400 to 800 tokens of SmolLM2, different for every session."""
    facts = " ".join(f"Rule {index}.{k}: answer in short sentences about topic {k * 7 + index}." for k in range(200))
    words = facts.split()
    return " ".join(words[: 230 + 45 * (index % 8)])


@dataclass
class Turn:
    policy: str
    session: int
    turn: int
    worker: int
    prompt_tokens: int
    reused_tokens: int
    latency_s: float


class Run:
    def __init__(self, workers: list[VLLMWorker], servers: dict[str, LetheServer], max_tokens: int) -> None:
        self.workers = workers
        self.clients = {
            policy: httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=600)
            for policy, s in servers.items()
        }
        self.max_tokens = max_tokens
        self.sessions: dict[str, list[str]] = {policy: [] for policy in servers}
        self.homes: dict[str, dict[int, int]] = {policy: {} for policy in servers}
        self.user_artifacts: dict[tuple[str, int, int], str] = {}

    def served(self) -> list[float]:
        return [w.served() if w.alive else 0.0 for w in self.workers]

    def create(self, policy: str, index: int) -> None:
        sampling = {"temperature": 0, "max_tokens": self.max_tokens, "seed": 7}
        body = {"system_prompt": system_prompt(index), "sampling": sampling}
        r = self.clients[policy].post("/v1/sessions", json=body)
        r.raise_for_status()
        self.sessions[policy].append(str(r.json()["id"]))

    def post_turn(self, policy: str, index: int, text: str) -> httpx.Response:
        session_id = self.sessions[policy][index]
        body = {"inputs": [{"type": "user", "content": text}]}
        return self.clients[policy].post(f"/v1/sessions/{session_id}/turns", json=body)

    def turn(self, policy: str, index: int, turn: int) -> Turn:
        before, started = self.served(), time.perf_counter()
        r = self.post_turn(policy, index, USER[turn % len(USER)])
        latency = time.perf_counter() - started
        r.raise_for_status()
        after = self.served()
        (worker,) = [i for i in range(len(after)) if after[i] > before[i]]
        body = r.json()
        self.homes[policy][index] = worker
        self.user_artifacts[(policy, index, turn)] = body["inputs"][0]["artifact_id"]
        usage = body["usage"]
        return Turn(policy, index, turn, worker, usage["prompt_tokens"], usage["reused_tokens"], latency)

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


def summarize(turns: list[Turn]) -> dict[str, Any]:
    """Per policy, over every turn after a session's first (the first has nothing to reuse)."""
    out: dict[str, Any] = {}
    for policy in POLICIES:
        later = [t for t in turns if t.policy == policy and t.turn > 0]
        if not later:
            continue
        moved = sum(
            1 for t in later
            if next(p for p in turns if (p.policy, p.session, p.turn) == (policy, t.session, t.turn - 1)).worker
            != t.worker
        )
        out[policy] = {
            "turns": len(later),
            "reuse_ratio": sum(t.reused_tokens for t in later) / sum(t.prompt_tokens for t in later),
            "cold_turns": sum(1 for t in later if t.reused_tokens == 0),
            "moved_turns": moved,
            "latency_mean_s": statistics.mean(t.latency_s for t in later),
            "latency_p50_s": statistics.median(t.latency_s for t in later),
        }
    return out


def failover(run: Run, router: Router) -> dict[str, Any]:
    """Kill the worker holding most consistent_hash sessions; all of them send their next turn at once, each
    retrying a 503 after its Retry-After, as a client does."""
    homes = run.homes["consistent_hash"]
    victim = max(set(homes.values()), key=lambda w: sum(1 for h in homes.values() if h == w))
    sessions = sorted(i for i, h in homes.items() if h == victim)
    victim_url = run.workers[victim].url
    run.workers[victim].kill()
    killed = time.perf_counter()
    rows: dict[int, dict[str, Any]] = {}

    def next_turn(index: int) -> None:
        statuses = []
        while True:
            attempt = time.perf_counter()
            r = run.post_turn("consistent_hash", index, "I am back. Where were we?")
            statuses.append(r.status_code)
            if r.status_code == 200 or time.perf_counter() - killed > FAILOVER_LIMIT_S:
                break
            time.sleep(float(r.headers.get("Retry-After", "1")))  # what the 503 asks a client to do
        done = time.perf_counter()
        first = r.json()["usage"]["reused_tokens"] if r.status_code == 200 else None
        after = run.post_turn("consistent_hash", index, "Go on.")
        rows[index] = {
            "session": index, "seconds_from_death_to_200": round(done - killed, 2),
            "successful_attempt_s": round(done - attempt, 2), "statuses": statuses, "reused_first": first,
            "reused_next": after.json()["usage"]["reused_tokens"] if after.status_code == 200 else None,
        }

    threads = [threading.Thread(target=next_turn, args=(index,)) for index in sessions]
    for thread in threads:
        thread.start()
    router.wait_dropped(victim_url, limit_s=FAILOVER_LIMIT_S)
    dropped = time.perf_counter() - killed
    for thread in threads:
        thread.join()
    return {"victim": victim, "router_dropped_after_s": round(dropped, 2), "sessions": [rows[i] for i in sessions]}


def forget_latency(run: Run) -> dict[str, Any]:
    client = run.clients["consistent_hash"]
    target = run.user_artifacts[("consistent_hash", 0, 1)]
    started = time.perf_counter()
    r = client.post("/v1/forget", json={"target": {"artifact_id": target}, "wait": True})
    job = r.json()
    while job["status"] in ("queued", "running"):
        time.sleep(0.2)
        job = client.get(f"/v1/forget/{job['id']}").json()
    wall = time.perf_counter() - started
    entry = job["sessions"][0] if job.get("sessions") else {}
    return {
        "status": job["status"], "client_s": round(wall, 2), "duration_ms": job.get("duration_ms"),
        "transitions_replayed": entry.get("transitions_replayed"), "tokens": entry.get("tokens"),
        "exactness": entry.get("exactness"),
    }


def markdown(result: dict[str, Any]) -> str:
    lines = ["| policy | turns | reuse (reused / prompt) | turns that reused 0 | turns on another worker "
             "than the session's previous | latency mean / p50 |", "| --- | --- | --- | --- | --- | --- |"]
    for policy, s in result["summary"].items():
        lines.append(
            f"| {policy} | {s['turns']} | {s['reuse_ratio']:.1%} | {s['cold_turns']} | {s['moved_turns']} | "
            f"{s['latency_mean_s']:.2f} / {s['latency_p50_s']:.2f} s |"
        )
    f = result["failover"]
    lines += ["", f"failover (worker {f['victim']} killed; the router dropped it after {f['router_dropped_after_s']} "
              "s): " + "; ".join(
        f"session {r['session']}: 200 after {r['seconds_from_death_to_200']} s (answers {r['statuses']}; the "
        f"successful attempt took {r['successful_attempt_s']} s), reused {r['reused_first']} then {r['reused_next']}"
        for r in f["sessions"]
    )]
    g = result["forget"]
    lines += ["", f"forget on the fleet: {g['status']} in {g['client_s']} s (receipt {g['duration_ms']} ms, "
              f"{g['transitions_replayed']} transitions replayed, tokens {g['tokens']}, {g['exactness']})",
              "", f"load average before / after: {result['load_before']} / {result['load_after']}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1, help="the per-round arrival order's shuffle")
    parser.add_argument("--json", type=Path, default=RESULTS / "fleet_bench.json")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="lethe-fleet-bench-"))
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)  # after the embedded PostgreSQL stops
    model_dir = resolve_model(None, MODEL_CACHE).path
    workers = [VLLMWorker(model_dir, scratch / f"worker-{i}.log") for i in range(2)]
    routers: dict[str, Router] = {}
    servers: dict[str, LetheServer] = {}
    run: Run | None = None
    try:
        database_url = start_embedded_postgres(scratch / "pgdata")
        started = [w.wait_ready() for w in workers]
        for policy in POLICIES:
            routers[policy] = Router([w.url for w in workers], scratch / f"router-{policy}.log", policy=policy)
            routers[policy].wait_ready()
        for policy in POLICIES:
            servers[policy] = LetheServer(
                scratch, None, LETHE_DATABASE_URL=database_url, LETHE_BOOTSTRAP_API_KEY=API_KEY,
                LETHE_ENGINE="vllm-remote", LETHE_VLLM_URL=routers[policy].url,
            )
            servers[policy].wait_ready(600)
        run = Run(workers, servers, args.max_tokens)
        load_before = os.getloadavg()[0]
        for index in range(args.sessions):
            for policy in POLICIES:
                run.create(policy, index)
        turns: list[Turn] = []
        shuffle = random.Random(args.seed)
        for turn in range(args.turns):
            arrivals = list(range(args.sessions))
            shuffle.shuffle(arrivals)
            for position, index in enumerate(arrivals):
                order = POLICIES if (turn + position) % 2 == 0 else POLICIES[::-1]
                turns.extend(run.turn(policy, index, turn) for policy in order)
        result: dict[str, Any] = {
            "args": vars(args) | {"json": str(args.json)}, "worker_start_s": started,
            "turns": [asdict(t) for t in turns], "summary": summarize(turns),
        }
        result["failover"] = failover(run, routers["consistent_hash"])
        result["forget"] = forget_latency(run)
        result["load_before"], result["load_after"] = round(load_before, 2), round(os.getloadavg()[0], 2)
    finally:
        if run is not None:
            run.close()
        for server in servers.values():
            server.stop()
        for router in routers.values():
            router.stop()
        for worker in workers:
            if worker.alive:
                worker.stop()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
