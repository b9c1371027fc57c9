"""Request priorities on a vLLM fleet (engine vllm-remote): whether to send them, decided at start.

vLLM serves its waiting requests in the order of their `priority` (lower first) when it runs with
`--scheduling-policy priority`, in arrival order with the default `fcfs`. The engine sends each request's priority
(app/engine/priority.py: a forget's replay before live turns) in the completion body, which vllm-router passes on.
Whether the fleet schedules by it the engine cannot see: vLLM reports no scheduler settings (outside its dev mode), and
vLLM 0.32 accepts a priority under `fcfs` and ignores it, where earlier releases refused it with a 400 ("Priority
scheduling is not enabled"). So it is configured (`LETHE_VLLM_REMOTE_PRIORITY`) and probed, never assumed:

- `auto` (the default): the start-up probe carries a non-zero priority; a fleet that refuses it gets no priority from
  then on (a warning says so), one that accepts it gets every request's;
- `on`: the same probe, and a fleet that refuses it fails the start (a misconfigured fleet is found at once);
- `off`: no priority is sent.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from app.engine.priority import Priority

log = logging.getLogger(__name__)

PriorityMode = Literal["auto", "on", "off"]
PROBE_PRIORITY = Priority.DETECTOR  # non-zero: what a fleet without priority scheduling may refuse

Probe = Callable[[Priority | None], Awaitable[dict[str, Any]]]  # one completion at that priority (None: none sent)


class FleetRefusesPriority(RuntimeError):
    """LETHE_VLLM_REMOTE_PRIORITY=on, and the fleet refused a request priority."""


async def probe_priority(probe: Probe, mode: PriorityMode) -> tuple[dict[str, Any], bool]:
    """The start-up probe's answer, and whether to send request priorities from now on."""
    if mode == "off":
        return await probe(None), False
    try:
        return await probe(PROBE_PRIORITY), True
    except ValueError as refused:  # the fleet's 4xx (vllm_remote_wire.answer)
        if "priority" not in str(refused).lower():
            raise
        if mode == "on":
            raise FleetRefusesPriority(
                "the vllm fleet refuses request priorities: serve it with --scheduling-policy priority, or set "
                "LETHE_VLLM_REMOTE_PRIORITY=off"
            ) from refused
        log.warning("the vllm fleet refuses request priorities: a forget's replay waits in arrival order there (%s)",
                    refused)
        return await probe(None), False
