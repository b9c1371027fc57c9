"""The engine process boundary (app/engine/process/): a real EngineServer over the real hf engine on a Unix socket,
driven by EngineClients as HTTP workers drive it.

What must hold: a call through the socket is the same call (same tokens, greedy and seeded, same chunk recipe) as
in the process; sampled tokens stream as they come; a caller that gives up cancels the generation in the engine and
the handle stays usable; a handle the engine process lost (restart) is opened again from the worker's copy along its
recipe and continues bit for bit; two workers share one cache per session; bad arguments and a dead engine process
raise what the runtime expects (ValueError, EngineUnavailable); an operation runs at the priority of the worker
task that sent it (app/engine/priority.py).

The wire (wire.py, messages.py, codec.py): every operation and its answer survive a round trip as the same typed
message; a malformed message is a protocol error for its call alone (the connection serves on); an error crosses by
its kind, decided by type: an engine bug (an AttributeError included) reaches the worker as an internal error (500),
never as "not ready" (503), which only an engine process still loading answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from app.embeddings import MiniLMEmbedder
from app.engine.hf import HFEngine
from app.engine.model_store import resolve_model
from app.engine.priority import Priority, engine_priority, measure_wait
from app.engine.process import messages as m
from app.engine.process import wire
from app.engine.process.client import EngineClient
from app.engine.process.proxies import EngineProcessCaches
from app.engine.process.server import EngineServer
from app.engine.protocol import CacheHandle, Generation, Sampling, TokenUsage
from app.engine.slot import EngineSlot
from app.errors import EngineUnavailable, LetheError, NotReady
from tests.engine.engine_helpers import GREEDY, conversation, sampled
from tests.support import MODEL_CACHE


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
    assert client.exactness == "exact" and client.records_chunks and client.rereads_replies
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


# -- the wire -----------------------------------------------------------------------------------------------------

STATE = m.HandleState(version=3, length=5, chunks=(2, 3))
AT = m.At(handle=7, expect=5, salt="s1")
# One call of every operation with an answer of its reply type (none of them at their defaults).
EXCHANGES: list[tuple[m.Request[Any], object]] = [
    (m.Hello(), m.Greeting("hf", "smol", True, None, "exact", True, True, 8192, "/models/smol")),
    (m.Attach("ses_a", m.HandleRef(7, 3)), m.Attached(7, m.HandleCopy((1, 2, 3, 4, 5), None, STATE))),
    (m.Open("ses_a", "s1", (1, 2, 3, 4, 5), (2, 3)), m.Opened(7, STATE)),
    (m.Prefill(AT, (6, 7)), m.Prefilled(TokenUsage(5, 2, 0), STATE)),
    (m.Generate(AT, Sampling(0.7, 0.95, 16, ("\n\n",), 11), stream=True),
     m.Generated(Generation([8, 9], "ab", "length", TokenUsage(0, 0, 2)), STATE)),
    (m.Crop(AT, 2), m.Changed(STATE)),
    (m.Fork(AT, "ses_b"), m.Forked(8, twin=m.HandleState(0, 5, (2, 3)), state=STATE)),
    (m.Release((7, 8)), m.Empty()),
    (m.Drop("ses_a"), m.Empty()),
    (m.Embed(("I live in Paris.", "tea")), m.Embedded([[0.5, -1.0], [0.25, 2.0]])),
    (m.Stats(), m.EngineStats(handles=2, sessions=1)),
]


def _frame(data: bytes) -> dict[str, Any]:
    """The JSON object of one encoded frame (as `wire.read` returns it)."""
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    message: dict[str, Any] = json.loads(data[4:])
    return message


@pytest.mark.parametrize(("request_", "reply"), EXCHANGES, ids=[r.op.value for r, _ in EXCHANGES])
def test_every_operation_and_its_answer_round_trip_typed(request_: m.Request[Any], reply: object) -> None:
    call = wire.parse_call(_frame(wire.encode_call(41, request_, Priority.FORGET)))
    assert call == wire.Call(41, request_, Priority.FORGET)  # type: ignore[arg-type]
    assert type(reply) is m.reply_type(request_)
    done = wire.parse_answer(_frame(wire.encode_done(41, reply, 0.25)))
    assert isinstance(done, wire.Done) and done.waited_s == 0.25
    assert done.reply(request_) == reply


def test_every_operation_is_covered_and_the_other_frames_round_trip() -> None:
    assert {r.op for r, _ in EXCHANGES} == set(m.REQUESTS) == set(m.Op) - {m.Op.CANCEL}
    assert wire.parse_call(_frame(wire.encode_cancel(9))) == wire.Cancel(9)
    assert wire.parse_answer(_frame(wire.encode_tokens(9, [4, 5]))) == wire.Tokens(9, [4, 5])
    done = wire.parse_answer(_frame(wire.encode_done(9, m.Empty())))
    assert done == wire.Done(9, {}, None)


@pytest.mark.parametrize(("exc", "raised"), [
    (ValueError("temperature must be >= 0"), ValueError),
    (NotReady("the engine is still loading"), NotReady),
    (EngineUnavailable("gone"), EngineUnavailable),
    (wire.StaleHandle("no handle 3"), wire.StaleHandle),
    (wire.ProtocolError("bad"), wire.ProtocolError),
    (AttributeError("'NoneType' object has no attribute 'past'"), wire.EngineError),
    (RuntimeError("the hf engine is not started"), wire.EngineError),  # a message says nothing of the kind
    (TypeError("unsupported operand"), wire.EngineError),
    (KeyError("x"), wire.EngineError),
])
def test_an_error_crosses_by_its_type(exc: Exception, raised: type[Exception]) -> None:
    failed = wire.parse_answer(_frame(wire.encode_failure(5, exc)))
    assert isinstance(failed, wire.Failed) and failed.id == 5
    error = failed.error()
    assert type(error) is raised
    if raised is wire.EngineError:
        assert not isinstance(error, LetheError) and type(exc).__name__ in str(error)  # a 500, with the cause
    if raised is NotReady:
        assert isinstance(error, NotReady) and error.headers["Retry-After"]


@pytest.mark.parametrize(("message", "request_id"), [
    ({"id": 3, "op": "summon", "args": {}}, 3),
    ({"id": 3, "op": ["prefill"], "args": {}}, 3),
    ({"id": 3, "op": "prefill", "args": {"at": {"handle": 1, "expect": 0, "salt": None}}}, 3),  # no tokens
    ({"id": 3, "op": "prefill", "args": {"at": {"handle": 1, "expect": 0, "salt": None}, "tokens": ["1"]}}, 3),
    ({"id": 3, "op": "crop", "args": {"at": {"handle": True, "expect": 0, "salt": None}, "n": 1}}, 3),
    ({"id": 3, "op": "drop", "args": {"key": "k", "extra": 1}}, 3),
    ({"id": 3, "op": "generate", "args": {"at": {"handle": 1, "expect": 0, "salt": None},
                                          "sampling": {"temperature": "hot"}}}, 3),
    ({"id": 3, "op": "embed", "args": "texts"}, 3),
    ({"id": 3, "op": "hello", "priority": 9}, 3),
    ({"op": "hello"}, None),
    ({"id": "3", "op": "hello"}, None),
])
def test_a_malformed_call_is_a_protocol_error(message: dict[str, Any], request_id: int | None) -> None:
    with pytest.raises(wire.ProtocolError) as raised:
        wire.parse_call(message)
    assert raised.value.request_id == request_id


@pytest.mark.parametrize("message", [
    {"id": 3, "ok": {}, "waited_s": "long"},
    {"id": 3, "error": {"kind": "gremlins", "message": "?"}},
    {"id": 3, "error": "boom"},
    {"id": 3, "tokens": [1, None]},
    {"id": 3},
])
def test_a_malformed_answer_is_a_protocol_error_of_its_call(message: dict[str, Any]) -> None:
    with pytest.raises(wire.ProtocolError) as raised:
        wire.parse_answer(message)
    assert raised.value.request_id == 3


def test_an_answer_of_another_shape_is_a_protocol_error() -> None:
    request = m.Prefill(AT, (1,))
    with pytest.raises(wire.ProtocolError, match="usage"):
        wire.Done(3, {"state": {"version": 1, "length": 1}}).reply(request)
    with pytest.raises(wire.ProtocolError, match="finish_reason"):
        generated = wire.to_json(m.Generated(Generation([1], "a", "stop", TokenUsage()), STATE))
        generated["generation"]["finish_reason"] = "tired"
        wire.Done(3, generated).reply(m.Generate(AT, Sampling()))


async def _raw_call(socket_path: Path, *frames: bytes) -> list[dict[str, Any] | None]:
    """Send frames on a connection of its own; one answer per frame, or up to None where the server hangs up."""
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    try:
        for frame in frames:
            writer.write(frame)
        await writer.drain()
        answers: list[dict[str, Any] | None] = []
        while len(answers) < len(frames) and (not answers or answers[-1] is not None):
            answers.append(await asyncio.wait_for(wire.read(reader), 60))
        return answers
    finally:
        writer.close()


async def test_a_malformed_call_fails_alone_and_a_frame_without_an_id_ends_the_connection(served: Served) -> None:
    bad = wire.encode({"id": 1, "op": "crop", "args": {"at": {"handle": 1, "expect": "0", "salt": None}, "n": 1}})
    answers = await _raw_call(served.socket_path, bad, wire.encode_call(2, m.Stats()))
    assert [a and a["id"] for a in answers] == [1, 2]
    assert answers[0] and answers[0]["error"]["kind"] == "protocol" and "expect" in answers[0]["error"]["message"]
    assert answers[1] and "ok" in answers[1]  # the connection serves on
    answers = await _raw_call(served.socket_path, wire.encode({"op": "hello"}), wire.encode_call(2, m.Stats()))
    assert answers == [None]  # no call to answer with the error: the server hangs up


async def test_an_engine_bug_reaches_the_worker_as_an_internal_error_not_as_not_ready(
    client: EngineClient, engine: HFEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An AttributeError in the engine once reached the worker as "not ready": a 503 with Retry-After, retried
    forever by clients, for a bug. It is an internal error (500), as any other unexpected exception."""
    remote = await client.open("buggy", tokens=[1, 2, 3])

    async def buggy(handle: CacheHandle, token_ids: list[int]) -> TokenUsage:
        raise AttributeError("'NoneType' object has no attribute 'key_cache'")

    monkeypatch.setattr(engine, "prefill", buggy)
    with pytest.raises(wire.EngineError, match="AttributeError: 'NoneType'") as raised:
        await client.prefill(remote, [4])
    assert not isinstance(raised.value, NotReady)
    monkeypatch.undo()
    assert remote.tokens == [1, 2, 3] and client.ready  # nothing changed; the worker serves on
    await client.prefill(remote, [4])
    assert remote.tokens == [1, 2, 3, 4]


async def test_only_an_engine_process_still_loading_is_not_ready(engine: HFEngine, tmp_path: Path) -> None:
    server = EngineServer(engine, MiniLMEmbedder())  # loading: the model directory is not known yet
    listening = await server.serve(tmp_path / "engine.sock")
    try:
        answers = await _raw_call(tmp_path / "engine.sock", wire.encode_call(1, m.Open("ses_early")))
        assert answers and answers[0] and answers[0]["error"]["kind"] == "not_ready"
        server.error = "OSError: no weights"  # a load that failed: never ready, said so
        answers = await _raw_call(tmp_path / "engine.sock", wire.encode_call(1, m.Open("ses_early")))
        assert answers[0] and answers[0]["error"] == {"kind": "not_ready",
                                                      "message": "the engine failed to start: OSError: no weights"}
    finally:
        listening.close()
        server.disconnect_all()
        await listening.wait_closed()
