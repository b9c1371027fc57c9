"""The engine process's wire format: typed messages in length-prefixed JSON frames over a Unix socket, many requests
in flight.

A frame is a 4-byte big-endian length and a JSON object. Every operation is one frozen dataclass (messages.py:
`Prefill`, `Generate`, ...), named by an `Op`, shared by the client (client.py) and the server (server.py);
`Request[R]` says that its answer is an `R` (`Prefill` is answered by a `Prefilled`). The JSON is checked against the
dataclasses' field types once, where it is read (`parse_call`, `parse_answer`, `Done.reply`; codec.py): a message
that does not fit is a `ProtocolError`, never a KeyError or ValueError deep inside an operation.

    client → server   {"id", "op", "priority", "args"}         a call: `args` is the operation's dataclass
                      {"id", "op": "cancel"}                   the caller gave up: a generation stops at its next token
    server → client   {"id", "tokens": [...]}                  tokens as a generation samples them (before its answer)
                      {"id", "ok": result, "waited_s"?}        the answer: `result` is the operation's reply dataclass
                      {"id", "error": {"kind", "message"}}     the answer: a failure of a kind (`ErrorKind`)

`priority` is the calling task's (app/engine/priority.py): the engine process runs the operation at it, and `waited_s`
is the time the engine measured the operation waiting for it.

Errors cross the boundary by kind, decided by the exception's type, never by its message, and the client raises the
exception the in-process engine would have raised (`ValueError` for a bad argument, ...), so the runtime behaves the
same on either side of the boundary. An unexpected exception in the engine process is `internal` (`EngineError`,
500 at HTTP), whatever its type: only the engine process still loading is `not_ready` (503).
"""

from __future__ import annotations

import asyncio
import json
import struct
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, TypeVar, assert_never

from app.engine.priority import Priority
from app.engine.process.codec import ProtocolError as ProtocolError  # raised by this module's readers too
from app.engine.process.codec import decode, to_json
from app.engine.process.messages import REQUESTS, AnyRequest, Op, Request, reply_type
from app.errors import EngineUnavailable, NotReady

MAX_FRAME_BYTES: Final = 256 << 20  # a frame holds at most a log's token ids and a few vectors
_HEADER = struct.Struct(">I")
NOT_READY_RETRY_S: Final = 5

R = TypeVar("R")


class ErrorKind(StrEnum):
    INVALID = "invalid"  # a bad argument (the engine raised ValueError): ValueError
    NOT_READY = "not_ready"  # the engine process is still loading its engine (or failed to): NotReady, 503
    ENGINE_UNAVAILABLE = "engine_unavailable"  # the engine raised EngineUnavailable: 503
    STALE_HANDLE = "stale_handle"  # the handle is gone or changed: the client opens it again from its copy
    PROTOCOL = "protocol"  # the message broke this wire format: ProtocolError, 500
    INTERNAL = "internal"  # anything else (a bug in the engine process): EngineError, 500


class StaleHandle(Exception):
    """The engine holds no such handle, or not at the version the client knows (the engine process restarted, or the
    handle was released or changed by another client). The client opens it again from its own copy of the log."""


class FrameTooLarge(Exception):
    pass


class EngineError(RuntimeError):
    """An operation failed in the engine process in a way no caller can fix (a bug there): a 500 at HTTP."""


# -- frames ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    id: int
    request: AnyRequest
    priority: Priority = Priority.LIVE


@dataclass(frozen=True)
class Cancel:
    id: int


@dataclass(frozen=True)
class Tokens:
    id: int
    tokens: list[int]


@dataclass(frozen=True)
class Done:
    id: int
    result: object  # the reply as JSON: `reply()` reads it as the request's reply type
    waited_s: float | None = None

    def reply(self, request: Request[R]) -> R:
        answer: R = decode(reply_type(request), self.result, request_id=self.id)
        return answer


@dataclass(frozen=True)
class Failed:
    id: int
    kind: ErrorKind
    message: str

    def error(self) -> Exception:
        """The exception the in-process engine would have raised."""
        match self.kind:
            case ErrorKind.INVALID:
                return ValueError(self.message)
            case ErrorKind.NOT_READY:
                return NotReady(self.message, headers={"Retry-After": str(NOT_READY_RETRY_S)})
            case ErrorKind.ENGINE_UNAVAILABLE:
                return EngineUnavailable(self.message)
            case ErrorKind.STALE_HANDLE:
                return StaleHandle(self.message)
            case ErrorKind.PROTOCOL:
                return ProtocolError(self.message, self.id)
            case ErrorKind.INTERNAL:
                return EngineError(f"engine process: {self.message}")
            case _:
                assert_never(self.kind)


def kind_of(exc: BaseException) -> ErrorKind:
    """The kind of an exception raised while serving a call: by its type alone."""
    if isinstance(exc, StaleHandle):
        return ErrorKind.STALE_HANDLE
    if isinstance(exc, EngineUnavailable):
        return ErrorKind.ENGINE_UNAVAILABLE
    if isinstance(exc, NotReady):
        return ErrorKind.NOT_READY
    if isinstance(exc, ProtocolError):
        return ErrorKind.PROTOCOL
    if isinstance(exc, ValueError):
        return ErrorKind.INVALID
    return ErrorKind.INTERNAL


def encode_call(request_id: int, request: Request[Any], priority: Priority = Priority.LIVE) -> bytes:
    """The frame of a call (`parse_call` reads it back as a `Call`)."""
    return encode({"id": request_id, "op": request.op.value, "priority": int(priority), "args": to_json(request)})


def encode_cancel(request_id: int) -> bytes:
    return encode({"id": request_id, "op": Op.CANCEL.value})


def encode_tokens(request_id: int, tokens: list[int]) -> bytes:
    return encode({"id": request_id, "tokens": list(tokens)})


def encode_done(request_id: int, reply: object, waited_s: float | None = None) -> bytes:
    frame = {"id": request_id, "ok": to_json(reply)}
    return encode(frame if waited_s is None else {**frame, "waited_s": waited_s})


def encode_failure(request_id: int, exc: BaseException) -> bytes:
    kind = kind_of(exc)
    message = f"{type(exc).__name__}: {exc}" if kind is ErrorKind.INTERNAL else str(exc)
    return encode({"id": request_id, "error": {"kind": kind.value, "message": message}})


def parse_call(message: dict[str, Any]) -> Call | Cancel:
    """A client's frame as the server reads it."""
    request_id = _request_id(message)
    op = message.get("op")
    if op == Op.CANCEL.value:
        return Cancel(request_id)
    cls = REQUESTS.get(Op(op)) if isinstance(op, str) and op in Op._value2member_map_ else None
    if cls is None:
        raise ProtocolError(f"unknown engine operation {op!r}", request_id)
    try:
        priority = Priority.from_wire(message.get("priority"))
    except ValueError as exc:
        raise ProtocolError(str(exc), request_id) from None
    return Call(request_id, decode(cls, message.get("args", {}), request_id=request_id), priority)


def parse_answer(message: dict[str, Any]) -> Tokens | Done | Failed:
    """A server's frame as the client reads it (`Done.reply` reads the result as the request's reply)."""
    request_id = _request_id(message)
    if "ok" in message:
        waited = message.get("waited_s")
        if waited is not None and type(waited) is not float and type(waited) is not int:
            raise ProtocolError(f"a wait of {waited!r} s", request_id)
        return Done(request_id, message["ok"], None if waited is None else float(waited))
    if "error" in message:
        return decode(Failed, {"id": request_id, **_object(message["error"], request_id)}, request_id=request_id)
    if "tokens" in message:
        return Tokens(request_id, decode(list[int], message["tokens"], request_id=request_id))
    raise ProtocolError("a frame that is neither tokens nor an answer", request_id)


def _request_id(message: dict[str, Any]) -> int:
    request_id = message.get("id")
    if type(request_id) is not int:
        raise ProtocolError(f"a frame without a request id ({request_id!r})")
    return request_id


def _object(value: object, request_id: int) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError("an error must be a JSON object", request_id)
    return value


# -- frames on the stream -------------------------------------------------------------------------------------------


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME_BYTES:
        raise FrameTooLarge(f"a frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return _HEADER.pack(len(body)) + body


async def read(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next frame, or None at the end of the stream."""
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise FrameTooLarge(f"a frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        body = await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        return None
    try:
        message = json.loads(body)
    except ValueError:
        raise ProtocolError("a frame that is not JSON") from None
    if not isinstance(message, dict):
        raise ProtocolError("a frame must hold a JSON object")
    return message
