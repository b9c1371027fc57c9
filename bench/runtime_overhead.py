"""Runtime overhead per turn against a bare engine call on the same prompt.

`python -m bench.runtime_overhead [--sessions 3] [--turns 8] [--max-tokens 16] [--database-url URL]`

Runs the same chat script twice per turn, interleaved so both see the same machine load: once through
`SessionService.turn` (row lock, stored-log read and comparison, rendering, engine calls, artifact / edge /
checkpoint writes, commit) and once as the bare engine calls that turn makes on a handle of its own
(`prefill(observation + header)`, `generate`, `prefill(end_of_turn)`). Greedy decoding, so both produce the same
tokens (checked). Reports medians per turn of: the runtime turn, the bare calls, the time the runtime spent inside
the engine, and the runtime's own time (turn minus engine), the overhead, as a share of the bare call. HTTP is not
included (uvicorn + JSON cost the same for any implementation of the API).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from app.db.database import Database
from app.db.embedded import start_embedded_postgres
from app.db.migrate import upgrade_to_head_async
from app.db.models import Tenant
from app.embeddings import MiniLMEmbedder
from app.engine.hf import HFEngine
from app.engine.protocol import CacheHandle, ChatTemplate, Generation, Sampling, TokenSink, TokenUsage
from app.engine.sampling import transition_seed
from app.engine.session_caches import LocalSessionCaches
from app.engine.slot import EngineSlot
from app.ids import new_id
from app.keys.content import Sealer
from app.keys.keyring import Keyring
from app.keys.leaves import Leaves
from app.keys.local import LocalProvider
from app.policies import build_policies
from app.runtime.blocks import Observation
from app.sessions.service import SessionService
from app.sessions.views import SessionConfig
from app.tenants.service import TenantService

SYSTEM = "You are a helpful assistant. Answer briefly."
SCRIPT = [
    "Hi! Please help me plan my week.", "I like jogging in the morning.", "I work as a nurse on late shifts.",
    "Suggest a time for my runs.", "What should I eat before a late shift?", "And after it?",
    "Give me one tip for sleeping well.", "Summarize the plan in one sentence.", "Thanks, anything else?",
    "What day should I rest?", "How long should each run be?", "Which shoes should I buy?",
]


class TimedEngine:
    """The hf engine with a stopwatch around every call that reaches the model worker."""

    def __init__(self, engine: HFEngine) -> None:
        self.inner = engine
        self.name, self.model_id = engine.name, engine.model_id
        self.seconds = 0.0

    @property
    def chat(self) -> ChatTemplate:
        return self.inner.chat

    @property
    def ready(self) -> bool:
        return self.inner.ready

    @property
    def exactness(self) -> str:
        return self.inner.exactness

    def __getattr__(self, name: str) -> Any:  # private attributes the runtime probes (the model's context)
        return getattr(self.inner, name)

    async def _timed(self, coro: Any) -> Any:
        start = time.perf_counter()
        try:
            return await coro
        finally:
            self.seconds += time.perf_counter() - start

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def open(self, session_key: str, *, salt: str | None = None, tokens: list[int] | None = None,
                   chunks: list[int] | None = None) -> CacheHandle:
        handle: CacheHandle = await self._timed(self.inner.open(session_key, salt=salt, tokens=tokens, chunks=chunks))
        return handle

    def chunks(self, handle: CacheHandle) -> list[int]:
        return self.inner.chunks(handle)

    async def prefill(self, handle: CacheHandle, token_ids: list[int]) -> TokenUsage:
        usage: TokenUsage = await self._timed(self.inner.prefill(handle, token_ids))
        return usage

    async def generate(
        self, handle: CacheHandle, sampling: Sampling, on_tokens: TokenSink | None = None
    ) -> Generation:
        generation: Generation = await self._timed(self.inner.generate(handle, sampling))
        return generation

    async def crop(self, handle: CacheHandle, n_tokens: int) -> None:
        await self._timed(self.inner.crop(handle, n_tokens))

    async def fork(self, handle: CacheHandle, session_key: str) -> CacheHandle:
        forked: CacheHandle = await self._timed(self.inner.fork(handle, session_key))
        return forked

    async def release(self, handle: CacheHandle) -> None:
        await self._timed(self.inner.release(handle))


async def bare_turn(engine: HFEngine, handle: CacheHandle, first: list[int], sampling: Sampling) -> list[int]:
    chat = engine.chat
    await engine.prefill(handle, [*first, *chat.assistant_header()])
    generation = await engine.generate(handle, sampling)
    await engine.prefill(handle, chat.end_of_turn())
    return generation.token_ids


async def main(sessions: int, turns: int, max_tokens: int, url: str | None, cache_dir: Path) -> None:
    if url is None:
        url = start_embedded_postgres(Path(tempfile.mkdtemp(prefix="lethe-runtimebench-")))
    await upgrade_to_head_async(url)
    db = Database(url, pool_size=4)
    tenant_id = new_id("ten")
    async with db.transaction() as tx:
        tx.add(Tenant(id=tenant_id, name="bench-" + tenant_id))
    engine = HFEngine(None, cache_dir)
    await engine.start()
    timed = TimedEngine(engine)
    keys = Path(tempfile.mkdtemp(prefix="lethe-runtimebench-keys-"))
    sealer = Sealer(Keyring(LocalProvider(keys)), Leaves(TenantService(db).reserve_leaves))
    service = SessionService(  # type: ignore[arg-type]
        db, EngineSlot(timed), LocalSessionCaches(), MiniLMEmbedder(), build_policies(), sealer
    )
    config = {"temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens, "seed": 0, "stop": []}
    runtime_s, bare_s, engine_s, own_s = [], [], [], []
    try:
        for s in range(sessions):
            view = await service.create(tenant_id, SessionConfig(system_prompt=SYSTEM, sampling=config))
            bare = await engine.open(f"bare-{s}")
            pending = engine.chat.render_block("system", SYSTEM)
            for t, text in enumerate(SCRIPT[:turns], start=1):
                timed.seconds = 0.0
                start = time.perf_counter()
                result = await service.turn(tenant_id, view.row.id, [Observation("user", text)])
                runtime_s.append(time.perf_counter() - start)
                engine_s.append(timed.seconds)
                own_s.append(runtime_s[-1] - timed.seconds)
                sampling = Sampling(max_tokens=max_tokens, seed=transition_seed(0, t))
                start = time.perf_counter()
                tokens = await bare_turn(engine, bare, [*pending, *engine.chat.render_block("user", text)], sampling)
                bare_s.append(time.perf_counter() - start)
                pending = []
                assert engine.chat.decode(tokens) == result.reply_content, "the runtime did other work than bare"
            await engine.release(bare)
            await service.delete(tenant_id, view.row.id)
    finally:
        await engine.close()
        await db.close()

    def ms(values: list[float]) -> float:
        return statistics.median(values) * 1000

    n = len(runtime_s)
    print(f"{n} turns ({sessions} sessions x {turns}), max_tokens {max_tokens}, greedy; medians per turn:")
    print(f"  runtime turn        {ms(runtime_s):8.1f} ms")
    print(f"  bare engine calls   {ms(bare_s):8.1f} ms")
    print(f"  engine inside turn  {ms(engine_s):8.1f} ms")
    share = 100 * statistics.median(own_s) / statistics.median(bare_s)
    mean_share = 100 * statistics.fmean(own_s) / statistics.fmean(bare_s)
    print(f"  runtime's own time  {ms(own_s):8.1f} ms  = {share:.1f}% of the bare call (mean {mean_share:.1f}%)")
    ratio = statistics.median([r / b for r, b in zip(runtime_s, bare_s, strict=True)])
    print(f"  runtime / bare (paired median) {ratio:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--turns", type=int, default=8, choices=range(1, len(SCRIPT) + 1), metavar="N")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--model-cache", type=Path, default=Path(".lethe/models"))
    args = parser.parse_args()
    asyncio.run(main(args.sessions, args.turns, args.max_tokens, args.database_url, args.model_cache))
