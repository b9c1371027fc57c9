"""A generation nobody waits for is stopped: the request's work is cancelled when its client disconnects.

Starlette does not cancel an endpoint whose client went away; a turn would go on sampling (minutes of CPU for a long
reply) and then commit. `until_disconnect` runs the work beside a watcher of the request's ASGI `receive`, which
answers `http.disconnect` once the client is gone (the body has been read by then), and cancels the work. A cancelled
turn writes nothing (its transaction rolls back, its cache handle is cropped back, see app/sessions), exactly
as if it had never been sent. Streams are covered by the streaming helpers (app/web/sse.py,
app/openai_compat/streaming.py): Starlette cancels a streaming body on disconnect, and they cancel the turn with it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

from app.errors import LetheError

T = TypeVar("T")


class ClientDisconnected(LetheError):
    """Nobody reads this answer: the client hung up while its request ran (nginx's 499)."""

    status = 499
    type_slug = "client-closed-request"
    title = "Client closed the request"


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; cancel it if the client disconnects first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.Event()

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone.set()
        task.cancel()

    watcher = asyncio.create_task(watch(), name="disconnect-watcher")
    try:
        return await task
    except asyncio.CancelledError:
        if gone.is_set() and not _cancelling():
            raise ClientDisconnected("the client disconnected; the request was cancelled") from None
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


def _cancelling() -> bool:
    """Whether this task itself is being cancelled (a shutdown), not just the work it awaited."""
    current = asyncio.current_task()
    return current is not None and current.cancelling() > 0
