"""The engine process's wire format: length-prefixed JSON frames over a Unix socket, many requests in flight.

A frame is a 4-byte big-endian length and a JSON object. A client sends `{"id", "op", "args"}`; the server answers
each id with exactly one final frame, `{"id", "ok": result}` or `{"id", "error": {"kind", "message"}}`, and a
generation may send `{"id", "tokens": [...]}` frames before it (tokens as they are sampled). `{"id", "op": "cancel"}`
cancels request `id` (a client that hung up): a generation stops at its next token. Every request's args carry
`priority` (app/engine/priority.py: the engine process runs the operation at that priority), and a final `ok` frame
may carry `waited_s`, the time the engine measured the operation waiting for it.

Errors cross the boundary as kinds, and the client raises the exception the in-process engine would have raised
(`ValueError` for a bad argument, ...), so the runtime behaves the same on either side of the boundary.
"""

from __future__ import annotations

import asyncio
import json
import struct
from dataclasses import asdict
from typing import Any, Final, Literal

from app.engine.protocol import Generation, Sampling, TokenUsage

MAX_FRAME_BYTES: Final = 256 << 20  # a frame holds at most a log's token ids and a few vectors
_HEADER = struct.Struct(">I")

ErrorKind = Literal["invalid", "not_ready", "stale_handle", "internal"]


class StaleHandle(Exception):
    """The engine holds no such handle, or not at the version the client knows (the engine process restarted, or the
    handle was released or changed by another client). The client opens it again from its own copy of the log."""


class FrameTooLarge(Exception):
    pass


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
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ValueError("a frame must hold a JSON object")
    return message


def error_of(exc: BaseException) -> dict[str, str]:
    kind: ErrorKind
    if isinstance(exc, StaleHandle):
        kind = "stale_handle"
    elif isinstance(exc, ValueError | TypeError):
        kind = "invalid"
    elif isinstance(exc, AttributeError) or "not started" in str(exc):
        kind = "not_ready"
    else:
        kind = "internal"
    return {"kind": kind, "message": f"{type(exc).__name__}: {exc}" if kind == "internal" else str(exc)}


def sampling_to_wire(sampling: Sampling) -> dict[str, Any]:
    return {**asdict(sampling), "stop": list(sampling.stop)}


def sampling_from_wire(data: dict[str, Any]) -> Sampling:
    return Sampling(
        temperature=float(data["temperature"]), top_p=float(data["top_p"]), max_tokens=int(data["max_tokens"]),
        stop=tuple(str(s) for s in data["stop"]), seed=int(data["seed"]),
    )


def usage_from_wire(data: dict[str, Any]) -> TokenUsage:
    return TokenUsage(int(data["reused"]), int(data["prefilled"]), int(data["decoded"]))


def generation_to_wire(generation: Generation) -> dict[str, Any]:
    return {
        "token_ids": list(generation.token_ids), "text": generation.text,
        "finish_reason": generation.finish_reason, "usage": asdict(generation.usage),
    }


def generation_from_wire(data: dict[str, Any]) -> Generation:
    finish = data["finish_reason"]
    if finish not in ("stop", "length"):
        raise ValueError(f"unknown finish reason {finish!r}")
    return Generation([int(t) for t in data["token_ids"]], str(data["text"]), finish, usage_from_wire(data["usage"]))
