"""The engine process boundary (app/engine/process/): a real EngineServer over the real hf engine on a Unix socket,
driven by EngineClients as HTTP workers drive it.

What must hold: a call through the socket is the same call (same tokens, greedy and seeded, same chunk recipe) as
in the process; sampled tokens stream as they come; a caller that gives up cancels the generation in the engine and
the handle stays usable; a handle the engine process lost (restart) is opened again from the worker's copy along its
recipe and continues bit for bit; two workers share one cache per session; bad arguments and a dead engine process
raise what the runtime expects (ValueError, EngineUnavailable); an operation runs at the priority of the worker
task that sent it (app/engine/priority.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from app.embeddings import MiniLMEmbedder
from app.engine.hf import HFEngine
from app.engine.model_store import resolve_model
from app.engine.priority import Priority, engine_priority, measure_wait
from app.engine.process.client import EngineClient
from app.engine.process.proxies import EngineProcessCaches
from app.engine.process.server import EngineServer
from app.engine.protocol import Sampling
from app.engine.slot import EngineSlot
from app.errors import EngineUnavailable
from tests.engine.engine_helpers import GREEDY, conversation, sampled
from tests.support import MODEL_CACHE

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Served:
    """An engine server on a socket, which a test can stop (the engine process dying) and start again."""

    def __init__(self, engine: HFEngine, socket_path: Path) -> None:
        self.engine, self.socket_path = engine, socket_path
        self.server = self._new()
        self.listening: asyncio.AbstractServer | None = None

    def _new(self) -> EngineServer:
        path = resolve_model(None, MODEL_CACHE).path
        return EngineServer(self.engine, MiniLMEmbedder(), model_dir=path)

    async def start(self) -> None:
        self.listening = await self.server.serve(self.socket_path)

    async def stop(self) -> None:
        assert self.listening is not None
        self.listening.close()
        self.server.disconnect_all()  # as the process dying would
        await self.listening.wait_closed()

    async def restart(self) -> None:
        """A new engine process: nothing of the old one's handles is left."""
        await self.stop()
        self.server = self._new()
        await self.start()


@pytest_asyncio.fixture(loop_scope="session")
async def served(engine: HFEngine, tmp_path: Path) -> AsyncIterator[Served]:
    served = Served(engine, tmp_path / "engine.sock")
    await served.start()
    yield served
    with contextlib.suppress(Exception):
        await served.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def client(served: Served) -> AsyncIterator[EngineClient]:
    client = EngineClient(served.socket_path, name="hf", model_id="?")
    await client.start()
    yield client
    await client.close()


async def test_hello_describes_the_engine(client: EngineClient, engine: HFEngine) -> None:
    assert client.ready and client.name == "hf" and client.model_id == engine.model_id
    assert client.exactness == "exact" and client.records_chunks
    assert client.max_context_tokens == engine.max_context_tokens
    text = "I live at 12 Rue Cler, Paris."
    assert client.chat.render_block("user", text) == engine.chat.render_block("user", text)


async def test_a_worker_asking_between_the_engines_start_and_the_end_of_the_load_hears_loading(
    engine: HFEngine, tmp_path: Path
) -> None:
    """The engine process is ready when its whole load is done: the engine started *and* the model directory (the
    workers' tokenizer) resolved. A hello in between once raised (the directory was read before it was known), and the
    worker that asked kept answering 503 for the rest of its life (seen in a run of tests/mcp/test_mcp_workers.py)."""
    server = EngineServer(engine, MiniLMEmbedder())  # as the engine process builds it, before its load
    listening = await server.serve(tmp_path / "engine.sock")
    worker = EngineClient(tmp_path / "engine.sock", name="hf", model_id="?")
    try:
        assert engine.ready
        await worker.refresh()
        assert not worker.ready and worker.name == "hf"  # "loading", not an error: the worker asks again
        server.model_dir = resolve_model(None, MODEL_CACHE).path  # what the load does last
        await asyncio.wait_for(worker.start(), 30)
        assert worker.ready and worker.chat.render_block("user", "Hi") == engine.chat.render_block("user", "Hi")
    finally:
        await worker.close()
        listening.close()
        server.disconnect_all()
        await listening.wait_closed()


async def test_a_worker_still_polling_for_the_engine_serves_once_it_is_up(engine: HFEngine, tmp_path: Path) -> None:
    """Under several HTTP workers a client is let in by whichever worker answered /readyz; a sibling whose own start
    is still between two polls must serve too, not answer 503 for an engine process that is up (a CI run of
    tests/mcp/test_mcp_workers.py got "the model is not loaded yet" from the second worker)."""
    server = EngineServer(engine, MiniLMEmbedder())  # loading: the model directory is not known yet
    listening = await server.serve(tmp_path / "engine.sock")
    worker = EngineClient(tmp_path / "engine.sock", name="hf", model_id="?")
    slot = EngineSlot(worker)
    slot.task = asyncio.create_task(slot.load())
    try:
        assert not await slot.available()  # "loading"
        server.model_dir = resolve_model(None, MODEL_CACHE).path  # the load ends while the start loop polls
        assert not slot.task.done()
        assert await slot.available()  # asked at once, not at the start loop's next poll
        await asyncio.wait_for(slot.task, 30)
        assert slot.ready and slot.error is None
    finally:
        slot.task.cancel()
        await asyncio.gather(slot.task, return_exceptions=True)
        await worker.close()
        listening.close()
        server.disconnect_all()
        await listening.wait_closed()


@pytest.mark.parametrize("sampling", [GREEDY, sampled(11)], ids=["greedy", "seeded"])
async def test_a_call_through_the_socket_is_the_same_call(
    client: EngineClient, engine: HFEngine, sampling: Sampling
) -> None:
    prompt = conversation(engine)
    local = await engine.open("local")
    remote = await client.open("remote")
    for handle, target in ((local, engine), (remote, client)):
        await target.prefill(handle, prompt[:20])
        await target.prefill(handle, prompt[20:])
    streamed: list[int] = []
    here = await engine.generate(local, sampling)
    there = await client.generate(remote, sampling, streamed.extend)
    assert there.token_ids == here.token_ids and there.text == here.text
    assert streamed == there.token_ids  # streamed as sampled, in order
    assert remote.tokens == local.tokens and client.chunks(remote) == engine.chunks(local)
    await engine.crop(local, 20)
    await client.crop(remote, 20)
    assert remote.tokens == local.tokens and client.chunks(remote) == engine.chunks(local)


async def test_a_handle_lost_with_the_engine_process_is_opened_again_from_the_copy(
    served: Served, client: EngineClient, engine: HFEngine
) -> None:
    """The log and its recipe travel with the worker's copy: a new engine process rebuilds the cache chunk for chunk,
    so the generation after the restart equals the one without it, seeded sampling included."""
    prompt = conversation(engine)
    reference = await engine.open("reference")
    remote = await client.open("session-a")
    for handle, target in ((reference, engine), (remote, client)):
        await target.prefill(handle, prompt[:30])
        await target.generate(handle, sampled(3, 5))
        await target.prefill(handle, prompt[30:])
    await served.restart()
    with pytest.raises(EngineUnavailable):  # a call while the client has not reconnected yet...
        await client.generate(remote, sampled(4))
    await client.refresh()  # ...until it reaches the new process (the keeper does this on its own)
    after = await client.generate(remote, sampled(4))
    assert after.token_ids == (await engine.generate(reference, sampled(4))).token_ids
    assert remote.tokens == reference.tokens


async def test_a_caller_that_gives_up_cancels_the_generation(client: EngineClient, engine: HFEngine) -> None:
    remote = await client.open("cancelled")
    await client.prefill(remote, conversation(engine))
    first = asyncio.Event()
    generating = asyncio.create_task(
        client.generate(remote, Sampling(max_tokens=4000), lambda _: first.set())
    )
    await first.wait()  # provably generating in the engine
    generating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await generating
    # the engine process stopped at its next token: the next call is answered at once, on the log the worker knows
    # (the sampled tail is cut back first)
    log_length = len(remote.tokens)
    done = await asyncio.wait_for(client.generate(remote, GREEDY), 60)
    assert len(remote.tokens) == log_length + len(done.token_ids)


async def test_two_workers_share_one_cache_per_session(served: Served, client: EngineClient, engine: HFEngine) -> None:
    other = EngineClient(served.socket_path, name="hf", model_id="?")
    await other.start()
    try:
        mine, theirs = EngineProcessCaches(client), EngineProcessCaches(other)
        assert await mine.checkout("ses_shared") is None
        handle = await client.open("ses_shared", tokens=conversation(engine))
        mine.keep("ses_shared", handle)
        usage = await client.prefill(handle, engine.chat.render_block("user", "Hello."))
        attached = await theirs.checkout("ses_shared")  # the other worker takes the next transition
        assert attached is not None and attached.tokens == handle.tokens
        before = len(attached.tokens)
        more = await other.prefill(attached, engine.chat.render_block("user", "Again."))
        assert usage.prefilled > 0 and more.reused == before, more  # the first worker's cache, warm
        assert more.prefilled == len(engine.chat.render_block("user", "Again."))
        back = await mine.checkout("ses_shared")  # and this worker's copy is refreshed, not trusted
        assert back is not None and back.tokens == attached.tokens
        assert await mine.checkout("ses_shared") is back  # unchanged since: no tokens over the socket
        await theirs.drop("ses_shared")
        assert await mine.checkout("ses_shared") is None
    finally:
        await other.close()


async def test_an_operation_runs_in_the_engine_process_at_the_priority_of_the_task_that_sent_it(
    client: EngineClient, engine: HFEngine
) -> None:
    """A live and a forget generation queue in the engine process behind a call that holds its worker; the forget's
    runs first, and the time it waited comes back to the worker's meter."""
    live, urgent = await client.open("prio-live"), await client.open("prio-forget")
    for handle in (live, urgent):
        await client.prefill(handle, conversation(engine))
    started, release = threading.Event(), threading.Event()
    engine._worker.submit_call(lambda: (started.set(), release.wait(60)), priority=Priority.LIVE, key=None,
                               context=contextlib.nullcontext)
    assert started.wait(60)
    order: list[str] = []

    def on_live(tokens: list[int]) -> None:
        order.extend("live" for _ in tokens)

    living = asyncio.create_task(client.generate(live, sampled(5, 6), on_live))
    assert await asyncio.to_thread(engine._worker.wait_queued, Priority.LIVE, 60)  # a barrier on the engine's queue

    async def forget() -> float:
        with engine_priority(Priority.FORGET), measure_wait() as waited:
            await client.generate(urgent, sampled(6, 6), lambda t: order.extend("forget" for _ in t))
        assert waited.calls == 1
        return waited.seconds

    forgetting = asyncio.create_task(forget())
    assert await asyncio.to_thread(engine._worker.wait_queued, Priority.FORGET, 60)
    release.set()
    waited_s = await asyncio.wait_for(forgetting, 60)
    await asyncio.wait_for(living, 60)
    n_forget = order.count("forget")
    assert n_forget > 0 and order == ["forget"] * n_forget + ["live"] * (len(order) - n_forget)
    assert waited_s > 0  # measured in the engine process, observed here


async def test_bad_arguments_and_a_dead_engine_process(served: Served, client: EngineClient) -> None:
    remote = await client.open("bad", tokens=[1, 2, 3])
    with pytest.raises(ValueError, match="temperature"):
        await client.generate(remote, Sampling(temperature=-1))
    with pytest.raises(ValueError):
        await client.crop(remote, 99)
    assert remote.tokens == [1, 2, 3]
    vectors = await client.embed(["I live in Paris.", "tea"])
    assert len(vectors) == 2 and all(len(v) == 384 for v in vectors)
    await served.stop()
    with pytest.raises(EngineUnavailable):
        await client.prefill(remote, [4])
    assert not client.ready
    await served.start()
    await client.refresh()
    assert client.ready
    await client.prefill(remote, [4])
    assert remote.tokens == [1, 2, 3, 4]
