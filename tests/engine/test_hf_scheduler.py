"""The hf engine's worker thread (app/engine/hf_scheduler.py) on its own, without a model: the most urgent call runs
first, a call in steps pauses for more urgent work and resumes where it stopped, calls on one handle keep their order
(priority inheritance), a call cancelled while queued never runs. Every interleaving is forced with events the calls
wait on, never with sleeps; priorities are app/engine/priority.py's."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest

from app.engine.hf_scheduler import PriorityWorker, Steps
from app.engine.priority import Priority

BOUND_S = 60  # bounds a bug, never paces a test
LIVE, FORGET, DETECTOR = Priority.LIVE, Priority.FORGET, Priority.DETECTOR


@pytest.fixture
def worker() -> Iterator[PriorityWorker]:
    worker = PriorityWorker("test-hf")
    yield worker
    worker.shutdown()


def plain() -> contextlib.nullcontext[None]:
    return contextlib.nullcontext()


def blocker(worker: PriorityWorker) -> threading.Event:
    """Occupy the worker with a call that waits for the returned event: everything submitted meanwhile queues."""
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        assert release.wait(BOUND_S)

    worker.submit_call(hold, priority=LIVE, key=None, context=plain)
    assert started.wait(BOUND_S)
    return release


def reply(
    log: list[str], name: str, steps: int, hold_at: int, held: threading.Event, go: threading.Event
) -> Steps[str]:
    """A call in steps (as a generation runs): step `hold_at` signals `held` and waits for `go`."""
    for i in range(steps):
        log.append(f"{name} {i}")
        if i == hold_at:
            held.set()
            assert go.wait(BOUND_S)
        yield
    return f"{name} done"


def test_the_most_urgent_call_runs_first_and_equals_in_submission_order(worker: PriorityWorker) -> None:
    release = blocker(worker)
    order: list[str] = []
    calls = [("live 1", LIVE), ("forget 1", FORGET), ("live 2", LIVE), ("detector", DETECTOR), ("forget 2", FORGET)]
    works = [
        worker.submit_call(lambda name=name: order.append(name), priority=level, key=None, context=plain)
        for name, level in calls
    ]
    assert [level for level, _ in worker.waiting()] == [level for _, level in calls]  # all queued behind the blocker
    release.set()
    for work in works:
        work.future.result(BOUND_S)
    assert order == ["detector", "forget 1", "forget 2", "live 1", "live 2"]
    assert all(work.waited_s > 0 for work in works)  # each waited behind the blocker at least


def test_a_reply_pauses_between_steps_for_more_urgent_work_and_resumes_where_it_stopped(
    worker: PriorityWorker,
) -> None:
    log: list[str] = []
    held, go = threading.Event(), threading.Event()
    live = worker.submit_steps(reply(log, "reply", 4, 1, held, go), priority=LIVE, key="a", context=plain)
    assert held.wait(BOUND_S)  # the reply is inside its step 1
    forget = worker.submit_call(lambda: log.append("forget"), priority=FORGET, key="b", context=plain)
    other = worker.submit_call(lambda: log.append("other live"), priority=LIVE, key="c", context=plain)
    go.set()
    assert live.future.result(BOUND_S) == "reply done"
    forget.future.result(BOUND_S)
    other.future.result(BOUND_S)
    # The forget ran between two steps of the reply; the reply kept its place ahead of the later live call.
    assert log == ["reply 0", "reply 1", "forget", "reply 2", "reply 3", "other live"]
    assert live.pauses == 1 and worker.pauses == 1


def test_calls_on_one_handle_keep_their_order_and_lend_their_priority(worker: PriorityWorker) -> None:
    """A live reply on handle a pauses for a detector's call on b; a forget's call on a must not overtake the paused
    reply (it would crop or extend a log mid-reply), so the reply inherits its priority and finishes first, ahead of
    other live work."""
    log: list[str] = []
    held, go = threading.Event(), threading.Event()
    live = worker.submit_steps(reply(log, "reply a", 4, 1, held, go), priority=LIVE, key="a", context=plain)
    assert held.wait(BOUND_S)
    detector = worker.submit_call(lambda: log.append("detector b"), priority=DETECTOR, key="b", context=plain)
    forget = worker.submit_call(lambda: log.append("forget a"), priority=FORGET, key="a", context=plain)
    other = worker.submit_call(lambda: log.append("live c"), priority=LIVE, key="c", context=plain)
    go.set()
    for work in (detector, forget, other):
        work.future.result(BOUND_S)
    assert live.future.result(BOUND_S) == "reply a done"
    assert log == ["reply a 0", "reply a 1", "detector b", "reply a 2", "reply a 3", "forget a", "live c"]
    assert live.pauses == 1  # not again for the forget it holds up: it runs at the forget's priority now


def test_equal_priorities_never_pause_each_other(worker: PriorityWorker) -> None:
    log: list[str] = []
    held, go = threading.Event(), threading.Event()
    first = worker.submit_steps(reply(log, "first", 3, 0, held, go), priority=FORGET, key="a", context=plain)
    assert held.wait(BOUND_S)
    second = worker.submit_call(lambda: log.append("second"), priority=FORGET, key="b", context=plain)
    go.set()
    second.future.result(BOUND_S)
    assert first.future.result(BOUND_S) == "first done"
    assert log == ["first 0", "first 1", "first 2", "second"] and first.pauses == 0


def test_a_call_cancelled_while_queued_never_runs_and_errors_reach_the_caller(worker: PriorityWorker) -> None:
    release = blocker(worker)
    ran: list[str] = []
    doomed = worker.submit_call(lambda: ran.append("doomed"), priority=FORGET, key=None, context=plain)
    assert doomed.future.cancel()
    failing = worker.submit_call(lambda: 1 // 0, priority=LIVE, key=None, context=plain)
    release.set()
    with pytest.raises(ZeroDivisionError):
        failing.future.result(BOUND_S)
    assert ran == []


def test_each_step_runs_inside_the_context_and_none_spans_a_pause(worker: PriorityWorker) -> None:
    """The engine enters its lock and grad mode around each step: a paused call must not leave them held."""
    depth = threading.local()
    seen: list[int] = []

    @contextlib.contextmanager
    def counted() -> Iterator[None]:
        depth.n = getattr(depth, "n", 0) + 1
        try:
            yield
        finally:
            depth.n -= 1

    held, go = threading.Event(), threading.Event()
    log: list[str] = []
    steps = worker.submit_steps(reply(log, "r", 3, 0, held, go), priority=LIVE, key="a", context=counted)
    assert held.wait(BOUND_S)
    urgent = worker.submit_call(lambda: seen.append(depth.n), priority=DETECTOR, key="b", context=counted)
    go.set()
    urgent.future.result(BOUND_S)
    steps.future.result(BOUND_S)
    assert seen == [1]  # only its own context: the paused call's was exited at the pause


def test_after_an_urgent_call_less_urgent_ones_wait_for_its_callers_next_call() -> None:
    """A replay makes a call, computes a little, makes the next: a live call queued meanwhile must not take the engine
    in that gap. The forget's second call is submitted only after its first has finished and a live call is queued,
    as a replay's next call arrives; the worker lingers long enough here (BOUND_S) that the order cannot depend on
    how fast this thread is. Shutting down ends the linger, so the live call then runs at once."""
    worker = PriorityWorker("test-hf", linger_s=BOUND_S)
    order: list[str] = []

    def first_forget_call() -> None:
        order.append("forget 1")
        assert worker.wait_queued(LIVE, BOUND_S)  # the live call is queued before this call ends

    first = worker.submit_call(first_forget_call, priority=FORGET, key="s", context=plain)
    live = worker.submit_call(lambda: order.append("live"), priority=LIVE, key="t", context=plain)
    first.future.result(BOUND_S)
    second = worker.submit_call(lambda: order.append("forget 2"), priority=FORGET, key="s", context=plain)
    worker.shutdown()
    second.future.result(BOUND_S)
    live.future.result(BOUND_S)
    assert order == ["forget 1", "forget 2", "live"]


def test_the_linger_is_short_and_a_call_at_the_same_priority_never_waits(worker: PriorityWorker) -> None:
    """With the default linger a live call runs once it is over, no further urgent call needed; and calls at the
    priority of the call that finished (or above) are never held back by it."""
    order: list[str] = []

    def forget_call() -> None:
        order.append("forget")
        assert worker.wait_queued(LIVE, BOUND_S)

    forget = worker.submit_call(forget_call, priority=FORGET, key="s", context=plain)
    live = worker.submit_call(lambda: order.append("live"), priority=LIVE, key="t", context=plain)
    forget.future.result(BOUND_S)
    live.future.result(BOUND_S)  # no second forget call came: the linger ended by itself
    after = worker.submit_call(lambda: order.append("live again"), priority=LIVE, key="t", context=plain)
    after.future.result(BOUND_S)  # a live call right after a live one: the same priority, no linger
    assert order == ["forget", "live", "live again"]


def test_a_shut_down_worker_serves_what_was_queued_and_refuses_more() -> None:
    worker = PriorityWorker("test-hf")
    release = blocker(worker)
    queued = worker.submit_call(lambda: "served", priority=LIVE, key=None, context=plain)
    worker.shutdown()
    release.set()
    assert queued.future.result(BOUND_S) == "served"
    with pytest.raises(RuntimeError, match="closed"):
        worker.submit_call(lambda: None, priority=LIVE, key=None, context=plain)


def test_priorities_cross_the_engine_process_boundary_as_numbers_and_bad_ones_are_refused() -> None:
    assert Priority.from_wire(None) is LIVE  # a client that sends none: a live call
    assert [Priority.from_wire(int(p)) for p in Priority] == list(Priority)
    for bad in (3, -1, "1", True, 1.0):
        with pytest.raises(ValueError, match="priority"):
            Priority.from_wire(bad)
    assert [p.vllm for p in Priority] == [0, -1, -2]  # vLLM serves lower values first
