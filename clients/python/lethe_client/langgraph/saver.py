"""`LetheSaver`: a LangGraph checkpointer (`BaseCheckpointSaver`, sync and async) over Lethe's thread routes.

    from lethe_client.langgraph import LetheSaver
    graph = builder.compile(checkpointer=LetheSaver("http://127.0.0.1:8000", api_key))

Beyond LangGraph's own savers:
- `delete_thread` is durable: a put or put_writes of that thread still in flight when it returned is refused
  (`ThreadDeleted`) and never brings the thread back (langgraph#7206). The thread id can start a new thread.
- `list(None, filter=..., before=..., limit=...)` lists the checkpoints of every thread of the tenant (the API key's),
  newest first, as PostgresSaver's does; another tenant's threads never appear.
- `forget_message(thread_id, message_id)` removes a message from every checkpoint and pending write of the thread:
  `graph.get_state_history(config)` never shows it again, and a run that read the thread before is refused
  (`ThreadRewritten`) rather than writing the message back.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, TypeGuard

import httpx
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from lethe_client.errors import LetheAPIError, NotFound, PreconditionFailed, error_for
from lethe_client.langgraph import _wire as wire
from lethe_client.langgraph._messages import rewrite_body

_REWRITE_ATTEMPTS = 5


class ThreadDeleted(PreconditionFailed):
    """412: the thread was deleted under this write (its checkpoint, or the one it follows, is gone). Nothing was
    written; a new run on the thread id starts a new thread."""


class ThreadRewritten(PreconditionFailed):
    """412: a message was forgotten in the thread after this run read it; nothing was written. Run it again."""


class ThreadChanged(PreconditionFailed):
    """412: forget_message kept meeting writes to the thread; nothing was rewritten by the last attempt."""


def _raise(response: httpx.Response) -> None:
    if response.is_success:
        return
    error = error_for(response)
    if isinstance(error, PreconditionFailed):
        kind = error.problem_type.rsplit("/", 1)[-1]
        typed = {"thread-deleted": ThreadDeleted, "thread-rewritten": ThreadRewritten,
                 "thread-changed": ThreadChanged}.get(kind)
        if typed is not None:
            raise typed(error.status, error.problem, error.headers)
    raise error


class LetheSaver(BaseCheckpointSaver[str]):
    """Checkpoints, channel values and pending writes stored in Lethe, per tenant (the API key's), serialized by
    `serde` (LangGraph's JsonPlusSerializer by default) on this side: the server stores the bytes unread."""

    def __init__(
        self, base_url: str, api_key: str, *, serde: SerializerProtocol | None = None, timeout: float = 60.0,
        http: httpx.Client | None = None, ahttp: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self._base_url, self._timeout = base_url, timeout
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._http, self._ahttp = http, ahttp

    # ---- transport: the one place each side performs a request ----------------------------------------------------

    def _send(self, request: wire.Request) -> Any:
        if self._http is None:
            self._http = httpx.Client(base_url=self._base_url, timeout=self._timeout)
        response = self._http.request(request.method, request.path, params=request.params, json=request.json,
                                      headers=self._headers)
        _raise(response)
        return response.json()

    async def _asend(self, request: wire.Request) -> Any:
        if self._ahttp is None:
            self._ahttp = httpx.AsyncClient(base_url=self._base_url, timeout=self._timeout)
        response = await self._ahttp.request(request.method, request.path, params=request.params, json=request.json,
                                             headers=self._headers)
        _raise(response)
        return response.json()

    def close(self) -> None:
        if self._http is not None:
            self._http.close()

    async def aclose(self) -> None:
        if self._ahttp is not None:
            await self._ahttp.aclose()

    # ---- versions ----------------------------------------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None) -> str:
        """As LangGraph's own savers: an increasing counter with a random tail, so two forks of one checkpoint never
        give one channel the same version (blobs are stored once per channel version)."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # ---- sync --------------------------------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        try:
            answer = self._send(wire.get_one(config))
        except NotFound:
            return None
        return self._one(answer)

    def list(
        self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None, limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        if _one_named(config):
            found = self.get_tuple(config)
            if found is not None and _matches(found, filter):
                yield found
            return
        cursor: str | None = None
        left = limit
        while left is None or left > 0:
            answer = self._send(wire.page(config, filter=filter, before=before, limit=left, cursor=cursor))
            for item in answer["checkpoints"]:
                yield wire.tuple_of(self.serde, item)
            left = None if left is None else left - len(answer["checkpoints"])
            cursor = answer["next_cursor"]
            if cursor is None:
                return

    def put(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        answer = self._send(wire.put(self.serde, config, checkpoint, metadata, new_versions))
        return wire.put_done(config, checkpoint, answer)

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "",
    ) -> None:
        self._send(wire.put_writes(self.serde, config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        with contextlib.suppress(NotFound):  # nothing stored under it: done
            self._send(wire.delete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._send(wire.delete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        with contextlib.suppress(NotFound):  # nothing stored under it: done
            self._send(wire.copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._send(wire.prune(thread_ids, strategy))

    def forget_message(self, thread_id: str, message_id: str) -> bool:
        """Remove the message with this id from every checkpoint and pending write of the thread, atomically.
        Answers whether any held it. Raises ThreadChanged when the thread kept being written meanwhile."""
        for _ in range(_REWRITE_ATTEMPTS):
            try:
                stored = self._send(wire.values(thread_id))
            except NotFound:
                return False
            body = rewrite_body(self.serde, stored, message_id)
            if body is None:
                return False
            try:
                self._send(wire.rewrite(thread_id, body))
            except ThreadChanged:
                continue  # written meanwhile: read it again
            return True
        raise _gave_up(thread_id)

    # ---- async -------------------------------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        try:
            answer = await self._asend(wire.get_one(config))
        except NotFound:
            return None
        return self._one(answer)

    async def alist(
        self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None, limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        if _one_named(config):
            found = await self.aget_tuple(config)
            if found is not None and _matches(found, filter):
                yield found
            return
        cursor: str | None = None
        left = limit
        while left is None or left > 0:
            answer = await self._asend(wire.page(config, filter=filter, before=before, limit=left, cursor=cursor))
            for item in answer["checkpoints"]:
                yield wire.tuple_of(self.serde, item)
            left = None if left is None else left - len(answer["checkpoints"])
            cursor = answer["next_cursor"]
            if cursor is None:
                return

    async def aput(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        answer = await self._asend(wire.put(self.serde, config, checkpoint, metadata, new_versions))
        return wire.put_done(config, checkpoint, answer)

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "",
    ) -> None:
        await self._asend(wire.put_writes(self.serde, config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        with contextlib.suppress(NotFound):  # nothing stored under it: done
            await self._asend(wire.delete_thread(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._asend(wire.delete_for_runs(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        with contextlib.suppress(NotFound):  # nothing stored under it: done
            await self._asend(wire.copy_thread(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._asend(wire.prune(thread_ids, strategy))

    async def aforget_message(self, thread_id: str, message_id: str) -> bool:
        """`forget_message`, awaited."""
        for _ in range(_REWRITE_ATTEMPTS):
            try:
                stored = await self._asend(wire.values(thread_id))
            except NotFound:
                return False
            body = rewrite_body(self.serde, stored, message_id)
            if body is None:
                return False
            try:
                await self._asend(wire.rewrite(thread_id, body))
            except ThreadChanged:
                continue
            return True
        raise _gave_up(thread_id)

    # ---- shared ------------------------------------------------------------------------------------------------

    def _one(self, answer: dict[str, Any]) -> CheckpointTuple | None:
        if "checkpoints" in answer:  # the newest of the namespace: a page of at most one
            items = answer["checkpoints"]
            return wire.tuple_of(self.serde, items[0]) if items else None
        return wire.tuple_of(self.serde, answer)


def _one_named(config: RunnableConfig | None) -> TypeGuard[RunnableConfig]:
    """Whether a list config names one checkpoint (a thread and a checkpoint id): listed by reading it. Without a
    thread_id the list spans every thread of the tenant, as LangGraph's own savers' `list(None)` does."""
    conf = (config or {}).get("configurable", {})
    return "thread_id" in conf and bool(conf.get("checkpoint_id"))


def _matches(found: CheckpointTuple, filter: dict[str, Any] | None) -> bool:
    return all(found.metadata.get(k) == v for k, v in (filter or {}).items())


def _gave_up(thread_id: str) -> LetheAPIError:
    return ThreadChanged(412, {"type": "thread-changed", "detail": f"thread {thread_id!r} kept changing while a "
                               f"message was being forgotten ({_REWRITE_ATTEMPTS} attempts): try again"})
