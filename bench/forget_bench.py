"""Forget cost against the target's position: selective replay (B7) side by side with a full reset (B5 / B5').

    python -m bench.forget_bench [--taus 1,2,4,6,8,10,12,14,16] [--max-tokens 16] [--engines hf,vllm] [--turns 16]
                                 [--repeats 1]

For each engine in `--engines` (one `lethe serve` each, in turn: embedded PostgreSQL in a temp dir, the converted
model from .lethe/models) and each τ in `--taus`, builds two identical sessions of T = `--turns` transitions (the
same short user messages, the same seed, greedy decoding) whose transition τ is a user message holding a made-up
private fact, then forgets that message in one with `selective_replay` and in the other with `full_reset`, one right
after the other (the order alternates with τ, so neither method always runs on the quieter machine). From each job's
receipt it records the recomputed tokens (prefilled + decoded), the reused ones, the transitions replayed and the
job's `duration_ms`, and it checks that both sessions end with equal artifacts (kind, turn, content, token span): a
selective replay is exact, so on hf they must be equal. Tokens are deterministic; wall times are not (a shared
machine), so each server first runs one throwaway forget per method, `--repeats` pairs per τ give a median, and the
machine's load average is recorded next to each row.

What the full reset measures depends on the engine. On hf it replays every transition on a cold cache: the paper's
B5. On vllm it opens a fresh token list but vLLM's prefix cache still serves the clean prefix before τ (its `reused`
is above 0), so only the suffix is prefilled again, while every reply is decoded again: the paper's B5' ("full reset
over a warm prefix cache"). So that neither method finds the other's replayed suffix in that cache, the two sessions
of a pair live in two tenants, created with `lethe tenant create` (since the cache salt became per session,
app/runtime/salts.py, two sessions share no block anyway; the tenants keep the runs comparable with earlier ones).

Reports, per τ, T - τ + 1 and per method the recomputed tokens and the wall time; the least-squares fit of
recomputed tokens against T - τ + 1 per method and engine, with R²; and the saving (full reset's recomputed tokens
over selective replay's) at early (τ = 1..2), middle (τ = 8) and late (τ = 14..16) τ, and at τ = T - 12 (12
transitions past the target: the paper's 9.3x setting, τ = 4 for T = 16). Writes bench/results/forget_bench.json and
bench/results/forget_bench.md and prints the markdown. An engine whose server does not start is reported and skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from bench.serve import LetheServer, serving

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
API_KEY = "bench-key-" + "0" * 24
SYSTEM = "You are a helpful personal assistant. Answer briefly."
TARGET = "A private note for you: my locker code is 4471-ZQ and my cat is called Brindlewick."
CLEAN = [
    "Hi! Please help me plan my week.", "I like jogging in the morning.", "I work as a nurse on late shifts.",
    "Suggest a time for my runs.", "What should I eat before a late shift?", "And after it?",
    "Give me one tip for sleeping well.", "Summarize the plan in one sentence.", "What day should I rest?",
    "How long should each run be?", "Which shoes should I buy?", "Should I stretch before running?",
    "Recommend a podcast for the runs.", "How much water should I drink?", "Can I run in the rain?",
    "What about running at night?", "Any tip for a rest day?", "How do I track my progress?",
    "Is coffee fine before a shift?", "Thanks, that is all for now.",
]
METHODS = ("selective_replay", "full_reset")
LABELS = {
    "hf": {"selective_replay": "B7", "full_reset": "B5"},
    "hf-decode": {"selective_replay": "B7", "full_reset": "B5"},  # hf with LETHE_REPLAY_VERIFY=0: today's replay
    "vllm": {"selective_replay": "B7", "full_reset": "B5'"},
    "vllm-decode": {"selective_replay": "B7", "full_reset": "B5'"},  # vllm with LETHE_REPLAY_VERIFY=0
    "vllm-remote": {"selective_replay": "B7", "full_reset": "B5'"},  # one `vllm serve` worker (worker_for)
    "vllm-remote-decode": {"selective_replay": "B7", "full_reset": "B5'"},
}
PAST_TARGET = 12  # the paper's setting: sessions run 12 transitions past the target


class JobFailed(RuntimeError):
    """A forget job the server ran and failed: deterministic, so a fresh server would fail it again."""


def tenant_key(server: LetheServer, name: str) -> str:
    """A tenant of its own and its API key, through the CLI on the server's database."""
    done = server.cli("tenant", "create", name, timeout_s=180)
    if done.returncode != 0:
        raise RuntimeError(f"lethe tenant create {name} failed: {done.stderr.strip()[-500:]}")
    return done.stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def worker_for(engine: str, ready_s: float) -> Iterator[dict[str, str]]:
    """For `vllm-remote` (and `vllm-remote-decode`): one `vllm serve` worker (bench.fleet, Lethe's vLLM plugin loaded
    beside it), stopped after the server; the settings that point Lethe at it. Nothing for the other engines."""
    if not engine.startswith("vllm-remote"):
        yield {}
        return
    from app.engine.model_store import resolve_model  # only this engine needs the model's directory
    from bench.fleet import VLLMWorker

    worker = VLLMWorker(resolve_model(None, ROOT / ".lethe" / "models").path,
                        Path(tempfile.mkdtemp(prefix="forget-bench-vllm-")) / "vllm.log")
    try:
        print(f"[{engine}] vllm serve ready after {worker.wait_ready(ready_s):.1f}s", flush=True)
        yield {"LETHE_VLLM_URL": worker.url}
    finally:
        worker.stop()


@contextlib.contextmanager
def serve(engine: str, ready_s: float) -> Iterator[LetheServer]:
    """`lethe serve` on `engine` (`hf-decode`, `vllm-decode`: with LETHE_REPLAY_VERIFY=0) (bench.serve: a temporary data
    directory, stopped and removed on exit); a failure
    while it serves is reported with the server's state and the end of its log."""
    verify = "0" if engine.endswith("-decode") else "1"  # -decode: replays decode every reply again (no verification)
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(worker_for(engine, ready_s))
        env = {"LETHE_ENGINE": engine.removesuffix("-decode"), "LETHE_BOOTSTRAP_API_KEY": API_KEY,
               "LETHE_REPLAY_VERIFY": verify, **fleet}
        server = stack.enter_context(serving(None, ready_s, tree=ROOT, **env))
        try:
            yield server
        except JobFailed:
            raise
        except (httpx.HTTPError, RuntimeError) as exc:
            state = "running" if server.proc.poll() is None else f"exited with {server.proc.returncode}"
            raise RuntimeError(
                f"{type(exc).__name__}: {exc} (lethe serve {state}; its log ends: {server.log_tail(1500)})"
            ) from exc


def script(tau: int, turns: int) -> list[str]:
    """The user message of each transition 1..turns: distinct clean messages, the target at transition tau."""
    clean = [CLEAN[i % len(CLEAN)] + ("" if i < len(CLEAN) else f" (again, #{i})") for i in range(turns - 1)]
    return [*clean[: tau - 1], TARGET, *clean[tau - 1 :]]


def handbook(words: int) -> str:
    """A clean, never-forgotten prefix of about `words` words (a skill card or document loaded at the start, as in
    the paper's sessions, whose clean prefix is what a selective replay reuses and a full reset recomputes)."""
    sentence = "The assistant keeps answers short, checks dates twice and never shares private notes."
    count = max(1, words // len(sentence.split()))
    return "Handbook:\n" + " ".join(f"{i + 1}. {sentence}" for i in range(count))


def build_session(
    client: httpx.Client, messages: list[str], sampling: dict[str, Any], system: str = SYSTEM
) -> tuple[str, str]:
    """Create a session and run the script; returns its id and the target message's artifact id."""
    r = client.post("/v1/sessions", json={"system_prompt": system, "sampling": sampling})
    r.raise_for_status()
    session_id: str = r.json()["id"]
    target = ""
    for k, text in enumerate(messages, start=1):
        r = client.post(f"/v1/sessions/{session_id}/turns", json={"inputs": [{"type": "user", "content": text}]})
        r.raise_for_status()
        body = r.json()
        if body["turn"] != k:
            raise RuntimeError(f"session {session_id}: POST #{k} answered transition {body['turn']}")
        if text == TARGET:
            target = body["inputs"][0]["artifact_id"]
    return session_id, target


def forget(client: httpx.Client, artifact_id: str, strategy: str, timeout_s: float) -> tuple[dict[str, Any], float]:
    """Forget with `wait`; polls past the server's wait when the job answers 202. Returns the job and client seconds."""
    start = time.perf_counter()
    r = client.post("/v1/forget", json={"target": {"artifact_id": artifact_id}, "strategy": strategy, "wait": True})
    r.raise_for_status()
    job: dict[str, Any] = r.json()
    deadline = time.monotonic() + timeout_s
    while job["status"] not in ("succeeded", "failed", "needs_input"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"forget {job['id']} ({strategy}) still {job['status']} after {timeout_s:.0f}s")
        time.sleep(0.2)  # polling the job as a client would
        r = client.get(f"/v1/forget/{job['id']}")
        r.raise_for_status()
        job = r.json()
    seconds = time.perf_counter() - start
    if job["status"] != "succeeded":
        raise JobFailed(f"forget {job['id']} ({strategy}) {job['status']}: {job.get('error')}")
    return job, seconds


def shape(client: httpx.Client, session_id: str) -> list[tuple[str, int, str, list[int]]]:
    """What must be equal between the two forgotten sessions: kind, transition, content and span of each artifact."""
    r = client.get(f"/v1/sessions/{session_id}/artifacts")
    r.raise_for_status()
    return [(a["kind"], a["turn"], a["content"], a["token_span"]) for a in r.json()["artifacts"]]


@dataclass
class Measure:
    recomputed: int
    reused: int
    prefilled: int
    decoded: int  # decode steps' tokens
    full_reset_estimate: int
    transitions_replayed: int
    checkpoint_turn: int | None
    duration_ms: float
    client_ms: float
    tau: int
    T: int
    duration_ms_runs: list[float] = field(default_factory=list)
    tokens_vary: bool = False
    verified: int = 0  # reply tokens accepted from the recorded replies without decoding (LETHE_REPLAY_VERIFY)
    modes: dict[str, str] = field(default_factory=dict)  # per replayed reply: verified, verified+decoded, decoded


@dataclass
class Row:
    engine: str
    tau: int
    T: int
    suffix: int  # T - tau + 1
    first: str
    methods: dict[str, Measure]
    equal: bool
    target_gone: bool
    saving: float  # full reset recomputed / selective replay recomputed
    load_1min: list[float]  # the machine's 1-minute load average as each pair started (2 CPUs: 2.0 is busy)
    first_difference: str | None = None
    server: int = 1  # which server of the run measured it (a later one after a restart)


@dataclass
class EngineRun:
    engine: str
    ok: bool
    error: str | None = None
    errors: list[str] = field(default_factory=list)  # one per server that failed
    startup_s: float = 0.0
    total_s: float = 0.0
    rows: list[Row] = field(default_factory=list)


def ratio(num: float, den: float) -> float:
    return num / den if den else float("inf")


def measure(job: dict[str, Any], client_s: float) -> Measure:
    receipt = job["sessions"][0]
    tokens = receipt["tokens"]
    checkpoint = receipt.get("checkpoint")
    return Measure(
        recomputed=int(tokens["prefilled"] or 0) + int(tokens["decoded"] or 0),
        reused=int(tokens["reused"]),
        prefilled=int(tokens["prefilled"] or 0),
        decoded=int(tokens["decoded"] or 0),
        full_reset_estimate=int(tokens["full_reset_estimate"]),
        transitions_replayed=int(receipt["transitions_replayed"]),
        checkpoint_turn=None if checkpoint is None else int(checkpoint["turn"]),
        duration_ms=float(job["duration_ms"]),
        client_ms=client_s * 1000,
        tau=int(receipt["tau"]),
        T=int(receipt["T"]),
        verified=int(tokens.get("verified") or 0),
        modes=dict(receipt.get("replay_modes") or {}),
    )


def run_engine(
    engine: str, taus: list[int], turns: int, max_tokens: int, seed: int, repeats: int, ready_s: float, restarts: int,
    system: str = SYSTEM,
) -> EngineRun:
    """Every tau on one server; a server that dies or errs mid-run (a shared machine) is replaced by a fresh one, up
    to `restarts` times, which goes on from the first tau not yet measured (each server warms up first)."""
    out = EngineRun(engine, ok=False)
    start = time.monotonic()
    sampling = {"temperature": 0, "max_tokens": max_tokens, "seed": seed}
    for attempt in range(restarts + 1):
        done = {r.tau for r in out.rows}
        todo = [(i, tau) for i, tau in enumerate(taus) if tau not in done]
        try:
            with serve(engine, ready_s) as server:
                out.startup_s = out.startup_s or server.startup_s
                print(f"[{engine}] server {attempt + 1} ready after {server.startup_s:.1f}s", flush=True)
                keys = {m: tenant_key(server, f"bench-{m}") for m in METHODS}
                warm_up(server, sampling)
                with contextlib.ExitStack() as stack:
                    clients = {
                        m: stack.enter_context(
                            httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {k}"}, timeout=600)
                        )
                        for m, k in keys.items()
                    }
                    for i, tau in todo:
                        row = one_tau(engine, clients, tau, turns, sampling, METHODS[i % 2], repeats, system)
                        row.server = attempt + 1
                        out.rows.append(row)
                        sel, full = row.methods["selective_replay"], row.methods["full_reset"]
                        print(
                            f"[{engine}] tau={tau:>2}: selective {sel.recomputed} tok ({sel.decoded} decoded, "
                            f"{sel.verified} verified) {sel.duration_ms:.0f} ms | "
                            f"full_reset {full.recomputed} tok (reused {full.reused}) {full.duration_ms:.0f} ms | "
                            f"saving {row.saving:.2f}x | equal {'yes' if row.equal else 'no'}",
                            flush=True,
                        )
                log_text = server.log.read_text(errors="replace").splitlines()
                errors = [line for line in log_text if '"error"' in line]
                if errors:
                    print(f"[{engine}] server logged {len(errors)} error lines, first: {errors[0][:400]}")
            out.ok = True
            break
        except JobFailed as exc:
            out.errors.append(f"server {attempt + 1}: {type(exc).__name__}: {exc}")
            print(f"[{engine}] {out.errors[-1]} (not retried: a server bug, not a crash)", flush=True)
            break
        except (RuntimeError, httpx.HTTPError, OSError, subprocess.SubprocessError) as exc:
            out.errors.append(f"server {attempt + 1}: {type(exc).__name__}: {exc}")
            print(f"[{engine}] server {attempt + 1} FAILED: {out.errors[-1][:3000]}", flush=True)
    out.error = None if out.ok else out.errors[-1][:3000]
    out.rows.sort(key=lambda r: r.tau)
    out.total_s = time.monotonic() - start
    return out


def warm_up(server: LetheServer, sampling: dict[str, Any]) -> None:
    """One throwaway forget per method on a short session, in a tenant of its own (so nothing of it is in the
    measured tenants' vLLM cache): the first job of a process pays one-off costs that belong to no tau."""
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {tenant_key(server, 'bench-warmup')}"}, timeout=600
    ) as client:
        for m in METHODS:
            _, target = build_session(client, script(2, 4), sampling)
            forget(client, target, m, timeout_s=900)


def one_tau(
    engine: str, clients: dict[str, httpx.Client], tau: int, turns: int, sampling: dict[str, Any], first: str,
    repeats: int, system: str = SYSTEM,
) -> Row:
    """`repeats` pairs of sessions for one tau; the methods alternate who goes first from pair to pair as well."""
    messages = script(tau, turns)
    runs: dict[str, list[Measure]] = {m: [] for m in METHODS}
    equal, gone, diff, load = True, True, None, []
    for k in range(repeats):
        load.append(os.getloadavg()[0])
        built = {m: build_session(clients[m], messages, sampling, system) for m in METHODS}
        lead = first if k % 2 == 0 else next(m for m in METHODS if m != first)
        for m in [lead, *(m for m in METHODS if m != lead)]:
            job, seconds = forget(clients[m], built[m][1], m, timeout_s=900)
            runs[m].append(measure(job, seconds))
        a, b = (shape(clients[m], built[m][0]) for m in METHODS)
        if a != b and diff is None:
            at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            diff = f"pair {k}, artifact {at}: {a[at] if at < len(a) else None!r} vs {b[at] if at < len(b) else None!r}"
        equal = equal and a == b
        gone = gone and not any("4471-ZQ" in content for sh in (a, b) for _, _, content, _ in sh)
    measures = {m: combine(runs[m]) for m in METHODS}
    saving = ratio(measures["full_reset"].recomputed, measures["selective_replay"].recomputed)
    return Row(engine, tau, turns, turns - tau + 1, first, measures, equal, gone, saving, load, diff and diff[:400])


def combine(runs: list[Measure]) -> Measure:
    """One method's repeats at one tau: the first's tokens (greedy: every repeat recomputes the same, checked in
    `tokens_vary`), the median wall time, and every repeat's wall time."""
    out = replace(runs[0])
    out.duration_ms = statistics.median(r.duration_ms for r in runs)
    out.client_ms = statistics.median(r.client_ms for r in runs)
    out.duration_ms_runs = [r.duration_ms for r in runs]
    out.tokens_vary = len({(r.recomputed, r.reused) for r in runs}) > 1
    return out


def fit(xs: list[float], ys: list[float]) -> dict[str, float]:
    """Least squares y = intercept + slope·x, with R² (nan when y does not vary or there are fewer than 2 points)."""
    n = len(xs)
    if n < 2:
        return {"slope": float("nan"), "intercept": float("nan"), "r2": float("nan"), "n": n}
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx if sxx else float("nan")
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    r2 = 1 - ss_res / ss_tot if ss_tot else float("nan")
    return {"slope": slope, "intercept": intercept, "r2": r2, "n": n}


def summarize(run: EngineRun, turns: int) -> dict[str, Any]:
    rows = run.rows
    fits = {}
    for m in METHODS:
        xs = [float(r.suffix) for r in rows]
        fits[m] = {
            "tokens": fit(xs, [float(r.methods[m].recomputed) for r in rows]),
            "wall_ms": fit(xs, [r.methods[m].duration_ms for r in rows]),
        }
    late = {turns - 2, turns - 1, turns}
    groups = {
        "early": {1, 2}, "middle": {turns // 2}, f"tau={turns - PAST_TARGET}": {turns - PAST_TARGET}, "late": late
    }
    savings: dict[str, Any] = {}
    for name, taus in groups.items():
        chosen = [r for r in rows if r.tau in taus]
        if not chosen:
            savings[name] = None
            continue
        full = sum(r.methods["full_reset"].recomputed for r in chosen)
        sel = sum(r.methods["selective_replay"].recomputed for r in chosen)
        full_ms = sum(r.methods["full_reset"].duration_ms for r in chosen)
        sel_ms = sum(r.methods["selective_replay"].duration_ms for r in chosen)
        est = sum(r.methods["selective_replay"].full_reset_estimate for r in chosen)
        savings[name] = {
            "taus": [r.tau for r in chosen],
            "tokens": ratio(full, sel),
            "wall": ratio(full_ms, sel_ms),
            "vs_cold_estimate": ratio(est, sel),
            "full_reset_tokens": full,
            "selective_tokens": sel,
        }
    return {"fits": fits, "savings": savings}


def finite(value: Any) -> Any:
    """The payload with inf / nan as null, so the JSON file is standard JSON."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def fmt(x: float | None, spec: str = ".2f") -> str:
    if x is None or x != x:  # None or nan
        return "n/a"
    return format(x, spec)


def markdown(runs: list[EngineRun], summaries: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"# Forget cost against the target's position (T = {args.turns}, max_tokens = {args.max_tokens}, "
        f"clean handbook prefix of {args.handbook_words} words)",
        "",
        "Recomputed = prefilled + decoded tokens of the forget job; ms = the job's `duration_ms`. B7 = selective "
        "replay; B5 = full reset on a cold cache (hf); B5' = full reset over vLLM's warm prefix cache. "
        "Saving = full reset recomputed / B7 recomputed. Equal = both sessions' artifacts equal after the forgets. "
        f"Load = the 1-minute load average as the pair started ({os.cpu_count()} CPUs). "
        f"{args.repeats} pair(s) per τ; ms is the median.",
        "",
    ]
    for run in runs:
        if not run.ok:
            lines.append(f"- **{run.engine}: failed** after {run.total_s:.0f} s ({len(run.rows)} τ measured)")
        else:
            lines.append(f"- {run.engine}: server ready in {run.startup_s:.0f} s, whole run {run.total_s:.0f} s")
        for error in run.errors:
            lines.append(f"  - {run.engine} {error[:600]}".replace("\n", " "))
    lines += [
        "",
        "| τ | T-τ+1 | engine | B7 recomputed | B7 decoded | B7 verified | B7 reused | B7 ms | B7 replayed "
        "| full reset | recomputed | decoded | verified | reused | ms | replayed | saving | equal | load |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    rows = sorted((r for run in runs for r in run.rows), key=lambda r: (r.tau, r.engine))
    for r in rows:
        sel, full = r.methods["selective_replay"], r.methods["full_reset"]
        lines.append(
            f"| {r.tau} | {r.suffix} | {r.engine} | {sel.recomputed} | {sel.decoded} | {sel.verified} | {sel.reused} | "
            f"{sel.duration_ms:.0f} | {sel.transitions_replayed} | {LABELS[r.engine]['full_reset']} | "
            f"{full.recomputed} | {full.decoded} | {full.verified} | {full.reused} | "
            f"{full.duration_ms:.0f} | {full.transitions_replayed} | {r.saving:.2f}x | {'yes' if r.equal else 'no'} | "
            f"{max(r.load_1min):.1f} |"
        )
    lines += [
        "",
        "Least-squares fit of recomputed tokens (and of wall ms) against T - τ + 1:",
        "",
        "| engine | method | tokens slope | tokens intercept | tokens R² | ms slope | ms intercept | ms R² |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        if run.engine not in summaries:
            continue
        for m in METHODS:
            t, w = summaries[run.engine]["fits"][m]["tokens"], summaries[run.engine]["fits"][m]["wall_ms"]
            lines.append(
                f"| {run.engine} | {LABELS[run.engine][m]} {m} | {fmt(t['slope'])} | {fmt(t['intercept'], '.1f')} | "
                f"{fmt(t['r2'], '.4f')} | {fmt(w['slope'], '.1f')} | {fmt(w['intercept'], '.0f')} | "
                f"{fmt(w['r2'], '.4f')} |"
            )
    lines += [
        "",
        "Savings (summed over the τ of each group): tokens = full reset recomputed / B7 recomputed; wall = full "
        "reset ms / B7 ms; vs cold = the receipt's `full_reset_estimate` (a cold full reset) / B7 recomputed.",
        "",
        "| engine | group | τ run | tokens | wall | vs cold estimate | full reset tok | B7 tok |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        if run.engine not in summaries:
            continue
        for name, s in summaries[run.engine]["savings"].items():
            if s is None:
                lines.append(f"| {run.engine} | {name} | (not run) | | | | | |")
                continue
            lines.append(
                f"| {run.engine} | {name} | {','.join(map(str, s['taus']))} | {fmt(s['tokens'])}x | "
                f"{fmt(s['wall'])}x | {fmt(s['vs_cold_estimate'])}x | {s['full_reset_tokens']} | "
                f"{s['selective_tokens']} |"
            )
    unequal = [r for r in rows if not r.equal]
    leaked = [r for r in rows if not r.target_gone]
    lines.append("")
    for r in unequal:
        lines.append(f"- unequal: {r.engine} τ={r.tau}: {r.first_difference}")
    for r in rows:
        if any(m.tokens_vary for m in r.methods.values()):
            lines.append(f"- recomputed tokens varied between repeats: {r.engine} τ={r.tau}")
    for r in leaked:
        lines.append(f"- the target's text is still in a session: {r.engine} τ={r.tau}")
    if not unequal and not leaked:
        lines.append("- every pair of sessions ended equal, and neither holds the target's text")
    lines.append(f"- {platform.node()}: {os.cpu_count()} CPUs; `{' '.join(args.argv)}`")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--taus", default="1,2,4,6,8,10,12,14,16", help="comma-separated target positions")
    parser.add_argument("--turns", type=int, default=16, help="T: transitions per session")
    parser.add_argument("--max-tokens", type=int, default=16, help="reply length cap (greedy decoding)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=1, help="pairs of sessions per tau; wall time is the median")
    parser.add_argument("--engine", choices=["hf", "vllm"], default=None, help="one engine (same as --engines X)")
    parser.add_argument("--engines", default="hf", help="comma-separated, run one after the other: hf,vllm")
    parser.add_argument("--restarts", type=int, default=2, help="fresh servers allowed after one dies mid-run")
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for /readyz")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where forget_bench.json / .md go")
    parser.add_argument(
        "--handbook-words", type=int, default=0,
        help="a clean prefix of about this many words in the system prompt (the paper's sessions start long)",
    )
    args = parser.parse_args()
    args.argv = ["python -m bench.forget_bench", *sys.argv[1:]]
    taus = [int(t) for t in args.taus.split(",") if t.strip()]
    if any(not 1 <= t <= args.turns for t in taus):
        parser.error(f"every τ must be within 1..{args.turns}")
    engines = [args.engine] if args.engine else [e.strip() for e in args.engines.split(",") if e.strip()]
    if any(e not in LABELS for e in engines):
        parser.error(f"engines are {', '.join(LABELS)}")

    runs = [
        run_engine(
            e, taus, args.turns, args.max_tokens, args.seed, args.repeats, args.ready_timeout, args.restarts,
            SYSTEM + ("\n" + handbook(args.handbook_words) if args.handbook_words else ""),
        )
        for e in engines
    ]
    summaries = {run.engine: summarize(run, args.turns) for run in runs if run.rows}
    text = markdown(runs, summaries, args)
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {
        "config": {
            "taus": taus, "T": args.turns, "max_tokens": args.max_tokens, "seed": args.seed, "repeats": args.repeats,
            "engines": engines, "command": " ".join(args.argv), "cpus": os.cpu_count(),
            "handbook_words": args.handbook_words,
        },
        "runs": [asdict(run) for run in runs],
        "summary": summaries,
    }
    (args.out / "forget_bench.json").write_text(json.dumps(finite(payload), indent=2, default=str) + "\n")
    (args.out / "forget_bench.md").write_text(text)
    print()
    print(text)
    if any(not run.ok for run in runs) and not any(run.ok for run in runs):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
