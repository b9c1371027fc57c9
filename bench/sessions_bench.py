"""Many sessions generating at once against a real `lethe serve`, per engine, beside raw vLLM (issue 14).

    python -m bench.sessions_bench [--engines hf,vllm] [--sessions 1,4,8,16] [--turns 2] [--max-tokens 64]
        [--sequential 4,8] [--pool 64] [--forget-beside 8 [--forget-repeats 5]] [--live-words 300] [--no-raw]
        [--json PATH] [--server-env KEY=VALUE ...]

Per engine (one `lethe serve` each, in turn, from bench.serve) and N in `--sessions`: N fresh sessions (one system
prompt, greedy, `--max-tokens`) run `--turns` turns of one user message each, all N at once over one httpx
AsyncClient. Per run: decoded tokens/s (each turn's `usage.decode_tokens`, summed, over the wall time), p50/p99 turn
latency, non-2xx and 5xx answers, transport errors, pool timeouts and error lines in the server log, the server tree's
peak RSS and the load generator's own CPU seconds (getrusage). `--sequential`: the same work one turn after another
(gain = all at once / sequential). `--pool 64`: 64 sessions at once, `--pool-max-tokens`, default database pool.
`--forget-beside 8`: a forget (selective_replay of a user message, waited for) on an idle server (after a first one
that pays the server's one-time costs), then on a twin session while 8 others generate until it ends; their turns
must all succeed. `--forget-repeats K`: K such idle/beside pairs in alternation, figures as medians (one pair on a
shared machine is noise: the same command gave 1.18x, 1.33x and 1.68x for vllm). Those turns are streamed, so the
bench also shows whether live replies progress while the forget runs: streamed deltas inside the forget's window and
the longest stretch without one, beside the same counts in as long a window just after it (the in-process vllm
engine hands a reply's tokens over when it ends, so there the deltas count finished replies). `--live-words W`: every
live turn's message starts with W words of a pasted document (an agent's tool output), so live turns prefill more.
An engine may carry settings of its own, `--engines vllm+LETHE_VLLM_LIVE_STEP_TOKENS=0,vllm`: two servers in turn,
their rows named so, to compare two configurations in one run.

Raw vLLM runs last, in this process, once every server's processes are gone: the installed model loaded as
app/engine/vllm_local.py loads it (float32, eager, the same KV bytes, prefix caching, `max_num_seqs` = the largest N),
the same conversations (one cache salt per session, each reply and the next message appended per turn) as one
batched `LLM.generate` of N prompts per turn: "Lethe on vllm / raw vLLM". A raw request's latency is its batch's.
Prints a markdown table; `--json` writes everything.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import resource
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.forget_bench import CLEAN, TARGET, JobFailed, build_session, forget, shape
from bench.forget_bench import SYSTEM as FORGET_SYSTEM
from bench.serve import MODEL_CACHE, LetheServer, serving

API_KEY = "bench-key-" + "0" * 24
SYSTEM = "You are a helpful assistant who writes vivid, detailed prose."
PROMPT = "Write a long story about a sailor and the sea."
# SQLAlchemy's QueuePool, out of connections for pool_timeout: "QueuePool limit of size 10 overflow 10 reached,
# connection timed out, timeout 30.00"; asyncpg's own timeouts name TimeoutError.
POOL_TIMEOUT = re.compile(r"QueuePool limit|connection timed out|TimeoutError", re.IGNORECASE)
GIB = 1024**3


@dataclass
class Row:
    engine: str
    mode: str  # concurrent | sequential | pool | raw | beside-forget
    sessions: int
    turns: int
    max_tokens: int
    wall_s: float = 0.0
    decoded: int = 0
    ok: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    non_2xx: int = 0
    server_5xx: int = 0
    transport_errors: list[str] = field(default_factory=list)
    pool_timeouts: int = 0
    log_errors: int = 0
    peak_rss_mib: float = 0.0
    generator_cpu_s: float = 0.0

    @property
    def sent(self) -> int:
        return self.ok + self.non_2xx + len(self.transport_errors)

    def pct(self, q: int) -> float | None:
        values = self.latencies_ms
        if len(values) < 2:
            return values[0] if values else None
        return statistics.quantiles(values, n=100, method="inclusive")[q - 1]

    def summary(self) -> dict[str, Any]:
        rate = self.decoded / self.wall_s if self.wall_s else 0.0
        return {**asdict(self), "sent": self.sent, "tokens_per_s": rate, "p50_ms": self.pct(50), "p99_ms": self.pct(99)}


def cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tree_rss_mib(root: psutil.Process) -> float:
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total / 1024**2


async def sample_rss(root: psutil.Process, row: Row) -> None:
    """The RSS of `root`'s process tree every half second, its peak in `row`, until cancelled."""
    while True:
        row.peak_rss_mib = max(row.peak_rss_mib, tree_rss_mib(root))
        await asyncio.sleep(0.5)


def client(base: str, connections: int, timeout_s: float) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    return httpx.AsyncClient(base_url=base, headers=headers, limits=limits, timeout=timeout_s)


def sampling(max_tokens: int) -> dict[str, Any]:
    return {"temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens, "seed": 0}


async def create(c: httpx.AsyncClient, n: int, max_tokens: int) -> list[str]:
    ids = []
    for _ in range(n):
        r = await c.post("/v1/sessions", json={"system_prompt": SYSTEM, "sampling": sampling(max_tokens)})
        r.raise_for_status()
        ids.append(str(r.json()["id"]))
    return ids


def live_prompt(words: int) -> str:
    """The live turns' message: PROMPT, after `words` words of a document the user pastes (an agent's tool output)."""
    if not words:
        return PROMPT
    document = " ".join(f"Line {i}: the harbour log notes wind, tide and {i % 7 + 2} boats." for i in range(words))
    return " ".join(document.split()[:words]) + "\n\n" + PROMPT


async def turn(c: httpx.AsyncClient, session_id: str, row: Row, prompt: str = PROMPT) -> None:
    start = time.perf_counter()
    try:
        r = await c.post(f"/v1/sessions/{session_id}/turns", json={"inputs": [{"type": "user", "content": prompt}]})
    except httpx.TransportError as exc:  # a timeout included
        row.transport_errors.append(f"{session_id}: {type(exc).__name__} {exc}"[:300])
        return
    row.latencies_ms.append((time.perf_counter() - start) * 1000)
    row.statuses[str(r.status_code)] = row.statuses.get(str(r.status_code), 0) + 1
    if r.is_success:
        row.ok += 1
        row.decoded += int(r.json()["usage"]["decode_tokens"])
    else:
        row.non_2xx += 1
        row.server_5xx += r.status_code >= 500


async def streamed_turn(
    c: httpx.AsyncClient, session_id: str, row: Row, stamps: list[float], prompt: str = PROMPT
) -> None:
    """`turn`, streamed: the arrival time of each `delta` event goes to `stamps` (live progress beside a forget)."""
    start = time.perf_counter()
    body = {"inputs": [{"type": "user", "content": prompt}], "stream": True}
    name, final, failed = "", None, None
    try:
        async with c.stream("POST", f"/v1/sessions/{session_id}/turns", json=body) as r:
            status = r.status_code
            async for line in r.aiter_lines():
                if line.startswith("event:"):
                    name = line.removeprefix("event:").strip()
                elif line.startswith("data:") and name == "delta":
                    stamps.append(time.perf_counter())
                elif line.startswith("data:") and name == "turn":
                    final = json.loads(line.removeprefix("data:"))
                elif line.startswith("data:") and name == "error":
                    failed = json.loads(line.removeprefix("data:"))
    except httpx.TransportError as exc:  # a timeout included
        row.transport_errors.append(f"{session_id}: {type(exc).__name__} {exc}"[:300])
        return
    row.latencies_ms.append((time.perf_counter() - start) * 1000)
    if failed is not None:  # the stream started (200), then the turn failed
        status = int(failed.get("status", 500))
    row.statuses[str(status)] = row.statuses.get(str(status), 0) + 1
    if final is not None and failed is None:
        row.ok += 1
        row.decoded += int(final["usage"]["decode_tokens"])
    else:
        row.non_2xx += 1
        row.server_5xx += status >= 500


def progress_during(stamps: list[float], start: float, end: float) -> dict[str, Any]:
    """Live replies' progress inside [start, end]: how many deltas arrived, and the longest stretch with none."""
    inside = sorted(t for t in stamps if start <= t <= end)
    edges = [start, *inside, end]
    return {"deltas": len(inside), "longest_stall_s": max(b - a for a, b in itertools.pairwise(edges))}


def scan_log(server: LetheServer, offset: int, row: Row) -> None:
    """Counts the server log's connection-pool timeouts and error lines written since `offset`."""
    with server.log.open("rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()
    row.pool_timeouts += sum(bool(POOL_TIMEOUT.search(line)) for line in lines)
    row.log_errors += sum('"level": "error"' in line or "Traceback" in line for line in lines)


async def measure(server: LetheServer, row: Row, timeout_s: float, prompt: str = PROMPT) -> Row:
    """`row.sessions` fresh sessions run `row.turns` turns each: all at once, or one turn after another."""
    async with client(server.url, row.sessions + 1, timeout_s) as c:
        ids = await create(c, row.sessions, row.max_tokens)

        async def session(session_id: str) -> None:
            for _ in range(row.turns):
                await turn(c, session_id, row, prompt)

        offset = server.log.stat().st_size
        cpu = cpu_self()
        start = time.perf_counter()
        sampler = asyncio.create_task(sample_rss(psutil.Process(server.proc.pid), row))
        if row.mode == "sequential":
            for session_id in ids:
                await session(session_id)
        else:
            await asyncio.gather(*(session(s) for s in ids))
        row.wall_s = time.perf_counter() - start
        sampler.cancel()
        row.generator_cpu_s = cpu_self() - cpu
    scan_log(server, offset, row)
    return row


async def forget_beside(
    server: LetheServer, engine: str, n: int, max_tokens: int, timeout_s: float, repeats: int = 1,
    prompt: str = PROMPT,
) -> dict[str, Any]:
    """The same forget on an idle server and beside `n` sessions generating turns until it ends, `repeats` times in
    alternation (idle, beside, idle, beside...): one pair is at the mercy of a shared machine's noise, the median of
    the pairs' ratios much less."""
    messages = [CLEAN[0], TARGET, CLEAN[1]]
    headers = {"Authorization": f"Bearer {API_KEY}"}

    def forget_one(artifact_id: str) -> tuple[dict[str, Any], float]:
        with httpx.Client(base_url=server.url, headers=headers, timeout=timeout_s) as sync:
            return forget(sync, artifact_id, "selective_replay", timeout_s)

    def build() -> list[tuple[str, str]]:
        with httpx.Client(base_url=server.url, headers=headers, timeout=timeout_s) as sync:
            return [build_session(sync, messages, sampling(max_tokens)) for _ in range(1 + 2 * repeats)]

    def counterfactual() -> list[Any]:
        """The session that never saw the target: its transition 2 is empty, as the forget leaves it."""
        with httpx.Client(base_url=server.url, headers=headers, timeout=timeout_s) as sync:
            r = sync.post("/v1/sessions", json={"system_prompt": FORGET_SYSTEM, "sampling": sampling(max_tokens)})
            r.raise_for_status()
            sid = r.json()["id"]
            for body in ({"inputs": [{"type": "user", "content": CLEAN[0]}]}, {"inputs": [], "generate": False},
                         {"inputs": [{"type": "user", "content": CLEAN[1]}]}):
                sync.post(f"/v1/sessions/{sid}/turns", json=body).raise_for_status()
            return shape(sync, sid)

    def shape_of(session_id: str) -> list[Any]:
        with httpx.Client(base_url=server.url, headers=headers, timeout=timeout_s) as sync:
            return shape(sync, session_id)

    (_, warm_target), *pairs = await asyncio.to_thread(build)
    # The server's first forget pays one-time costs (first use of the forget path's code and statements): not the idle
    # figure the others are compared with.
    _, first_s = await asyncio.to_thread(forget_one, warm_target)
    row = Row(engine, "beside-forget", n, 0, max_tokens)
    rounds: list[dict[str, Any]] = []
    async with client(server.url, n + 1, timeout_s) as c:
        ids = await create(c, n, max_tokens)
        start = time.perf_counter()
        offset = server.log.stat().st_size
        for (idle_session, idle_target), (busy_session, busy_target) in zip(pairs[0::2], pairs[1::2], strict=True):
            idle_job, idle_s = await asyncio.to_thread(forget_one, idle_target)
            done = asyncio.Event()
            stamps: list[float] = []

            async def generate(session_id: str, done: asyncio.Event = done, stamps: list[float] = stamps) -> None:
                await streamed_turn(c, session_id, row, stamps, prompt)
                while not done.is_set():
                    await streamed_turn(c, session_id, row, stamps, prompt)

            tasks = [asyncio.create_task(generate(s)) for s in ids]
            await asyncio.sleep(1.0)  # the sessions' first turns are in flight
            try:
                forget_start = time.perf_counter()
                busy_job, busy_s = await asyncio.to_thread(forget_one, busy_target)
                forget_end = time.perf_counter()
                await asyncio.sleep(busy_s)  # as long a window after it, the sessions still generating
            finally:
                done.set()
                await asyncio.gather(*tasks)
            rounds.append({
                "idle_session": idle_session, "busy_session": busy_session,
                "idle_s": idle_s, "busy_s": busy_s, "busy_over_idle": busy_s / idle_s,
                "idle_duration_ms": idle_job.get("duration_ms"), "busy_duration_ms": busy_job.get("duration_ms"),
                "live_during_forget": progress_during(stamps, forget_start, forget_end),
                "live_after_forget": progress_during(stamps, forget_end, forget_end + busy_s),
            })
        row.wall_s = time.perf_counter() - start
        row.turns = row.sent
    scan_log(server, offset, row)
    reference = await asyncio.to_thread(counterfactual)
    for r in rounds:
        r["idle_equal"] = await asyncio.to_thread(shape_of, r.pop("idle_session")) == reference
        r["busy_equal"] = await asyncio.to_thread(shape_of, r.pop("busy_session")) == reference
    typical = sorted(rounds, key=lambda r: r["busy_over_idle"])[len(rounds) // 2]  # the median ratio's round
    ratios = sorted(r["busy_over_idle"] for r in rounds)
    return {
        "rounds": rounds, "first_s": first_s,
        "idle_s": statistics.median(r["idle_s"] for r in rounds),
        "busy_s": statistics.median(r["busy_s"] for r in rounds),
        "busy_over_idle": statistics.median(ratios), "ratios": ratios,
        "idle_equal": all(r["idle_equal"] for r in rounds), "busy_equal": all(r["busy_equal"] for r in rounds),
        "beside": row.summary(), "beside_all_ok": row.ok == row.sent and row.sent > 0,
        "idle_duration_ms": typical["idle_duration_ms"], "busy_duration_ms": typical["busy_duration_ms"],
        "live_during_forget": typical["live_during_forget"], "live_after_forget": typical["live_after_forget"],
    }


async def run_engine(server: LetheServer, engine: str, args: argparse.Namespace) -> dict[str, Any]:
    t, prompt = args.timeout, live_prompt(args.live_words)
    await measure(server, Row(engine, "warmup", 1, 1, args.max_tokens), t)  # first-turn costs, not reported
    plan = [("concurrent", n) for n in args.sessions] + [("sequential", n) for n in args.sequential]
    rows = [await measure(server, Row(engine, mode, n, args.turns, args.max_tokens), t, prompt) for mode, n in plan]
    if args.pool:
        rows.append(await measure(server, Row(engine, "pool", args.pool, 1, args.pool_max_tokens), t))
    result: dict[str, Any] = {"engine": engine, "startup_s": server.startup_s, "rows": [r.summary() for r in rows]}
    if args.forget_beside:
        try:
            result["forget"] = await forget_beside(
                server, engine, args.forget_beside, args.max_tokens, t, args.forget_repeats, prompt
            )
        except (JobFailed, RuntimeError, httpx.HTTPError) as exc:
            result["forget"] = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
    return result


def serve_engine(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    """One server on `engine`, measured, stopped; then waits for its process tree (a vLLM engine core) to be gone.
    `engine` is a kind (hf, vllm) or a kind with settings of its own, `vllm+LETHE_VLLM_LIVE_STEP_TOKENS=0`: its rows
    carry that whole name, so two configurations of one engine compare in one run."""
    available = psutil.virtual_memory().available / GIB
    kind, *own = engine.split("+")
    env = dict(kv.split("=", 1) for kv in [*args.server_env, *own])
    tree: list[psutil.Process] = []
    try:
        with serving(ready_s=args.ready_timeout, LETHE_ENGINE=kind, LETHE_BOOTSTRAP_API_KEY=API_KEY, **env) as server:
            root = psutil.Process(server.proc.pid)
            tree = [root, *root.children(recursive=True)]
            result = asyncio.run(run_engine(server, engine, args))
            result["server_log_tail"] = server.log_tail(1500) if result.get("forget", {}).get("error") else ""
    except (RuntimeError, httpx.HTTPError) as exc:
        result = {"engine": engine, "error": f"{type(exc).__name__}: {exc}"[:3000], "rows": []}
    _, alive = psutil.wait_procs(tree, timeout=60)
    result.update(mem_available_before_gib=available, leftover_pids=[p.pid for p in alive])
    return result


def raw_vllm(sessions: list[int], turns: int, max_tokens: int) -> dict[str, Any]:
    """The same conversations on vLLM's offline `LLM`, N prompts batched per turn (see the module docstring)."""
    os.environ.update({"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_LOGGING_LEVEL": "WARNING"})
    from vllm import LLM, SamplingParams

    from app.engine.chat import load_chat_template
    from app.engine.model_store import resolve_model
    from app.engine.vllm_local import DEFAULT_KV_CACHE_BYTES

    available = psutil.virtual_memory().available / GIB
    path = resolve_model(None, MODEL_CACHE).path
    chat, _ = load_chat_template(path)
    startup_s = time.perf_counter()
    llm = LLM(
        model=str(path), dtype="float32", enforce_eager=True, kv_cache_memory_bytes=DEFAULT_KV_CACHE_BYTES,
        max_num_seqs=max(sessions), enable_prefix_caching=True, seed=0, disable_log_stats=True,
    )
    startup_s = time.perf_counter() - startup_s
    params = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=max_tokens, seed=0, skip_special_tokens=False,
                            stop_token_ids=sorted(chat.stop_token_ids))  # as the engine's, without stop strings
    ask = [*chat.render_block("user", PROMPT), *chat.assistant_header()]
    warm: Any = [{"prompt_token_ids": chat.render_block("system", "warm up") + ask}]
    llm.generate(warm, params, use_tqdm=False)
    rows = []
    for n in sessions:
        row = Row("vllm", "raw", n, turns, max_tokens)
        run = uuid.uuid4().hex
        logs = [[*chat.render_block("system", SYSTEM), *ask] for _ in range(n)]
        start = time.perf_counter()
        for _ in range(turns):
            batch_start = time.perf_counter()
            prompts: Any = [{"prompt_token_ids": log, "cache_salt": f"raw-{run}-{i}"} for i, log in enumerate(logs)]
            outputs = llm.generate(prompts, params, use_tqdm=False)
            batch_ms = (time.perf_counter() - batch_start) * 1000
            for log, output in zip(logs, outputs, strict=True):
                sampled = list(output.outputs[0].token_ids)
                row.decoded += len(sampled)  # a stop token included, as Lethe's decode_tokens counts it
                row.ok += 1
                row.latencies_ms.append(batch_ms)
                if sampled and sampled[-1] in chat.stop_token_ids:
                    sampled.pop()
                log += [*sampled, *chat.end_of_turn(), *ask]
        row.wall_s = time.perf_counter() - start
        row.peak_rss_mib = tree_rss_mib(psutil.Process())  # after the run: this process and its engine core
        rows.append(row.summary())
    with contextlib.suppress(Exception):  # the engine core process; it would also go when this one exits
        llm.llm_engine.engine_core.shutdown()
    return {"engine": "raw-vllm", "startup_s": startup_s, "mem_available_before_gib": available, "rows": rows}


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"sessions bench: turns {args.turns}, max_tokens {args.max_tokens} (greedy), {os.cpu_count()} cores, load "
        f"average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", "",
        "| engine | mode | N | turns ok/sent | decoded | wall s | tokens/s | p50 ms | p99 ms | non-2xx | 5xx | "
        "transport errors | pool timeouts (log) | error lines (log) | peak RSS MiB | generator CPU s |",
        "|" + " --- |" * 16,
    ]
    rows: dict[tuple[str, str, int], dict[str, Any]] = {}
    for result in results:
        if result.get("error"):
            lines.append(f"| {result['engine']} | FAILED: {result['error'][:300]!r} |" + " |" * 14)
        for r in result["rows"]:
            rows[(r["engine"], r["mode"], r["sessions"])] = r
            lines.append(
                f"| {r['engine']} | {r['mode']} | {r['sessions']} | {r['ok']}/{r['sent']} | {r['decoded']} | "
                f"{fmt(r['wall_s'], 2)} | {fmt(r['tokens_per_s'])} | {fmt(r['p50_ms'], 0)} | {fmt(r['p99_ms'], 0)} | "
                f"{r['non_2xx']} | {r['server_5xx']} | {len(r['transport_errors'])} | {r['pool_timeouts']} | "
                f"{r['log_errors']} | {fmt(r['peak_rss_mib'], 0)} | {fmt(r['generator_cpu_s'], 2)} |"
            )
    lines.append("")
    for (engine, mode, n), r in rows.items():
        seq = rows.get((engine, "sequential", n))
        if mode == "concurrent" and seq and seq["tokens_per_s"]:
            lines.append(f"- {engine}, N = {n}: all at once / sequential {r['tokens_per_s'] / seq['tokens_per_s']:.2f}")
        raw = rows.get(("vllm", "raw", n))
        if engine == "vllm" and mode == "concurrent" and raw and raw["tokens_per_s"]:
            lines.append(f"- vllm, N = {n}: Lethe / raw vLLM = {r['tokens_per_s'] / raw['tokens_per_s']:.3f}")
    for result in results:
        left = f"; processes left after stop: {result['leftover_pids']}" if result.get("leftover_pids") else ""
        lines.append(f"- {result['engine']}: started in {fmt(result.get('startup_s'))} s, "
                     f"{fmt(result.get('mem_available_before_gib'))} GiB available before{left}")
        f = result.get("forget")
        if f and "error" in f:
            lines.append(f"- {result['engine']} forget beside sessions FAILED: {f['error'][:300]}")
        elif f:
            b = f["beside"]
            many = len(f.get("rounds", [])) > 1
            ratios = ", ".join(f"{x:.2f}" for x in f.get("ratios", []))
            lines.append(
                f"- {result['engine']} forget: idle {f['idle_s']:.2f} s (job {f['idle_duration_ms']} ms; the server's "
                f"first forget, not compared: {f['first_s']:.2f} s), beside "
                f"{b['sessions']} generating sessions {f['busy_s']:.2f} s (job {f['busy_duration_ms']} ms), "
                f"{f['busy_over_idle']:.2f} x idle"
                + (f" (medians of {len(f['rounds'])} alternating pairs; the pairs' ratios: {ratios})" if many else "")
                + f"; their turns {b['ok']}/{b['sent']} ok, {b['server_5xx']} 5xx, "
                f"{len(b['transport_errors'])} transport errors: "
                f"{'all succeeded' if f['beside_all_ok'] else 'FAILED'}; "
                f"forgotten sessions equal to the counterfactual: idle {f['idle_equal']}, beside {f['busy_equal']}"
            )
            during, after = f["live_during_forget"], f["live_after_forget"]
            lines.append(
                f"- {result['engine']} live replies while the forget ran: {during['deltas']} streamed deltas, longest "
                f"stretch without one {during['longest_stall_s']:.2f} s (in as long a window just after it: "
                f"{after['deltas']} deltas, longest stretch {after['longest_stall_s']:.2f} s)"
            )
    return "\n".join(lines) + "\n"


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="hf,vllm",
                        help="comma-separated, one server each in turn: hf,vllm; vllm+KEY=VALUE adds a setting")
    parser.add_argument("--sessions", type=ints, default=[1, 4, 8, 16], help="N sessions at once, comma-separated")
    parser.add_argument("--turns", type=int, default=2, help="turns per session")
    parser.add_argument("--max-tokens", type=int, default=64, help="reply cap per turn (greedy)")
    parser.add_argument("--sequential", type=ints, default=[4, 8], help="N for the one-after-another baseline")
    parser.add_argument("--pool", type=int, default=0, help="also this many sessions at once, one turn each")
    parser.add_argument("--pool-max-tokens", type=int, default=8)
    parser.add_argument("--forget-beside", type=int, default=0, help="time a forget beside this many sessions")
    parser.add_argument("--forget-repeats", type=int, default=1,
                        help="idle/beside forget pairs, in alternation (the figures are their medians)")
    parser.add_argument("--live-words", type=int, default=0,
                        help="the live turns' messages carry this many words of a pasted document first")
    parser.add_argument("--no-raw", action="store_true", help="skip the raw vLLM phase")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per HTTP request or forget job")
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for /readyz")
    parser.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE", help="for lethe serve")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    kinds, own = [e.split("+")[0] for e in engines], [kv for e in engines for kv in e.split("+")[1:]]
    if any(k not in ("hf", "vllm") for k in kinds) or any("=" not in kv for kv in args.server_env + own):
        parser.error("engines are hf and vllm (vllm+KEY=VALUE adds a setting); --server-env takes KEY=VALUE")
    results = [serve_engine(engine, args) for engine in engines]
    if "vllm" in kinds and not args.no_raw:
        if any(r.get("leftover_pids") for r in results):
            results.append({"engine": "raw-vllm", "rows": [], "error": "a server's processes outlived it: skipped"})
        else:
            results.append(raw_vllm(sorted(set(args.sessions)), args.turns, args.max_tokens))
    text = markdown(results, args)
    print("\n" + text)
    if args.json:
        config = {k: v for k, v in vars(args).items() if k != "json"}
        payload = {"command": " ".join(["python -m bench.sessions_bench", *sys.argv[1:]]), "config": config,
                   "cpus": os.cpu_count(), "loadavg": os.getloadavg(), "results": results}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    bad = [row for r in results for row in r["rows"] if row["server_5xx"] or row["transport_errors"]]
    sys.exit(1 if bad or any(r.get("error") for r in results) else 0)


if __name__ == "__main__":
    main()
