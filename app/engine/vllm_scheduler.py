"""vLLM's scheduler, holding less urgent requests while a more urgent one is in the engine.

vLLM's `scheduling_policy="priority"` only orders the *waiting* queue: a forget's request is admitted first, then
batched with every live request already running (`max_num_seqs` of them), and vLLM takes a running request out of the
batch only when KV blocks run out. On 2 CPU cores a 9-sequence decode step costs about twice a single one, so a
forget beside 8 generating sessions took 1.9x its idle time (README, "Performance") however it was prioritised.

`ForgetFirstScheduler` makes the priority strict: while any request with a lower (more urgent) priority value than
others is running or waiting, the others are held: for each scheduling step they are hidden from vLLM's scheduler,
which then schedules only the most urgent ones. A held request is not preempted: it keeps its KV blocks and, in the
model runner, its cached state and its sampler's generator, and it is scheduled again, from the token it stopped at,
once no more urgent request is left. This is vLLM's own notion of a running request that a step did not schedule
(the model runner keeps the state of "running requests not scheduled in this step"), so a held reply is neither cut
short nor resampled: it is delayed by at most the urgent requests' time in the engine, which is the starvation bound
issue 33 asks for (between two of a replay's requests, held requests run).

Held requests keep their scheduler slots (`max_num_seqs`) and their blocks, which bounds what a hold can do:
- every slot taken (more sessions than `max_num_seqs`): an urgent request cannot be admitted beside them, so nothing
  is held until the first running request ends; vLLM's priority queue gives that slot to the urgent request, and the
  others are held from then on. Preempting one instead would recompute its KV by a prefill, which is not bit-exact
  for decode-filled blocks (docs/engines.md).
- the held requests hold the KV blocks an urgent one needs: holding them would stall everything (the urgent request
  waits for blocks nobody frees). A step that held requests and scheduled nothing ends the hold until the urgent
  requests have left the engine, and vLLM schedules as it would have (its priority preemption takes the least urgent
  running request when a more urgent running one cannot get blocks).

A hold acts between steps, never inside one: an urgent request that arrives while a step runs waits for that step to
end. A live step can be long: eight sessions starting their turns prefill together (862 tokens in one step took 1.3 s
on 2 cores, against 1.4 s for a whole forget on an idle engine), and that wait was what made a forget beside live
traffic slow (issue 33). So while only live work is in the engine, a step schedules at most `lethe_live_step_tokens`
tokens (vLLM's `additional_config`; `LETHE_VLLM_LIVE_STEP_TOKENS`): live prefills are chunked, which vLLM's chunked
prefill does anyway for long prompts, and an urgent request waits at most one such step. A step with urgent work in
the engine keeps vLLM's full budget. Chunking does not change a bit of what a prefill computes (docs/engines.md,
"Exactness", row 2; for seeded sampling with vllm_plugin.py's generator restore; tests/engine_vllm/
test_vllm_scheduler.py compares a chunked live prefill with one urgent step, greedy and seeded), so a replay, which
runs on the full budget, still equals the counterfactual that live turns built chunk by chunk. Without
chunked prefill (vLLM disables it for some models) nothing is capped: a request larger than the cap could never run.

It is used by the in-process engine (vllm_local.py). A fleet's workers can run it too (`vllm serve
--scheduler-cls app.engine.vllm_scheduler.ForgetFirstScheduler`, with Lethe installed beside vLLM; README, "A vLLM
fleet"; `--additional-config '{"lethe_live_step_tokens": 256}'` for the cap). vLLM calls its scheduler interface
unstable: this class touches `running`, `waiting`, the two slot caps and the step's token budget
(`max_num_scheduled_tokens`), and tests/engine_vllm/test_vllm_scheduler.py checks the behaviour on the installed vLLM.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from app.engine.priority import Priority
from app.engine.vllm_common import LIVE_STEP_TOKENS_KEY


class HoldingScheduler(Scheduler):
    """vLLM's synchronous scheduler with the hold (the CPU backend's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hold_stalled = False  # a hold scheduled nothing: let vLLM's preemption free blocks instead
        self._live_step_tokens = live_step_tokens(self.vllm_config)

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        most_urgent = self._most_urgent()
        if most_urgent is None:
            return super().schedule(*args, **kwargs)
        held_running, held_waiting = self._less_urgent(most_urgent)
        if not held_running and not held_waiting:
            self._hold_stalled = False
            if most_urgent >= Priority.LIVE.vllm and self._live_step_tokens:
                return self._short_step(self._live_step_tokens, *args, **kwargs)
            return super().schedule(*args, **kwargs)
        if self._hold_stalled or self._urgent_has_no_slot(held_waiting):
            return super().schedule(*args, **kwargs)
        held_ids = {request.request_id for request in held_running}
        self.running = [request for request in self.running if request.request_id not in held_ids]
        self.waiting.remove_requests(held_waiting)
        # The held keep their model-runner slots: the scheduler may admit only as many as the slots they leave.
        slots, active = self.max_num_running_reqs, self.max_num_active_reqs
        self.max_num_running_reqs -= len(held_running)
        self.max_num_active_reqs -= len(held_running)
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            self.max_num_running_reqs, self.max_num_active_reqs = slots, active
            self.running.extend(held_running)
            for request in held_waiting:
                self.waiting.add_request(request)
        if output.total_num_scheduled_tokens == 0:
            self._hold_stalled = True
        return output

    def _urgent_has_no_slot(self, held_waiting: list[Request]) -> bool:
        """An urgent request waits and every slot is taken. Holding the running ones would not admit it (held
        requests keep their slots), so they run on until one ends and frees a slot, which vLLM's priority queue
        gives the urgent request; the hold starts at that step."""
        urgent_waiting = len(self.waiting) > len(held_waiting)
        return urgent_waiting and len(self.running) >= min(self.max_num_running_reqs, self.max_num_active_reqs)

    def _short_step(self, budget: int, *args: Any, **kwargs: Any) -> SchedulerOutput:
        """vLLM's step with at most `budget` tokens scheduled: the decodes first, then prefill chunks in what is left
        (vLLM's own order)."""
        full = self.max_num_scheduled_tokens
        self.max_num_scheduled_tokens = min(full, budget)
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.max_num_scheduled_tokens = full

    def _most_urgent(self) -> int | None:
        """The most urgent priority in the engine (vLLM: lower values first), None when it is empty."""
        priorities = [request.priority for request in self.running]
        priorities.extend(request.priority for request in self.waiting)
        return min(priorities, default=None)

    def _less_urgent(self, most_urgent: int) -> tuple[list[Request], list[Request]]:
        """The running and waiting requests less urgent than the most urgent one."""
        return (
            [request for request in self.running if request.priority > most_urgent],
            [request for request in self.waiting if request.priority > most_urgent],
        )


def live_step_tokens(vllm_config: Any) -> int:
    """The token budget of a step that only live work shares (0: vLLM's own budget), from vLLM's
    `additional_config`; never below the decodes a full batch needs (one token per slot), and 0 where vLLM does not
    chunk prefills (a request larger than the budget could then never be scheduled)."""
    extra = vllm_config.additional_config
    value = extra.get(LIVE_STEP_TOKENS_KEY) if isinstance(extra, dict) else None
    if value is None or not vllm_config.scheduler_config.enable_chunked_prefill:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{LIVE_STEP_TOKENS_KEY} must be a whole number of tokens >= 0, not {value!r}")
    return max(value, vllm_config.scheduler_config.max_num_seqs) if value else 0


class HoldingAsyncScheduler(HoldingScheduler, AsyncScheduler):
    """vLLM's scheduler that runs a step ahead of the model (GPUs), with the hold."""


class ForgetFirstScheduler:
    """What `scheduler_cls` names: vLLM builds it with its config, and gets the holding variant of the scheduler it
    would have used itself (vLLM picks `AsyncScheduler` when the platform schedules ahead of the model, e.g. on GPUs;
    a plain `Scheduler` there would cost that overlap)."""

    def __new__(cls, *args: Any, vllm_config: Any, **kwargs: Any) -> Any:
        base = HoldingAsyncScheduler if vllm_config.scheduler_config.async_scheduling else HoldingScheduler
        return base(*args, vllm_config=vllm_config, **kwargs)
