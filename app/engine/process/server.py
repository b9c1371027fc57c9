"""The engine process: one KV engine (hf or in-process vLLM) and the embedder, served to the HTTP workers on a Unix
socket (wire.py), as vLLM's engine core serves its API servers.

The workers run every route themselves (routing, auth, leases, the database) and come here only for model work:
open/prefill/generate/crop/fork/release on cache handles, and embeddings. The server keeps the handles; a worker
keeps a copy of each handle's log (client.py), so the runtime's reasoning about a log never needs a round trip.

One cache per session, whichever worker asks: a handle is registered under its session key, and a worker that
starts a transition *attaches* to the session's handle (the session lease guarantees one worker at a time), getting
the log it holds when its own copy is out of date. So a session's turns reuse its warm cache wherever they land, and
the engine holds one cache per session, not one per worker.

A handle's log on the server may run ahead of the worker's copy only by the tail of an operation the worker gave up
on (a cancelled generation, a request whose answer was lost): every operation carries the length the worker expects,
and the server crops such a tail first. A handle released, or lost with a restarted engine process, answers
`stale_handle`, and the worker opens it again from its copy (rebuilt along its chunk recipe, so bit for bit).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import assert_never

from app.embeddings import Embedder
from app.engine.priority import engine_priority, measure_wait
from app.engine.process import messages as m
from app.engine.process import wire
from app.engine.process.wire import StaleHandle
from app.engine.protocol import CacheHandle, KVEngine
from app.errors import NotReady

log = logging.getLogger(__name__)

MAX_HANDLES = 4096  # least recently used handles past this are released (a worker that needs one opens it again)

TokenSink = Callable[[list[int]], None]


@dataclass
class _Held:
    handle: CacheHandle
    version: int = 0  # bumped by every change of the log or the salt: a worker's copy at another version is stale


class EngineServer:
    def __init__(self, engine: KVEngine, embedder: Embedder, *, model_dir: Path | None = None) -> None:
        self.engine = engine
        self.embedder = embedder
        # Where the workers load the tokenizer from: None until the engine process has resolved it, after the engine
        # started (the loader sets it last).
        self.model_dir = model_dir
        self.error: str | None = None  # why the engine failed to start
        self._handles: OrderedDict[int, _Held] = OrderedDict()
        self._by_key: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._writers: set[asyncio.StreamWriter] = set()

    async def serve(self, socket_path: Path) -> asyncio.AbstractServer:
        return await asyncio.start_unix_server(self._connection, path=str(socket_path), limit=wire.MAX_FRAME_BYTES)

    @property
    def ready(self) -> bool:
        """Once the whole load is done, not when the engine alone is: between the engine's start and the model
        directory's resolution a worker must hear "loading" (it asks again), not fail."""
        return self.engine.ready and self.error is None and self.model_dir is not None

    # -- connections ------------------------------------------------------------------------------------------------

    def disconnect_all(self) -> None:
        """Drop every worker's connection at once (shutdown; a listening server's close() leaves them open)."""
        for writer in list(self._writers):
            writer.transport.abort()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        running: dict[int, asyncio.Task[None]] = {}
        loop = asyncio.get_running_loop()
        try:
            while (message := await wire.read(reader)) is not None:
                try:
                    frame = wire.parse_call(message)
                except wire.ProtocolError as exc:
                    if exc.request_id is None:
                        raise  # a peer that does not speak the protocol: hang up
                    log.warning("malformed engine call", extra={"error": str(exc)})
                    _send(writer, wire.encode_failure(exc.request_id, exc))
                    continue
                if isinstance(frame, wire.Cancel):
                    task = running.get(frame.id)
                    if task is not None:
                        task.cancel()
                    continue
                task = asyncio.create_task(self._answer(frame, writer, loop))
                running[frame.id] = task
                task.add_done_callback(partial(_forget, running, frame.id))
        except (ConnectionError, wire.FrameTooLarge, wire.ProtocolError) as exc:
            log.warning("engine client connection dropped", extra={"error": f"{type(exc).__name__}: {exc}"})
        finally:
            for task in list(running.values()):
                task.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, call: wire.Call, writer: asyncio.StreamWriter, loop: asyncio.AbstractEventLoop) -> None:
        def on_tokens(tokens: list[int]) -> None:  # called from the engine's thread (hf) or the loop (vLLM)
            loop.call_soon_threadsafe(_send, writer, wire.encode_tokens(call.id, tokens))

        try:
            # The operation runs at the priority of the worker task that sent it, and its wait goes back with it.
            with engine_priority(call.priority), measure_wait() as waited:
                reply = await self._run(call.request, on_tokens)
            frame = wire.encode_done(call.id, reply, waited.seconds if waited.calls else None)
        except asyncio.CancelledError:
            return  # the client gave up on it and expects no answer
        except Exception as exc:
            if wire.kind_of(exc) is wire.ErrorKind.INTERNAL:
                log.exception("engine operation failed", extra={"op": call.request.op.value})
            frame = wire.encode_failure(call.id, exc)
        _send(writer, frame)
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    async def _run(self, request: m.AnyRequest, on_tokens: TokenSink) -> object:
        match request:
            case m.Hello():
                return self._hello()
            case m.Attach():
                return self._attach(request)
            case m.Open():
                return await self._open(request)
            case m.Prefill():
                return await self._prefill(request)
            case m.Generate():
                return await self._generate(request, on_tokens)
            case m.Crop():
                return await self._crop(request)
            case m.Fork():
                return await self._fork(request)
            case m.Release():
                await self._release(request.handles)
                return m.Empty()
            case m.Drop():
                handle_id = self._by_key.get(request.key)
                if handle_id is not None:
                    await self._release((handle_id,))
                return m.Empty()
            case m.Embed():
                return m.Embedded(await self.embedder.embed(list(request.texts)))
            case m.Stats():
                return m.EngineStats(handles=len(self._handles), sessions=len(self._by_key))
            case _:
                assert_never(request)

    def _loaded(self) -> None:
        """An operation on caches needs the engine loaded: until then the worker hears "not ready" (503, retried)."""
        if not self.ready:
            detail = f"the engine failed to start: {self.error}" if self.error else "the engine is not loaded (yet)"
            raise NotReady(detail)

    # -- handles ----------------------------------------------------------------------------------------------------

    def _held(self, at: m.At) -> _Held:
        """The handle named by a request, checked against the length the client expects."""
        self._loaded()
        held = self._handles.get(at.handle)
        if held is None:
            raise StaleHandle(f"no handle {at.handle}")
        self._handles.move_to_end(at.handle)
        if at.expect > len(held.handle.tokens):
            raise StaleHandle(f"handle {at.handle} holds {len(held.handle.tokens)} tokens, not {at.expect}")
        return held

    async def _align(self, held: _Held, at: m.At) -> None:
        """Cut the handle's log back to the length the client expects (a tail an abandoned operation left) and move
        it to the client's salt."""
        if at.expect < len(held.handle.tokens):
            await self.engine.crop(held.handle, at.expect)
            held.version += 1
        if held.handle.salt != at.salt:
            self.engine.resalt(held.handle, at.salt)
            held.version += 1

    def _register(self, handle: CacheHandle) -> tuple[int, _Held]:
        handle_id = next(self._ids)
        held = self._handles[handle_id] = _Held(handle)
        previous = self._by_key.get(handle.session_key)
        self._by_key[handle.session_key] = handle_id
        if previous is not None:
            self._handles.pop(previous, None)  # a session keeps one cache: the newest handle opened for it
        while len(self._handles) > MAX_HANDLES:
            old_id, old = self._handles.popitem(last=False)
            if self._by_key.get(old.handle.session_key) == old_id:
                del self._by_key[old.handle.session_key]
        return handle_id, held

    def _state(self, held: _Held) -> m.HandleState:
        chunks = self.engine.chunks(held.handle) if self.engine.records_chunks else []
        return m.HandleState(version=held.version, length=len(held.handle.tokens), chunks=tuple(chunks))

    # -- operations -------------------------------------------------------------------------------------------------

    def _hello(self) -> m.Greeting:
        engine, ready = self.engine, self.ready
        return m.Greeting(
            name=engine.name, model_id=engine.model_id, ready=ready, error=self.error,
            exactness=m.exactness_of(engine.exactness) if ready else None, records_chunks=engine.records_chunks,
            rereads_replies=engine.rereads_replies, max_context_tokens=engine.max_context_tokens,
            model_dir=str(self.model_dir) if ready else None,
        )

    def _attach(self, request: m.Attach) -> m.Attached:
        """The session's handle: only its id when the client's copy (`known`) is current, else its whole state."""
        self._loaded()
        handle_id = self._by_key.get(request.key)
        held = None if handle_id is None else self._handles.get(handle_id)
        if held is None or handle_id is None:
            return m.Attached()
        if request.known == m.HandleRef(handle_id, held.version):
            return m.Attached(handle_id)
        copy = m.HandleCopy(tokens=tuple(held.handle.tokens), salt=held.handle.salt, state=self._state(held))
        return m.Attached(handle_id, copy)

    async def _open(self, request: m.Open) -> m.Opened:
        self._loaded()
        handle = await self.engine.open(
            request.key, salt=request.salt, tokens=list(request.tokens),
            chunks=list(request.chunks) if request.chunks else None,
        )
        handle_id, held = self._register(handle)
        return m.Opened(handle_id, self._state(held))

    async def _prefill(self, request: m.Prefill) -> m.Prefilled:
        held = self._held(request.at)
        await self._align(held, request.at)
        usage = await self.engine.prefill(held.handle, list(request.tokens))
        held.version += 1
        return m.Prefilled(usage, self._state(held))

    async def _generate(self, request: m.Generate, on_tokens: TokenSink) -> m.Generated:
        held = self._held(request.at)
        await self._align(held, request.at)
        held.version += 1  # even a cancelled generation may have appended tokens
        draft = None if request.draft is None else list(request.draft)
        generation = await self.engine.generate(
            held.handle, request.sampling, on_tokens if request.stream else None, draft=draft
        )
        held.version += 1
        return m.Generated(generation, self._state(held))

    async def _crop(self, request: m.Crop) -> m.Changed:
        held = self._held(request.at)
        await self._align(held, request.at)
        await self.engine.crop(held.handle, request.n)
        held.version += 1
        return m.Changed(self._state(held))

    async def _fork(self, request: m.Fork) -> m.Forked:
        held = self._held(request.at)
        await self._align(held, request.at)
        twin = await self.engine.fork(held.handle, request.key)
        handle_id, twin_held = self._register(twin)
        return m.Forked(handle_id, twin=self._state(twin_held), state=self._state(held))

    async def _release(self, handle_ids: tuple[int, ...]) -> None:
        for handle_id in handle_ids:
            held = self._handles.pop(handle_id, None)
            if held is None:
                continue
            if self._by_key.get(held.handle.session_key) == handle_id:
                del self._by_key[held.handle.session_key]
            await self.engine.release(held.handle)


def _send(writer: asyncio.StreamWriter, frame: bytes) -> None:
    if not writer.is_closing():
        writer.write(frame)


def _forget(running: dict[int, asyncio.Task[None]], request_id: int, _: asyncio.Task[None]) -> None:
    running.pop(request_id, None)
