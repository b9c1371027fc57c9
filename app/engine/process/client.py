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
next token.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.engine.chat import ChatMLTemplate, load_chat_template
from app.engine.priority import current_priority, note_wait
from app.engine.process import wire
from app.engine.process.wire import StaleHandle
from app.engine.protocol import CacheHandle, ChatTemplate, Exactness, Generation, Sampling, TokenSink, TokenUsage
from app.errors import EngineUnavailable, NotReady

log = logging.getLogger(__name__)

_RECONNECT_S = 0.5  # how often a worker looks for a (re)started engine process
_CONNECT_TIMEOUT_S = 2.0
_GONE = -1  # the epoch of a handle the engine process no longer holds as this copy says


@dataclass
class _Remote:
    """What a worker knows of an engine-process handle."""

    id: int
    epoch: int  # the connection it was opened on: another epoch means another engine process
    version: int = 0
    chunks: list[int] = field(default_factory=list)


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    epoch: int
    pending: dict[int, tuple[asyncio.Future[dict[str, Any]], Callable[[dict[str, Any]], None] | None]] = field(
        default_factory=dict
    )
    task: asyncio.Task[None] | None = None


class EngineClient:
    """A KVEngine over the engine process's socket, with the embedder behind it too (`embed`)."""

    def __init__(self, socket_path: Path, *, name: str, model_id: str) -> None:
        self.socket_path = socket_path
        self.name = name  # what the engine process serves, reported by hello; the setting's until then
        self.model_id = model_id
        self._hello: dict[str, Any] = {}
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
        return self._chat is not None and self._conn is not None and bool(self._hello.get("ready"))

    @property
    def exactness(self) -> Exactness:
        value = self._hello.get("exactness")
        if value not in ("exact", "unbatched", "batched", "batch-invariant"):
            raise AttributeError("the engine process is not ready")
        exactness: Exactness = value
        return exactness

    @property
    def max_context_tokens(self) -> int | None:
        limit = self._hello.get("max_context_tokens")
        return int(limit) if isinstance(limit, int) else None

    @property
    def records_chunks(self) -> bool:
        return bool(self._hello.get("records_chunks"))

    async def start(self) -> None:
        """Wait for the engine process to be up with its model loaded (it may be starting), then load the tokenizer."""
        while not self._closed:
            await self.refresh()
            error = self._hello.get("error")
            if error:
                raise RuntimeError(f"the engine process failed to start: {error}")
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
            hello = await self._call("hello", {})
            if hello.get("ready") and self._chat is None:
                self._chat, _ = await asyncio.to_thread(load_chat_template, Path(str(hello["model_dir"])))
            self.name, self.model_id = str(hello["name"]), str(hello["model_id"])
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
        answer = await self._call("open", {
            "key": handle.session_key, "salt": handle.salt, "tokens": handle.tokens, "chunks": chunks,
        })
        assert self._conn is not None
        remote = _Remote(int(answer["handle"]), self._conn.epoch)
        self._update(handle, remote, answer)
        handle.state = remote
        return remote

    async def attach(self, session_key: str, known: CacheHandle | None) -> CacheHandle | None:
        """The engine process's handle for the session, as a copy: `known` itself when it is current."""
        remote = known.state if known is not None else None
        current = None
        if isinstance(remote, _Remote) and self._conn is not None and remote.epoch == self._conn.epoch:
            current = [remote.id, remote.version]
        answer = await self._call("attach", {"key": session_key, "known": current})
        if answer.get("handle") is None:
            return None
        if answer.get("current"):
            return known
        assert self._conn is not None
        tokens = [int(t) for t in answer["tokens"]]
        handle = CacheHandle(session_key=session_key, salt=answer.get("salt"), tokens=tokens)
        fresh = _Remote(int(answer["handle"]), self._conn.epoch)
        self._update(handle, fresh, answer)
        handle.state = fresh
        return handle

    async def drop(self, session_key: str) -> None:
        with contextlib.suppress(EngineUnavailable):
            await self._call("drop", {"key": session_key})

    def chunks(self, handle: CacheHandle) -> list[int]:
        remote = handle.state
        return list(remote.chunks) if isinstance(remote, _Remote) else []

    def resalt(self, handle: CacheHandle, salt: str | None) -> None:
        handle.salt = salt  # every call carries the salt: the engine process moves its handle at the next one

    async def prefill(self, handle: CacheHandle, token_ids: list[int]) -> TokenUsage:
        answer = await self._on(handle, "prefill", {"tokens": list(token_ids)})
        handle.tokens.extend(token_ids)
        self._check(handle, answer)
        return wire.usage_from_wire(answer["usage"])

    async def generate(
        self, handle: CacheHandle, sampling: Sampling, on_tokens: TokenSink | None = None
    ) -> Generation:
        def frame(message: dict[str, Any]) -> None:
            if on_tokens is not None and message.get("tokens"):
                on_tokens([int(t) for t in message["tokens"]])

        answer = await self._on(handle, "generate", {
            "sampling": wire.sampling_to_wire(sampling), "stream": on_tokens is not None,
        }, frame)
        generation = wire.generation_from_wire(answer["generation"])
        handle.tokens.extend(generation.token_ids)
        self._check(handle, answer)
        return generation

    async def crop(self, handle: CacheHandle, n_tokens: int) -> None:
        if not 0 <= n_tokens <= len(handle.tokens):
            raise ValueError(f"crop to {n_tokens} tokens: the log holds {len(handle.tokens)}")
        answer = await self._on(handle, "crop", {"n": n_tokens})
        del handle.tokens[n_tokens:]
        self._check(handle, answer)

    async def fork(self, handle: CacheHandle, session_key: str) -> CacheHandle:
        answer = await self._on(handle, "fork", {"key": session_key})
        assert self._conn is not None
        twin = CacheHandle(session_key=session_key, salt=handle.salt, tokens=list(handle.tokens))
        remote = _Remote(int(answer["handle"]), self._conn.epoch)
        self._update(twin, remote, answer)
        twin.state = remote
        return twin

    async def release(self, handle: CacheHandle) -> None:
        remote = handle.state
        if isinstance(remote, _Remote) and self._conn is not None and remote.epoch == self._conn.epoch:
            with contextlib.suppress(EngineUnavailable):
                await self._call("release", {"handles": [remote.id]})

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        answer = await self._call("embed", {"texts": list(texts)})
        return [[float(x) for x in vector] for vector in answer["vectors"]]

    async def stats(self) -> dict[str, Any]:
        return await self._call("stats", {})

    async def _on(
        self, handle: CacheHandle, op: str, args: dict[str, Any],
        on_frame: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """A call on the engine process's copy of `handle`, opened again from this copy when it is gone."""
        for attempt in range(2):
            remote = handle.state
            if not isinstance(remote, _Remote) or self._conn is None or remote.epoch != self._conn.epoch:
                await self._connected()
                remote = await self._open_remote(handle, self.chunks(handle) or None)
            try:
                answer = await self._call(op, {
                    "handle": remote.id, "expect": len(handle.tokens), "salt": handle.salt, **args,
                }, on_frame)
            except StaleHandle:
                if attempt:
                    raise EngineUnavailable("the engine process keeps losing this session's cache; retry") from None
                remote.epoch = _GONE  # opened again from this copy, along its recipe, on the next attempt
                continue
            remote.version, remote.chunks = int(answer["version"]), [int(c) for c in answer.get("chunks") or []]
            return answer
        raise AssertionError("unreachable")

    def _update(self, handle: CacheHandle, remote: _Remote, answer: dict[str, Any]) -> None:
        remote.version, remote.chunks = int(answer["version"]), [int(c) for c in answer.get("chunks") or []]
        self._check(handle, answer)

    def _check(self, handle: CacheHandle, answer: dict[str, Any]) -> None:
        if int(answer["length"]) != len(handle.tokens):
            if isinstance(handle.state, _Remote):
                handle.state.epoch = _GONE  # out of step: the next call opens the engine's copy again from this one
            raise RuntimeError(
                f"the engine process holds {answer['length']} tokens for {handle.session_key!r}, the worker "
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
                waiting = conn.pending.get(int(message["id"]))
                if waiting is None:
                    continue
                future, on_frame = waiting
                if "tokens" in message and "ok" not in message:
                    if on_frame is not None:
                        on_frame(message)
                elif not future.done():
                    future.set_result(message)
        except (ConnectionError, wire.FrameTooLarge, ValueError) as exc:
            log.warning("engine process connection lost", extra={"error": type(exc).__name__})
        finally:
            self._lost(conn)

    def _lost(self, conn: _Connection) -> None:
        """The engine process is gone (or restarting): fail what waits on it, and look for it again."""
        if self._conn is conn:
            self._conn = None
            self._hello = {**self._hello, "ready": False}
        for future, _ in conn.pending.values():
            if not future.done():
                future.set_exception(EngineUnavailable("the engine process went away during the request; retry"))
        conn.writer.close()

    async def _disconnect(self, conn: _Connection) -> None:
        conn.writer.close()
        if conn.task is not None:
            conn.task.cancel()
            await asyncio.gather(conn.task, return_exceptions=True)

    async def _call(
        self, op: str, args: dict[str, Any], on_frame: Callable[[dict[str, Any]], None] | None = None
    ) -> dict[str, Any]:
        conn = await self._connected()
        request_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        conn.pending[request_id] = (future, on_frame)
        # Every operation runs in the engine process at the calling task's priority (app/engine/priority.py).
        args = {**args, "priority": int(current_priority())}
        try:
            conn.writer.write(wire.encode({"id": request_id, "op": op, "args": args}))
            await conn.writer.drain()
            message = await future
        except asyncio.CancelledError:
            if not conn.writer.is_closing():
                conn.writer.write(wire.encode({"id": request_id, "op": "cancel"}))
            raise
        except ConnectionError:
            conn.pending.pop(request_id, None)
            self._lost(conn)
            raise EngineUnavailable("the engine process went away during the request; retry") from None
        finally:
            conn.pending.pop(request_id, None)
        if "error" in message:
            raise _error(message["error"])
        if "waited_s" in message:  # what the engine measured this operation waiting for it (hf)
            note_wait(float(message["waited_s"]))
        result: dict[str, Any] = message["ok"]
        return result


def _error(error: dict[str, Any]) -> Exception:
    kind, message = error.get("kind"), str(error.get("message", ""))
    if kind == "stale_handle":
        return StaleHandle(message)
    if kind == "invalid":
        return ValueError(message)
    if kind == "not_ready":
        return NotReady(message, headers={"Retry-After": "5"})
    return RuntimeError(f"engine process: {message}")
