"""Turn latency with session content sealed at rest against the tree before sealing, side by side in one run.

`python -m bench.sealing_turns [--baseline-commit be86ddb] [--rounds 2] [--sessions 4] [--turns 12] [--max-tokens 8]`

Sealed is this checkout's code, clear an older commit's (`be86ddb`, the tree just before sealing), served from a
`git worktree` of it (bench/memory_sealing.py's `worktree`, made once under the temp directory and reused) with
this interpreter. Each tree has its own data directory and embedded PostgreSQL, and the same settings: the hf engine
with the default tiny model (SmolLM2-135M-Instruct), `LETHE_HF_THREADS=1`, one HTTP worker. Rounds alternate
sealed, clear, sealed, clear (`--rounds` pairs), each on a server started for it, so a machine whose load drifts
weighs on both alike. A round first pays the server's one-time costs untimed (one full-policy and one
retrieval-policy turn: the model and the embedder loaded), then runs the script one turn at a time: `--sessions`
full-policy sessions and one retrieval-policy session (top 5), `--turns` user messages each, greedy (temperature 0,
seed 0), `--max-tokens` tokens per reply. Printed per tree: p50 and mean turn latency over every round, each
round's p50 and mean (their spread is the noise to read the ratio against), the server's CPU per turn (lethe serve
and PostgreSQL, which a shared machine disturbs less than wall time), then sealed / clear ratios against the issue's
goal (sealing costs at most 2 % of a turn). Replies must be the same in both trees (greedy, same model): counted.
Then (unless `--no-in-process`; alone with `--in-process-only`) the same script once in this process through
`SessionService.turn` (no HTTP, the hf engine on its default threads) with a stopwatch around the Sealer's calls:
the time per turn spent in leaf reservations, AES-GCM seals and opens, and key derivation.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Hashable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import psutil

from app.keys.content import Sealer
from app.keys.envelope import Binding
from bench.memory_bench import API_KEY, cpu_by_pid, cpu_used, postmaster
from bench.memory_sealing import _git, worktree
from bench.runtime_overhead import SCRIPT, SYSTEM
from bench.serve import MODEL_CACHE, ROOT, serving, stop_postgres

T = TypeVar("T")
GOAL = 0.02  # issue 42: sealing may cost at most 2 % of a turn


@dataclass
class Tree:
    label: str
    path: Path
    commit: str
    data_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="lethe-sealturns-")))
    latency_ms: list[float] = field(default_factory=list)  # every timed turn, every round
    rounds: list[list[float]] = field(default_factory=list)
    cpu_s: float = 0.0
    replies: list[list[str]] = field(default_factory=list)  # each round's replies, in script order
    errors: list[str] = field(default_factory=list)


def _session(c: httpx.Client, max_tokens: int, policy: str) -> str:
    body: dict[str, object] = {
        "system_prompt": SYSTEM, "context_policy": policy,
        "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens, "seed": 0},
    }
    if policy == "retrieval":
        body["retrieval"] = {"top_k": 5, "min_similarity": -1.0}
    r = c.post("/v1/sessions", json=body)
    r.raise_for_status()
    return str(r.json()["id"])


def _turn(c: httpx.Client, session_id: str, text: str) -> tuple[float, str]:
    start = time.perf_counter()
    r = c.post(f"/v1/sessions/{session_id}/turns", json={"inputs": [{"type": "user", "content": text}]})
    elapsed = (time.perf_counter() - start) * 1000
    r.raise_for_status()
    return elapsed, str(r.json()["reply"]["content"])


def _round(tree: Tree, sessions: int, turns: int, max_tokens: int) -> None:
    with serving(tree.data_dir, tree=tree.path, LETHE_BOOTSTRAP_API_KEY=API_KEY, LETHE_ENGINE="hf",
                 LETHE_HF_THREADS="1", LETHE_HTTP_WORKERS="1") as lethe, httpx.Client(
        base_url=lethe.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
    ) as c:
        for policy in ("full", "retrieval"):  # untimed: model, embedder and first-use costs
            _turn(c, _session(c, max_tokens, policy), SCRIPT[0])
        roots = [psutil.Process(lethe.proc.pid), postmaster(tree.data_dir)]
        before = [cpu_by_pid(root) for root in roots]
        ids = [_session(c, max_tokens, "full") for _ in range(sessions)] + [_session(c, max_tokens, "retrieval")]
        latency, replies = [], []
        for session_id in ids:
            for text in SCRIPT[:turns]:
                ms, reply = _turn(c, session_id, text)
                latency.append(ms)
                replies.append(reply)
        tree.cpu_s += sum(cpu_used(root, b) for root, b in zip(roots, before, strict=True))
        tree.errors += [line for line in lethe.log.read_text().splitlines() if '"level": "error"' in line]
    tree.latency_ms += latency
    tree.rounds.append(latency)
    tree.replies.append(replies)


def compare(commit: str, rounds: int, sessions: int, turns: int, max_tokens: int) -> int:
    load_before = os.getloadavg()
    started = time.monotonic()
    old, sha = worktree(commit)
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    trees = [Tree("sealed", ROOT, _git("rev-parse", "--short", "HEAD") + (" + uncommitted changes" * bool(dirty))),
             Tree("clear", old, sha[:12])]
    try:
        for _ in range(rounds):
            for tree in trees:
                _round(tree, sessions, turns, max_tokens)
    finally:
        for tree in trees:
            stop_postgres(tree.data_dir / "pg")
            shutil.rmtree(tree.data_dir, ignore_errors=True)
    load_after = os.getloadavg()
    n = len(trees[0].rounds[0])
    print(f"turn latency, sealed at rest against clear, one run: {rounds} rounds per tree alternating sealed, clear; "
          f"{n} turns a round ({sessions} full-policy sessions + 1 retrieval-policy session, x {turns} turns), "
          f"hf engine, LETHE_HF_THREADS=1, max_tokens {max_tokens}, greedy; {os.cpu_count()} cores, load average "
          "before " + " ".join(f"{x:.2f}" for x in load_before) + ", after "
          + " ".join(f"{x:.2f}" for x in load_after) + f"; {time.monotonic() - started:.0f} s in all")
    for tree in trees:
        p50, mean = statistics.median(tree.latency_ms), statistics.fmean(tree.latency_ms)
        print(f"  {tree.label:<6} ({tree.commit}): p50 {p50:.1f} ms, mean {mean:.1f} ms, server CPU "
              f"{1000 * tree.cpu_s / len(tree.latency_ms):.1f} ms per turn (lethe serve + PostgreSQL)")
        print("         each round, p50 / mean ms: "
              + ", ".join(f"{statistics.median(r):.1f} / {statistics.fmean(r):.1f}" for r in tree.rounds))
    sealed, clear = trees
    p50 = statistics.median(sealed.latency_ms) / statistics.median(clear.latency_ms)
    mean = statistics.fmean(sealed.latency_ms) / statistics.fmean(clear.latency_ms)
    cpu = sealed.cpu_s / clear.cpu_s
    paired = statistics.median(s / c for rs, rc in zip(sealed.rounds, clear.rounds, strict=True)
                               for s, c in zip(rs, rc, strict=True))
    spread = {t.label: max(statistics.median(r) for r in t.rounds) / min(statistics.median(r) for r in t.rounds) - 1
              for t in trees}
    print(f"  sealed / clear: p50 x{p50:.3f}, mean x{mean:.3f}, paired turn-by-turn median x{paired:.3f}, server CPU "
          f"x{cpu:.3f}; goal cost <= {100 * GOAL:.0f} % of a turn: "
          f"{'met' if p50 - 1 <= GOAL else 'NOT met'} by p50 ({100 * (p50 - 1):+.1f} %)")
    print("  each pair (sealed round / the clear round after it), p50 ratio: "
          + ", ".join(f"x{statistics.median(s) / statistics.median(c):.3f}"
                      for s, c in zip(sealed.rounds, clear.rounds, strict=True)))
    print("  noise, spread of round p50s within a tree: "
          + ", ".join(f"{k} {100 * v:.1f} %" for k, v in spread.items()))
    same = sum(a == b for a, b in zip(sealed.replies[0], clear.replies[0], strict=True))
    print(f"  replies identical between trees (first round): {same} / {n}")
    code = 0
    for tree in trees:
        if tree.errors:
            print(f"server ({tree.label}) logged {len(tree.errors)} errors, first: {tree.errors[0][:600]}")
            code = 1
    return code


class TimedSealer(Sealer):
    """The process's Sealer with a stopwatch around what a turn asks of it: leaves, seals, opens."""

    seconds = 0.0
    calls = 0

    async def _timed(self, coro: Awaitable[T]) -> T:
        start = time.perf_counter()
        try:
            return await coro
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1

    async def leaf(self, tenant: str, stream: Hashable) -> int:
        return await self._timed(super().leaf(tenant, stream))

    async def seal_bytes(self, leaf: int, binding: Binding, plaintext: bytes) -> bytes:
        return await self._timed(super().seal_bytes(leaf, binding, plaintext))

    async def open_bytes(self, binding: Binding, ciphertext: bytes) -> bytes:
        return await self._timed(super().open_bytes(binding, ciphertext))


class NullSealer(TimedSealer):
    """The same code path with nothing encrypted and no key touched: leaves counted in the process (no reservation
    in the database, no key derived), "sealing" a one-byte prefix. The baseline that isolates what sealing costs a
    turn from everything else in the tree (unlike the clear tree, which differs in more than sealing)."""

    _last = 0

    async def leaf(self, tenant: str, stream: Hashable) -> int:
        self._last += 1
        return self._last

    async def seal_bytes(self, leaf: int, binding: Binding, plaintext: bytes) -> bytes:
        return await self._timed(_const(b"N" + plaintext))

    async def open_bytes(self, binding: Binding, ciphertext: bytes) -> bytes:
        return await self._timed(_const(bytes(ciphertext)[1:]))

    async def punctured(self, tenant: str, leaves: Iterable[int]) -> set[int]:
        return set()


async def _const(value: T) -> T:
    return value


async def sealing_share(sessions: int, turns: int, max_tokens: int) -> None:
    """The same script in this process through `SessionService.turn` (no HTTP), twice side by side, turn by turn:
    sealed (the process's Sealer, with a stopwatch around its leaf reservations, AES-GCM seals and opens and key
    derivation) and unsealed (`NullSealer`: the same code path, nothing encrypted), each in a tenant of its own on
    the same database and engine. Per turn: wall time and this process's CPU time (the engine runs here too)."""
    from app.db.database import Database
    from app.db.embedded import start_embedded_postgres
    from app.db.migrate import upgrade_to_head_async
    from app.db.models import Tenant
    from app.embeddings import MiniLMEmbedder
    from app.engine.hf import HFEngine
    from app.engine.session_caches import LocalSessionCaches
    from app.engine.slot import EngineSlot
    from app.ids import new_id
    from app.keys.keyring import Keyring
    from app.keys.leaves import Leaves
    from app.keys.local import LocalProvider
    from app.policies import build_policies
    from app.runtime.blocks import Observation
    from app.sessions.service import SessionService
    from app.sessions.views import SessionConfig
    from app.tenants.service import TenantService

    data = Path(tempfile.mkdtemp(prefix="lethe-sealturns-inproc-"))
    url = start_embedded_postgres(data)
    await upgrade_to_head_async(url)
    databases = [Database(url, pool_size=4), Database(url, pool_size=4)]
    engine = HFEngine(None, MODEL_CACHE)
    modes = ("sealed", "unsealed")
    try:
        await engine.start()
        slot, caches, embedder = EngineSlot(engine), LocalSessionCaches(), MiniLMEmbedder()
        sealers: list[TimedSealer] = [
            TimedSealer(Keyring(LocalProvider(data / "keys")), Leaves(TenantService(databases[0]).reserve_leaves)),
            NullSealer(Keyring(LocalProvider(data / "unused")), Leaves(TenantService(databases[1]).reserve_leaves)),
        ]
        tenants, services = [], []
        for db, sealer in zip(databases, sealers, strict=True):
            tenant_id = new_id("ten")
            async with db.transaction() as tx:
                tx.add(Tenant(id=tenant_id, name="bench-" + tenant_id))
            tenants.append(tenant_id)
            services.append(SessionService(db, slot, caches, embedder, build_policies(), sealer))
        sampling = {"temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens, "seed": 0, "stop": []}
        configs = [SessionConfig(system_prompt=SYSTEM, sampling=sampling)] * sessions + [SessionConfig(
            system_prompt=SYSTEM, sampling=sampling, context_policy="retrieval",
            retrieval={"top_k": 5, "min_similarity": -1.0})]
        for service, tenant_id in zip(services, tenants, strict=True):  # untimed: model and embedder loaded
            warm = await service.create(tenant_id, configs[-1])
            await service.turn(tenant_id, warm.row.id, [Observation("user", SCRIPT[0])])
        wall: dict[str, list[float]] = {m: [] for m in modes}
        cpu: dict[str, list[float]] = {m: [] for m in modes}
        inside: dict[str, list[float]] = {m: [] for m in modes}
        replies: dict[str, list[str]] = {m: [] for m in modes}
        calls = []
        for config in configs:
            views = [await service.create(t, config) for service, t in zip(services, tenants, strict=True)]
            for i, text in enumerate(SCRIPT[:turns]):
                order = range(2) if i % 2 == 0 else range(1, -1, -1)  # who goes first alternates
                for k in order:
                    sealer, mode = sealers[k], modes[k]
                    sealer.seconds, sealer.calls = 0.0, 0
                    start, start_cpu = time.perf_counter(), time.process_time()
                    done = await services[k].turn(tenants[k], views[k].row.id, [Observation("user", text)])
                    cpu[mode].append(time.process_time() - start_cpu)
                    wall[mode].append(time.perf_counter() - start)
                    inside[mode].append(sealer.seconds)
                    replies[mode].append(done.reply_content or "")
                    if k == 0:
                        calls.append(sealer.calls)
    finally:
        await engine.close()
        for db in databases:
            await db.close()
        stop_postgres(data / "pg")
        shutil.rmtree(data, ignore_errors=True)
    sealed, unsealed = modes
    share = sum(inside[sealed]) / sum(wall[sealed])
    n = len(wall[sealed])
    print(f"  in process (SessionService.turn, no HTTP, the hf engine on its default threads, {n} turns a mode, "
          f"sealed and unsealed turn by turn): inside the Sealer {1000 * statistics.median(inside[sealed]):.2f} ms "
          f"median, {1000 * statistics.fmean(inside[sealed]):.2f} ms mean per turn ({statistics.fmean(calls):.0f} "
          f"calls: leaves, seals, opens), {100 * share:.2f} % of the sealed turns' time")
    for mode in modes:
        print(f"  {mode:<8}: wall p50 {1000 * statistics.median(wall[mode]):.1f} ms, mean "
              f"{1000 * statistics.fmean(wall[mode]):.1f} ms; CPU of this process "
              f"{1000 * statistics.median(cpu[mode]):.1f} ms p50, {1000 * sum(cpu[mode]) / n:.1f} ms mean per turn")
    paired = statistics.median(s / u for s, u in zip(wall[sealed], wall[unsealed], strict=True))
    cpu_ratio = sum(cpu[sealed]) / sum(cpu[unsealed])
    print(f"  sealed / unsealed: wall p50 x{statistics.median(wall[sealed]) / statistics.median(wall[unsealed]):.3f}, "
          f"paired turn-by-turn median x{paired:.3f}, CPU x{cpu_ratio:.3f}; goal cost <= {100 * GOAL:.0f} % of a "
          f"turn: {'met' if cpu_ratio - 1 <= GOAL else 'NOT met'} by CPU ({100 * (cpu_ratio - 1):+.1f} %)")
    same = sum(a == b for a, b in zip(replies[sealed], replies[unsealed], strict=True))
    print(f"  replies identical sealed / unsealed: {same} / {n}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-commit", default="be86ddb")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=12, choices=range(1, len(SCRIPT) + 1), metavar="N")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--no-in-process", action="store_true", help="skip the in-process time inside the Sealer")
    parser.add_argument("--in-process-only", action="store_true", help="only the in-process time inside the Sealer")
    args = parser.parse_args()
    code = 0
    if not args.in_process_only:
        code = compare(args.baseline_commit, args.rounds, args.sessions, args.turns, args.max_tokens)
    if not args.no_in_process:
        asyncio.run(sealing_share(args.sessions, args.turns, args.max_tokens))
    raise SystemExit(code)
