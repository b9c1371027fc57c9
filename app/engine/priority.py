"""How urgent the engine work of the current task is: a forget's replay goes ahead of other sessions' live turns.

A forget is most urgent when the server is busy (a detector flags a poisoned tool result while many agents generate),
and until its replay ends the flagged session cannot take its next turn. So engine work carries a priority:

- `LIVE`: turns, compactions, branches (the default);
- `FORGET`: a forget job's replay or regeneration;
- `DETECTOR`: a forget a detector webhook submitted (a suspected injection): at least as urgent as any other forget.

The priority travels with the work, not through parameters: the forget executor sets it around a job's session work
(`engine_priority`), and every engine reads it when a call is made (`current_priority`): hf serves its queue by it
(hf_scheduler.py), vLLM schedules by it (`scheduling_policy="priority"`), a fleet gets it in the request body, and the
engine-process client sends it with every operation so the engine process runs the operation at the same priority. A
context variable is inherited by the tasks the work starts and invisible to every other session's task.

Waits: an engine reports how long each call waited for it into the meter the caller opened (`measure_wait`): hf,
queued behind other work or paused for more urgent work; in-process vLLM, in vLLM's waiting queue (vllm_stats.py); a
fleet reports nothing. The forget executor observes a session's total (lethe_forget_engine_wait_seconds).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from enum import IntEnum


class Priority(IntEnum):
    LIVE = 0
    FORGET = 1
    DETECTOR = 2

    @property
    def label(self) -> str:
        """The metric label (and log field) for this priority."""
        return self.name.lower()

    @classmethod
    def from_wire(cls, value: object) -> Priority:
        """A priority sent by an engine-process client; absent means live (a client of an older build)."""
        if value is None:
            return cls.LIVE
        if isinstance(value, bool) or not isinstance(value, int) or value not in cls._value2member_map_:
            raise ValueError(f"unknown engine priority {value!r}")
        return cls(value)

    @property
    def vllm(self) -> int:
        """The request priority vLLM takes: it serves lower values first, so the most urgent is the most negative."""
        return -int(self)


_priority: ContextVar[Priority] = ContextVar("lethe_engine_priority", default=Priority.LIVE)


def current_priority() -> Priority:
    return _priority.get()


@contextmanager
def engine_priority(priority: Priority) -> Iterator[None]:
    """Run the engine calls of this block (and of the tasks it starts) at `priority`."""
    token = _priority.set(priority)
    try:
        yield
    finally:
        _priority.reset(token)


@dataclass
class EngineWait:
    """What the engine calls of a block waited for the engine (before and while they ran), where it was measured."""

    seconds: float = 0.0
    calls: int = 0  # calls whose wait an engine measured (0: the engine measures none, e.g. vLLM)


_meter: ContextVar[EngineWait | None] = ContextVar("lethe_engine_wait", default=None)


@contextmanager
def measure_wait() -> Iterator[EngineWait]:
    """Sum the waits the engine calls of this block report (`note_wait`)."""
    meter = EngineWait()
    token = _meter.set(meter)
    try:
        yield meter
    finally:
        _meter.reset(token)


def note_wait(seconds: float) -> None:
    """An engine call waited `seconds` for the engine (called by the engine, in the caller's context)."""
    meter = _meter.get()
    if meter is not None:
        meter.seconds += max(0.0, seconds)
        meter.calls += 1
