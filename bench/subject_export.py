"""`python -m bench.subject_export [--sizes 1000 10000]`: a data subject's export (issue 43), its time and the
server's peak memory, against the size of what the subject owns.

One `lethe serve` (the embedded defaults, the tiny model) on a fresh data directory. For each size, a subject gets
that many artifacts, in sessions of `--per-session`: the sessions made through the API, their artifacts written by
this process with the app's own repository and sealer over the server's database and key store (sealed, one leaf
each, as a turn writes them; through turns, 10k messages would take the tiny model most of an hour). Then the
export is read (`GET /v1/subjects/{id}/export`, streamed) while the server's
resident memory (its process and children, the embedded PostgreSQL's left out) is sampled every 5 ms. Printed per
size: the document's bytes, the time, and the peak resident memory above what the server held just before the
request, for a first export (every artifact's key derived: the key cache keeps each, so that growth is the cache's,
bounded by its capacity) and a second (the keys cached: the growth is the export's own). The export pages its reads
(200 rows at a time), so its own peak should not grow with the size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass

import httpx
import psutil

from app.container import build_sealer
from app.db.database import Database
from app.db.embedded import start_embedded_postgres
from app.ids import new_id
from app.runtime.records import artifact_row
from app.sessions.repositories.artifacts import insert_artifacts
from app.sessions.repositories.sessions import tenant_of
from app.settings import Settings
from app.tenants.service import TenantService
from bench.serve import LetheServer, serving

API_KEY = "bench-key-" + "0" * 24
SAMPLE_S = 0.005


def rss(pid: int) -> int:
    process = psutil.Process(pid)
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        try:
            if "postgres" not in child.name():  # the embedded PostgreSQL's buffers are not the server's memory
                total += child.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


@dataclass
class Read:
    body_bytes: int
    seconds: float
    peak_over_mib: float


def measured(client: httpx.Client, pid: int, path: str) -> Read:
    """Read `path` to its end while sampling the server's memory; the peak above what it held just before."""
    before = rss(pid)
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss(pid))
            time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    size = 0
    with client.stream("GET", path) as response:
        assert response.status_code == 200, response.read()
        for chunk in response.iter_bytes():
            size += len(chunk)
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    return Read(size, seconds, (peak - before) / 2**20)


def sessions_of(client: httpx.Client, subject: str, count: int) -> list[str]:
    made = []
    for _ in range(count):
        r = client.post("/v1/sessions", json={"subject_id": subject, "sampling": {"temperature": 0, "max_tokens": 4}})
        r.raise_for_status()
        made.append(r.json()["id"])
    return made


async def load(server: LetheServer, sessions: list[str], size: int, per_session: int) -> None:
    settings = Settings(_env_file=None, data_dir=server.data_dir)  # type: ignore[call-arg]
    db = Database(start_embedded_postgres(server.data_dir), pool_size=2)
    try:
        sealer = build_sealer(settings, db, TenantService(db))
        written = 0
        for session_id in sessions:
            async with db.transaction() as tx:
                tenant_id = await tenant_of(tx, session_id)
                assert tenant_id is not None
                rows = []
                for i in range(min(per_session, size - written)):
                    text = f"Message {written + i}: it was {uuid.uuid4().hex[:12]}."
                    tokens = [1000 + (ord(c) % 97) for c in text]
                    rows.append(artifact_row(
                        id=new_id("art"), tenant_id=tenant_id, session_id=session_id, position=i + 1, kind="user",
                        turn=1, content=text, token_start=i * 64, token_ids=tokens, source_ids=[], committed=True,
                        meta={},
                    ))
                await insert_artifacts(tx, sealer, rows)
                written += len(rows)
    finally:
        await db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--per-session", type=int, default=500)
    args = parser.parse_args()
    with serving(ready_s=600, LETHE_BOOTSTRAP_API_KEY=API_KEY) as server, httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=600
    ) as client:
        rows = []
        for size in args.sizes:
            subject = f"bench-{size}-{uuid.uuid4().hex[:6]}"
            started = time.perf_counter()
            sessions = sessions_of(client, subject, -(-size // args.per_session))
            asyncio.run(load(server, sessions, size, args.per_session))
            loaded_s = time.perf_counter() - started
            # Twice: the first export derives every artifact's key (the key cache keeps it, up to its capacity);
            # the second finds them cached, so its growth is the export's own.
            cold = measured(client, server.proc.pid, f"/v1/subjects/{subject}/export")
            warm = measured(client, server.proc.pid, f"/v1/subjects/{subject}/export")
            rows.append({"artifacts": size, "load_s": round(loaded_s, 1), "cold": vars(cold), "warm": vars(warm)})
            print(json.dumps(rows[-1]), flush=True)
        print("\n| artifacts | export bytes | cold keys: s, peak RSS over before (MiB) | warm keys: s, peak (MiB) |")
        print("| --- | --- | --- | --- |")
        for r in rows:
            c, w = r["cold"], r["warm"]
            print(f"| {r['artifacts']:,} | {c['body_bytes']:,} | {c['seconds']:.2f} s, {c['peak_over_mib']:.1f} | "
                  f"{w['seconds']:.2f} s, {w['peak_over_mib']:.1f} |")

if __name__ == "__main__":
    main()
