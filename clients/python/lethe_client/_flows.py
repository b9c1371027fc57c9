"""Multi-step client procedures written once as generators, driven by the sync and the async client.

A flow yields a `Call` (the driver performs it and sends back the result, or throws the API error into the flow)
or a `Sleep` (the driver sleeps the way its world sleeps). The flow's return value is the method's result.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from lethe_client import _calls as calls
from lethe_client._calls import Call, ForgetResult, WriteResult
from lethe_client.errors import ForgetNotDurable, Forgotten, NotFound

T = TypeVar("T")


@dataclass(frozen=True)
class Sleep:
    seconds: float


Step = Call[Any] | Sleep
Flow = Generator[Step, Any, T]


def safe_forget_then_write(namespace: str, key: str, value: Any, *, source: str) -> Flow[WriteResult]:
    """Forget, then write the superseding value based on the tombstone version.

    Lethe's tombstones are versioned, so the write cannot be reordered before the forget, and no stale write can
    land between the two: If-Match with the tombstone version proves this writer saw the forget. If anyone else
    wrote or forgot the key in between, the write answers 412 (raised as PreconditionFailed) rather than silently
    overriding them.

    With read replicas: both steps run on the primary, and the client keeps the write's `Lethe-Consistency` token
    and sends it with every later read, so no replica that has not replayed the forget and the write answers them.
    """
    forgot: ForgetResult = yield calls.forget(namespace, key, source=source)
    written: WriteResult = yield calls.put(
        namespace, key, value, source=source, if_match=forgot.version, if_none_match=False
    )
    return written


def confirm_forget(
    namespace: str, key: str, *, attempts: int, interval: float, confirmations: int, source: str
) -> Flow[int]:
    """The guard of the tombstone note for stores that cannot prove ordering: trust a forget only once
    `confirmations` consecutive reads, `interval` seconds apart, find the key absent. A read that finds it live
    (a write resurrected it) forgets it again, at most `attempts` times, then raises ForgetNotDurable.

    Against Lethe one read suffices (a forget is an ordered barrier), but the guard is cheap and also catches a
    legitimate re-establishment racing the caller, which the caller asked to be gone. Returns the tombstone version
    (0 if the key was never written and nobody forgot it).
    """
    if confirmations < 1 or attempts < 0 or interval < 0:
        raise ValueError("confirmations >= 1, attempts >= 0 and interval >= 0")
    reforgets = streak = version = 0
    started = time.monotonic()  # only for the error message
    while True:
        try:
            yield calls.get(namespace, key)
        except Forgotten as absent:
            streak, version = streak + 1, absent.version
        except NotFound:
            streak, version = streak + 1, 0
        else:
            streak = 0
            if reforgets >= attempts:
                raise ForgetNotDurable(
                    f"{namespace}/{key} still live after {reforgets} re-forget(s) over "
                    f"{time.monotonic() - started:.1f}s: something keeps writing it back"
                )
            reforgets += 1
            yield calls.forget(namespace, key, source=source)
            continue
        if streak >= confirmations:
            return version
        yield Sleep(interval)


def wait_forget(forget_id: str, *, timeout_s: float, interval: float) -> Flow[dict[str, Any]]:
    """Poll a forget job until it is succeeded, failed, needs_input or held (on a legal hold); TimeoutError after
    `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        job: dict[str, Any] = yield calls.get_forget(forget_id)
        if job.get("status") in calls.TERMINAL_FORGET_STATUSES:
            return job
        if time.monotonic() >= deadline:
            raise TimeoutError(f"forget job {forget_id} still {job.get('status')} after {timeout_s:.0f}s")
        yield Sleep(interval)
