"""The hf engine's one worker thread: engine work served by priority, a running reply paused for more urgent work.

The model runs one forward pass at a time, so calls wait in a queue. A FIFO made a forget's replay wait behind every
reply queued before it (23x its idle time beside 8 generating sessions, issue 33). Here the thread serves the most
urgent call first (app/engine/priority.py), in submission order among equals, and a call that runs in *steps* (a
generation: one step per sampled token) goes back to the queue, keeping its place, whenever more urgent work waits
between two of its steps; it resumes where it stopped once nothing more urgent waits.

Pausing changes nothing a call computes: its handle's forward passes are the same passes in the same order, only
interleaved with other handles' passes, and everything a generation carries between steps (its cache, logits, token
generator, stop watch) is its own. Two rules keep it so:

- calls on one handle run in submission order: a call queued behind an unfinished earlier call on its handle (a
  paused generation, say) lends it its priority instead of overtaking it (priority inheritance), so a crop never
  lands in the middle of the reply it crops;
- the engine pins a paused generation's cache, so no other call's memory budget evicts it meanwhile (hf.py).

A replay is a sequence of calls (open, crop, prefill, generate...) with a little of the caller's work between two of
them, under a millisecond when traced. A worker that picked the next queued call in that gap handed the engine to a
live prefill, which is never split, so a replay beside 8 sessions starting long turns paid one live prefill per call
(a forget took 4.4x its idle time; README, Performance). So after a call finishes, calls less urgent than it wait up
to `linger_s` (50 ms) for its caller's next call before the worker runs them: the engine idles at most that long
when the replay is done, and a replay's calls run back to back.

No starvation: a live reply waits only while more urgent work is queued (or, for at most `linger_s`, just after it),
so it is delayed at most by the replays that run beside it (a replay is bounded: its transitions), and a forget waits
at most one step of the call running when it arrived (one decode step, or one prefill, which is never split: its
chunking is part of the exact recipe).

Each call reports how long it waited (queued, or paused) in `Work.waited_s`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

Steps = Generator[None, None, T]  # a call that runs in steps: it yields between two, and returns its result
StepContext = Callable[[], AbstractContextManager[Any]]  # entered around each step (the engine's lock, grad mode)


@dataclass(eq=False)
class Work(Generic[T]):
    priority: int
    seq: int  # submission order: the tie-break among equal priorities, and the order of calls on one handle
    key: object | None  # the handle the call works on (None: none, e.g. loading the model)
    context: StepContext
    run: Callable[[], T] | None = None  # a call in one step
    steps: Steps[T] | None = None  # or a call in steps
    future: Future[T] = field(default_factory=Future)
    queued_at: float = field(default_factory=time.monotonic)
    waited_s: float = 0.0  # time spent queued, before it started and while it was paused
    started: bool = False
    pauses: int = 0


LINGER_S = 0.05  # how long less urgent calls wait for the next call of the caller whose call just finished


class PriorityWorker:
    """One thread serving `Work` by priority (higher first), pausing calls in steps for more urgent ones."""

    def __init__(self, name: str, linger_s: float = LINGER_S) -> None:
        self._name = name
        self._linger_s = linger_s
        self._cond = threading.Condition()
        self._queue: list[Work[Any]] = []
        # (priority, until): calls below that priority wait until then (the module docstring's linger).
        self._linger: tuple[int, float] = (0, 0.0)
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.pauses = 0  # calls paused for more urgent work, in all (tests, benchmarks)

    def submit_call(self, run: Callable[[], T], *, priority: int, key: object | None, context: StepContext) -> Work[T]:
        return self._submit(Work(priority, next(self._seq), key, context, run=run))

    def submit_steps(self, steps: Steps[T], *, priority: int, key: object | None, context: StepContext) -> Work[T]:
        return self._submit(Work(priority, next(self._seq), key, context, steps=steps))

    def shutdown(self) -> None:
        """Serve what is queued (without lingering: no caller can make a next call), then stop the thread; later
        submissions are refused."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def waiting(self) -> list[tuple[int, bool]]:
        """(priority, started) of every queued call, in queue order."""
        with self._cond:
            return [(w.priority, w.started) for w in self._queue]

    def wait_queued(self, priority: int, timeout_s: float) -> bool:
        """Block until a call at `priority` waits in the queue (a barrier for tests); False after `timeout_s`."""
        with self._cond:
            return self._cond.wait_for(lambda: any(w.priority == priority for w in self._queue), timeout_s)

    def _submit(self, work: Work[T]) -> Work[T]:
        with self._cond:
            if self._closed:
                raise RuntimeError("the hf engine is closed")
            self._queue.append(work)
            if self._thread is None:
                # A daemon: a process that exits without closing its engine must not hang on this thread.
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()  # the worker, and anyone in wait_queued
        return work

    def _serve(self) -> None:
        while True:
            with self._cond:
                work = self._next()
                if work is None:
                    return  # closed, and everything queued was served
                self._queue.remove(work)
            if not work.started:
                if not work.future.set_running_or_notify_cancel():
                    if work.steps is not None:
                        work.steps.close()
                    continue  # its caller gave up before it started
                work.started = True
            work.waited_s += time.monotonic() - work.queued_at
            self._advance(work)

    def _next(self) -> Work[Any] | None:
        """The call to run next, once no linger holds it back; None when closed with nothing queued."""
        while True:
            if not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
                continue
            level, until = self._linger
            left = until - time.monotonic()
            if left > 0 and not self._closed and min(self._queue, key=_urgency).priority < level:
                self._cond.wait(left)  # woken early by a submission, which may be the caller's next call
                continue
            return self._pick()

    def _finished(self, work: Work[Any]) -> None:
        """`work` ended: less urgent calls now wait a little for its caller's next call (module docstring)."""
        with self._cond:
            self._linger = (work.priority, time.monotonic() + self._linger_s)

    def _advance(self, work: Work[Any]) -> None:
        """Run `work` until it ends, or until more urgent work waits between two of its steps (then requeue it)."""
        if work.steps is None:
            assert work.run is not None
            try:
                with work.context():
                    result = work.run()
            except BaseException as exc:  # the caller gets it, as from an executor
                work.future.set_exception(exc)
            else:
                work.future.set_result(result)
            self._finished(work)
            return
        while True:
            try:
                with work.context():
                    work.steps.send(None)
            except StopIteration as done:
                work.future.set_result(done.value)
                self._finished(work)
                return
            except BaseException as exc:  # the caller gets it, as from an executor
                work.future.set_exception(exc)
                self._finished(work)
                return
            with self._cond:
                if self._more_urgent_than(work):
                    work.queued_at = time.monotonic()
                    work.pauses += 1
                    self.pauses += 1
                    self._queue.append(work)
                    return

    def _pick(self) -> Work[Any]:
        """The most urgent call (the earliest among equals); if an earlier call on its handle is unfinished, that
        one, which inherits its priority (module docstring)."""
        best = min(self._queue, key=_urgency)
        if best.key is None:
            return best
        return min((w for w in self._queue if w.key is best.key), key=lambda w: w.seq)

    def _more_urgent_than(self, work: Work[Any]) -> bool:
        level = work.priority
        if work.key is not None:  # calls waiting on this handle lend it their priority
            level = max([level, *(w.priority for w in self._queue if w.key is work.key)])
        return any(w.priority > level for w in self._queue)


def _urgency(work: Work[Any]) -> tuple[int, int]:
    return (-work.priority, work.seq)
