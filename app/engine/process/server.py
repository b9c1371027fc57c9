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
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from app.embeddings import Embedder
from app.engine.priority import Priority, engine_priority, measure_wait
from app.engine.process import wire
from app.engine.process.wire import StaleHandle
from app.engine.protocol import CacheHandle, KVEngine

log = logging.getLogger(__name__)

MAX_HANDLES = 4096  # least recently used handles past this are released (a worker that needs one opens it again)


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
        self._ops: dict[str, Callable[[dict[str, Any], Callable[[list[int]], None]], Awaitable[dict[str, Any]]]] = {
            "hello": self._hello, "attach": self._attach, "open": self._open, "prefill": self._prefill,
            "generate": self._generate, "crop": self._crop, "fork": self._fork, "release": self._release,
            "drop": self._drop, "embed": self._embed, "stats": self._stats,
        }

    async def serve(self, socket_path: Path) -> asyncio.AbstractServer:
        return await asyncio.start_unix_server(self._connection, path=str(socket_path), limit=wire.MAX_FRAME_BYTES)

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
                request_id = int(message["id"])
                if message.get("op") == "cancel":
                    task = running.get(request_id)
                    if task is not None:
                        task.cancel()
                    continue
                task = asyncio.create_task(self._answer(message, writer, loop))
                running[request_id] = task
                task.add_done_callback(partial(_forget, running, request_id))
        except (ConnectionError, wire.FrameTooLarge, ValueError) as exc:
            log.warning("engine client connection dropped", extra={"error": type(exc).__name__})
        finally:
            for task in list(running.values()):
                task.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(
        self, message: dict[str, Any], writer: asyncio.StreamWriter, loop: asyncio.AbstractEventLoop
    ) -> None:
        request_id = message["id"]

        def send(frame: dict[str, Any]) -> None:
            if not writer.is_closing():
                writer.write(wire.encode({"id": request_id, **frame}))

        def on_tokens(tokens: list[int]) -> None:  # called from the engine's thread (hf) or the loop (vLLM)
            loop.call_soon_threadsafe(send, {"tokens": list(tokens)})

        op = self._ops.get(str(message.get("op")))
        args = message.get("args") or {}
        try:
            if op is None:
                raise ValueError(f"unknown engine operation {message.get('op')!r}")
            # The operation runs at the priority of the worker task that sent it, and its wait goes back with it.
            with engine_priority(Priority.from_wire(args.get("priority"))), measure_wait() as waited:
                result = await op(args, on_tokens)
        except asyncio.CancelledError:
            return  # the client gave up on it and expects no answer
        except Exception as exc:
            if wire.error_of(exc)["kind"] == "internal":
                log.exception("engine operation failed", extra={"op": message.get("op")})
            send({"error": wire.error_of(exc)})
        else:
            send({"ok": result, "waited_s": waited.seconds} if waited.calls else {"ok": result})
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    # -- handles ----------------------------------------------------------------------------------------------------

    def _held(self, args: dict[str, Any]) -> _Held:
        """The handle named by a request, with its log cut back to the length the client expects (a tail an
        abandoned operation left) and moved to the client's salt."""
        held = self._handles.get(int(args["handle"]))
        if held is None:
            raise StaleHandle(f"no handle {args['handle']}")
        self._handles.move_to_end(int(args["handle"]))
        expect = int(args["expect"])
        if expect > len(held.handle.tokens):
            raise StaleHandle(f"handle {args['handle']} holds {len(held.handle.tokens)} tokens, not {expect}")
        return held

    async def _align(self, held: _Held, args: dict[str, Any]) -> None:
        if int(args["expect"]) < len(held.handle.tokens):
            await self.engine.crop(held.handle, int(args["expect"]))
            held.version += 1
        salt = args.get("salt")
        if held.handle.salt != salt:
            self.engine.resalt(held.handle, salt)
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

    def _state(self, held: _Held) -> dict[str, Any]:
        return {"version": held.version, "length": len(held.handle.tokens),
                "chunks": self.engine.chunks(held.handle) if self.engine.records_chunks else []}

    # -- operations -------------------------------------------------------------------------------------------------

    async def _hello(self, args: dict[str, Any], _: Callable[[list[int]], None]) -> dict[str, Any]:
        # Ready once the whole load is done, not when the engine alone is: a hello between the engine's start and the
        # model directory's resolution must say "loading" (a worker retries), not fail.
        engine, model_dir = self.engine, self.model_dir
        ready = engine.ready and self.error is None and model_dir is not None
        return {
            "name": engine.name, "model_id": engine.model_id, "ready": ready, "error": self.error,
            "exactness": engine.exactness if ready else None, "records_chunks": engine.records_chunks,
            "max_context_tokens": engine.max_context_tokens, "model_dir": str(model_dir) if ready else None,
        }

    async def _attach(self, args: dict[str, Any], _: Callable[[list[int]], None]) -> dict[str, Any]:
        """The session's handle: only its version when the client's copy (`known`: [id, version]) is current, else
        its whole state (None when the engine holds none for the session)."""
        handle_id = self._by_key.get(str(args["key"]))
        held = None if handle_id is None else self._handles.get(handle_id)
        if held is None or handle_id is None:
            return {"handle": None}
        known = args.get("known")
        if known == [handle_id, held.version]:
            return {"handle": handle_id, "current": True}
        return {"handle": handle_id, "current": False, "tokens": list(held.handle.tokens), "salt": held.handle.salt,
                **self._state(held)}

    async def _open(self, args: dict[str, Any], _: Callable[[list[int]], None]) -> dict[str, Any]:
        handle = await self.engine.open(
            str(args["key"]), salt=args.get("salt"), tokens=[int(t) for t in args.get("tokens") or []],
            chunks=[int(c) for c in args["chunks"]] if args.get("chunks") else None,
        )
        handle_id, held = self._register(handle)
        return {"handle": handle_id, **self._state(held)}

    async def _prefill(self, args: dict[str, Any], _: Callable[[list[int]], None]) -> dict[str, Any]:
        held = self._held(args)
        await self._align(held, args)
        usage = await self.engine.prefill(held.handle, [int(t) for t in args["tokens"]])
        held.version += 1
        return {"usage": asdict(usage), **self._state(held)}

    async def _generate(self, args: dict[str, Any], on_tokens: Callable[[list[int]], None]) -> dict[str, Any]:
        held = self._held(args)
        await self._align(held, args)
        held.version += 1  # even a cancelled generation may have appended tokens
        sink = on_tokens if args.get("stream") else None
        generation = await self.engine.generate(held.handle, wire.sampling_from_wire(args["sampling"]), sink)
        held.version += 1
        return {"generation": wire.generation_to_wire(generation), **self._state(held)}

    async def _crop(self, args: dict[str, Any], _: Callable[[list[int]], None]) -> dict[str, Any]:
        held = self._held(args)
        await self._align(held, args)
        await self.engine.crop(held.handle, int(args["n"]))
        held.version += 1
        return self._state(held)

    async def _fork(self, args: dict[str, Any], _: Callable[[list[int]], None]) -> dict[str, Any]:
        held = self._held(args)
        await self._align(held, args)
        twin = await self.engine.fork(held.handle, str(args["key"]))
        handle_id, twin_held = self._register(twin)
        return {"handle": handle_id, **self._state(twin_held)}

    async def _release(self, args: dict[str, Any], _: Callable[[list[int]], None]) -> dict[str, Any]:
        for handle_id in args.get("handles") or []:
            held = self._handles.pop(int(handle_id), None)
            if held is None:
                continue
            if self._by_key.get(held.handle.session_key) == int(handle_id):
                del self._by_key[held.handle.session_key]
            await self.engine.release(held.handle)
        return {}

    async def _drop(self, args: dict[str, Any], on_tokens: Callable[[list[int]], None]) -> dict[str, Any]:
        """Forget the session's cache (its log is in doubt, or the session is gone)."""
        handle_id = self._by_key.get(str(args["key"]))
        return {} if handle_id is None else await self._release({"handles": [handle_id]}, on_tokens)

    async def _embed(self, args: dict[str, Any], _: Callable[[list[int]], None]) -> dict[str, Any]:
        return {"vectors": await self.embedder.embed([str(t) for t in args["texts"]])}

    async def _stats(self, args: dict[str, Any], _: Callable[[list[int]], None]) -> dict[str, Any]:
        return {"handles": len(self._handles), "sessions": len(self._by_key)}


def _forget(running: dict[int, asyncio.Task[None]], request_id: int, _: asyncio.Task[None]) -> None:
    running.pop(request_id, None)
