"""The engine as an HTTP worker reaches it: a KVEngine whose calls run in the engine process (server.py).

A handle here is a copy of the engine process's handle: its log (`tokens`), and in its state the remote id, the
version the copy was taken at and the chunk recipe. The copy is what the runtime reasons about (it compares logs with
the database without a round trip); every call tells the server the length it expects, and answers carry the new
length and recipe, so the copy and the original move together. A call that finds its handle gone (the engine process
restarted, or dropped it) opens it again from the copy, along the recipe, which rebuilds the cache bit for bit; the
caller never sees the difference.

The tokenizer is loaded here, from the model directory the engine process names (app/engine/tokenizer.py, without
torch), so blocks are rendered in the worker. If the engine process dies, calls in flight fail with
`EngineUnavailable` (503, `Retry-After`), `ready` turns False until it is back (the supervisor restarts it), and a
caller cancelled mid-call (a client that hung up) cancels the call in the engine process: a generation stops at its
next token. A failure in the engine process comes back as the exception its kind names (wire.py): a bad argument as
`ValueError`, the engine still loading as `NotReady`, anything unexpected as `EngineError` (500).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from app.engine.chat import ChatMLTemplate, load_chat_template
from app.engine.priority import current_priority, note_wait
from app.engine.process import messages as m
from app.engine.process import wire
from app.engine.process.wire import StaleHandle
from app.engine.protocol import CacheHandle, ChatTemplate, Exactness, Generation, Sampling, TokenSink, TokenUsage
from app.errors import EngineUnavailable

log = logging.getLogger(__name__)

_RECONNECT_S = 0.5  # how often a worker looks for a (re)started engine process
_CONNECT_TIMEOUT_S = 2.0
_GONE = -1  # the epoch of a handle the engine process no longer holds as this copy says

R = TypeVar("R")


class _Stated(Protocol):
    @property
    def state(self) -> m.HandleState: ...


S = TypeVar("S", bound=_Stated)


@dataclass
class _Remote:
    """What a worker knows of an engine-process handle."""

    id: int
    epoch: int  # the connection it was opened on: another epoch means another engine process
    version: int = 0
    chunks: list[int] = field(default_factory=list)


@dataclass
class _Pending:
    answer: asyncio.Future[wire.Done | wire.Failed]
    on_tokens: TokenSink | None


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    epoch: int
    pending: dict[int, _Pending] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None


class EngineClient:
    """A KVEngine over the engine process's socket, with the embedder behind it too (`embed`)."""

    def __init__(self, socket_path: Path, *, name: str, model_id: str) -> None:
        self.socket_path = socket_path
        self.name = name  # what the engine process serves, reported by hello; the setting's until then
        self.model_id = model_id
        self._hello: m.Greeting | None = None
        self._chat: ChatMLTemplate | None = None
        self._conn: _Connection | None = None
        self._epochs = itertools.count(1)
        self._ids = itertools.count(1)
        self._connecting = asyncio.Lock()
        self._refreshing = asyncio.Lock()  # start(), the keeper and requests ask at once; one hello and load at a time
        self._keeper: asyncio.Task[None] | None = None
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------------------------------------

    @property
    def chat(self) -> ChatTemplate:
        if self._chat is None:
            raise AttributeError("the engine process is not reached yet: its tokenizer loads in start()")
        return self._chat

    @property
    def ready(self) -> bool:
        return self._chat is not None and self._conn is not None and self._hello is not None and self._hello.ready

    @property
    def exactness(self) -> Exactness:
        if self._hello is None or self._hello.exactness is None:
            raise AttributeError("the engine process is not ready")
        return self._hello.exactness

    @property
    def max_context_tokens(self) -> int | None:
        return None if self._hello is None else self._hello.max_context_tokens

    @property
    def records_chunks(self) -> bool:
        return self._hello is not None and self._hello.records_chunks

    @property
    def rereads_replies(self) -> bool:
        return self._hello is not None and self._hello.rereads_replies

    async def start(self) -> None:
        """Wait for the engine process to be up with its model loaded (it may be starting), then load the tokenizer."""
        while not self._closed:
            await self.refresh()
            if self._hello is not None and self._hello.error:
                raise RuntimeError(f"the engine process failed to start: {self._hello.error}")
            if self.ready:
                self._keeper = asyncio.create_task(self._keep_connected(), name="engine-connection")
                log.info("engine process reached", extra={"engine": self.name, "model": self.model_id})
                return
            await asyncio.sleep(_RECONNECT_S)

    async def refresh(self) -> None:
        """Look again whether the engine process is up and ready (a request asks before it answers 503, so a worker
        never turns work away that the engine process could do)."""
        if self.ready or self._closed:
            return
        async with self._refreshing:
            if not self.ready and not self._closed:
                await self._ask_hello()

    async def _ask_hello(self) -> None:
        with contextlib.suppress(EngineUnavailable, OSError):
            await self._connected()
            hello = await self._call(m.Hello())
            if hello.ready and hello.model_dir is not None and self._chat is None:
                self._chat, _ = await asyncio.to_thread(load_chat_template, Path(hello.model_dir))
            self.name, self.model_id = hello.name, hello.model_id
            self._hello = hello

    async def close(self) -> None:
        self._closed = True
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        if self._conn is not None:
            await self._disconnect(self._conn)

    async def _keep_connected(self) -> None:
        """Reach a restarted engine process as soon as it is up, so readiness recovers without a request."""
        while not self._closed:
            await asyncio.sleep(_RECONNECT_S)
            await self.refresh()

    # -- handles ------------------------------------------------------------------------------------------------------

    async def open(
        self,
        session_key: str,
        *,
        salt: str | None = None,
        tokens: list[int] | None = None,
        chunks: list[int] | None = None,
    ) -> CacheHandle:
        handle = CacheHandle(session_key=session_key, salt=salt, tokens=list(tokens or []))
        await self._open_remote(handle, chunks)
        return handle

    async def _open_remote(self, handle: CacheHandle, chunks: list[int] | None) -> _Remote:
        opened = await self._call(m.Open(
            handle.session_key, handle.salt, tuple(handle.tokens), tuple(chunks) if chunks is not None else None,
        ))
        return self._adopt(handle, opened.handle, opened.state)

    def _adopt(self, handle: CacheHandle, handle_id: int, state: m.HandleState) -> _Remote:
        """Make `handle` the copy of the engine process's handle `handle_id`, now in `state`."""
        assert self._conn is not None
        remote = _Remote(handle_id, self._conn.epoch)
        self._update(handle, remote, state)
        handle.state = remote
        return remote

    async def attach(self, session_key: str, known: CacheHandle | None) -> CacheHandle | None:
        """The engine process's handle for the session, as a copy: `known` itself when it is current."""
        remote = known.state if known is not None else None
        current = None
        if isinstance(remote, _Remote) and self._conn is not None and remote.epoch == self._conn.epoch:
            current = m.HandleRef(remote.id, remote.version)
        attached = await self._call(m.Attach(session_key, current))
        if attached.handle is None:
            return None
        if attached.copy is None:
            return known
        copy = attached.copy
        handle = CacheHandle(session_key=session_key, salt=copy.salt, tokens=list(copy.tokens))
        self._adopt(handle, attached.handle, copy.state)
        return handle

    async def drop(self, session_key: str) -> None:
        with contextlib.suppress(EngineUnavailable):
            await self._call(m.Drop(session_key))

    def chunks(self, handle: CacheHandle) -> list[int]:
        remote = handle.state
        return list(remote.chunks) if isinstance(remote, _Remote) else []

    def resalt(self, handle: CacheHandle, salt: str | None) -> None:
        handle.salt = salt  # every call carries the salt: the engine process moves its handle at the next one

    async def prefill(self, handle: CacheHandle, token_ids: list[int]) -> TokenUsage:
        tokens = tuple(token_ids)
        prefilled = await self._on(handle, lambda at: m.Prefill(at, tokens))
        handle.tokens.extend(tokens)
        self._check(handle, prefilled.state)
        return prefilled.usage

    async def generate(
        self, handle: CacheHandle, sampling: Sampling, on_tokens: TokenSink | None = None,
        *, draft: list[int] | None = None,
    ) -> Generation:
        stream = on_tokens is not None
        hint = None if draft is None else tuple(draft)
        generated = await self._on(handle, lambda at: m.Generate(at, sampling, stream, hint), on_tokens)
        generation = generated.generation
        handle.tokens.extend(generation.token_ids)
        self._check(handle, generated.state)
        return generation

    async def crop(self, handle: CacheHandle, n_tokens: int) -> None:
        if not 0 <= n_tokens <= len(handle.tokens):
            raise ValueError(f"crop to {n_tokens} tokens: the log holds {len(handle.tokens)}")
        changed = await self._on(handle, lambda at: m.Crop(at, n_tokens))
        del handle.tokens[n_tokens:]
        self._check(handle, changed.state)

    async def fork(self, handle: CacheHandle, session_key: str) -> CacheHandle:
        forked = await self._on(handle, lambda at: m.Fork(at, session_key))
        twin = CacheHandle(session_key=session_key, salt=handle.salt, tokens=list(handle.tokens))
        self._adopt(twin, forked.handle, forked.twin)
        return twin

    async def release(self, handle: CacheHandle) -> None:
        remote = handle.state
        if isinstance(remote, _Remote) and self._conn is not None and remote.epoch == self._conn.epoch:
            with contextlib.suppress(EngineUnavailable):
                await self._call(m.Release((remote.id,)))

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        return (await self._call(m.Embed(tuple(texts)))).vectors

    async def stats(self) -> dict[str, Any]:
        stats: m.EngineStats = await self._call(m.Stats())
        return asdict(stats)

    async def _on(
        self, handle: CacheHandle, request: Callable[[m.At], m.Request[S]], on_tokens: TokenSink | None = None
    ) -> S:
        """A call on the engine process's copy of `handle`, opened again from this copy when it is gone."""
        for attempt in range(2):
            remote = handle.state
            if not isinstance(remote, _Remote) or self._conn is None or remote.epoch != self._conn.epoch:
                await self._connected()
                remote = await self._open_remote(handle, self.chunks(handle) or None)
            try:
                answer = await self._call(request(m.At(remote.id, len(handle.tokens), handle.salt)), on_tokens)
            except StaleHandle:
                if attempt:
                    raise EngineUnavailable("the engine process keeps losing this session's cache; retry") from None
                remote.epoch = _GONE  # opened again from this copy, along its recipe, on the next attempt
                continue
            remote.version, remote.chunks = answer.state.version, list(answer.state.chunks)
            return answer
        raise AssertionError("unreachable")

    def _update(self, handle: CacheHandle, remote: _Remote, state: m.HandleState) -> None:
        remote.version, remote.chunks = state.version, list(state.chunks)
        self._check(handle, state)

    def _check(self, handle: CacheHandle, state: m.HandleState) -> None:
        if state.length != len(handle.tokens):
            if isinstance(handle.state, _Remote):
                handle.state.epoch = _GONE  # out of step: the next call opens the engine's copy again from this one
            raise RuntimeError(
                f"the engine process holds {state.length} tokens for {handle.session_key!r}, the worker "
                f"{len(handle.tokens)}"
            )

    # -- the socket ---------------------------------------------------------------------------------------------------

    async def _connected(self) -> _Connection:
        if self._conn is not None:
            return self._conn
        async with self._connecting:
            if self._conn is not None:
                return self._conn
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_unix_connection(str(self.socket_path), limit=wire.MAX_FRAME_BYTES),
                    _CONNECT_TIMEOUT_S,
                )
            except (OSError, TimeoutError):
                raise EngineUnavailable("the engine process is not reachable (starting or restarting)") from None
            conn = _Connection(reader, writer, next(self._epochs))
            conn.task = asyncio.create_task(self._read(conn), name="engine-replies")
            self._conn = conn
            return conn

    async def _read(self, conn: _Connection) -> None:
        try:
            while (message := await wire.read(conn.reader)) is not None:
                try:
                    answer = wire.parse_answer(message)
                except wire.ProtocolError as exc:
                    if exc.request_id is None:
                        raise
                    self._fail(conn, exc.request_id, exc)  # that call fails; the others go on
                    continue
                waiting = conn.pending.get(answer.id)
                if waiting is None:
                    continue
                if isinstance(answer, wire.Tokens):
                    if waiting.on_tokens is not None and answer.tokens:
                        waiting.on_tokens(answer.tokens)
                elif not waiting.answer.done():
                    waiting.answer.set_result(answer)
        except (ConnectionError, wire.FrameTooLarge, wire.ProtocolError) as exc:
            log.warning("engine process connection lost", extra={"error": f"{type(exc).__name__}: {exc}"})
        finally:
            self._lost(conn)

    @staticmethod
    def _fail(conn: _Connection, request_id: int, exc: Exception) -> None:
        waiting = conn.pending.get(request_id)
        if waiting is not None and not waiting.answer.done():
            waiting.answer.set_exception(exc)

    def _lost(self, conn: _Connection) -> None:
        """The engine process is gone (or restarting): fail what waits on it, and look for it again."""
        if self._conn is conn:
            self._conn = None
            if self._hello is not None:
                self._hello = replace(self._hello, ready=False)
        for waiting in conn.pending.values():
            if not waiting.answer.done():
                waiting.answer.set_exception(
                    EngineUnavailable("the engine process went away during the request; retry")
                )
        conn.writer.close()

    async def _disconnect(self, conn: _Connection) -> None:
        conn.writer.close()
        if conn.task is not None:
            conn.task.cancel()
            await asyncio.gather(conn.task, return_exceptions=True)

    async def _call(self, request: m.Request[R], on_tokens: TokenSink | None = None) -> R:
        conn = await self._connected()
        request_id = next(self._ids)
        answer: asyncio.Future[wire.Done | wire.Failed] = asyncio.get_running_loop().create_future()
        conn.pending[request_id] = _Pending(answer, on_tokens)
        # Every operation runs in the engine process at the calling task's priority (app/engine/priority.py).
        try:
            conn.writer.write(wire.encode_call(request_id, request, current_priority()))
            await conn.writer.drain()
            outcome = await answer
        except asyncio.CancelledError:
            if not conn.writer.is_closing():
                conn.writer.write(wire.encode_cancel(request_id))
            raise
        except ConnectionError:
            conn.pending.pop(request_id, None)
            self._lost(conn)
            raise EngineUnavailable("the engine process went away during the request; retry") from None
        finally:
            conn.pending.pop(request_id, None)
        if isinstance(outcome, wire.Failed):
            raise outcome.error()
        if outcome.waited_s is not None:  # what the engine measured this operation waiting for it (hf)
            note_wait(outcome.waited_s)
        return outcome.reply(request)
