"""Running episodes against Lethe: build a contaminated session, forget with one method, question what is left.

Every method gets its own contaminated session, built by the same script with the same seed: sessions are
deterministic given their seed (each transition's seed derives from the session's), so the ten copies are the same
state (the receipts' `state_sha256_before` show it, and the report checks it) and every comparison is paired. A
method's forget then runs on its copy, and the probes question the result.

Probes are isolated: after each probe the harness forgets the probe's own input with `selective_replay` (a
one-transition replay of an empty transition), so every probe sees the same post-forget state, as in the paper,
instead of the previous probes' answers. Should that undo fail, the remaining probes run in sequence, and the run
says so."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from lethe_client import LetheAPIError

from bench.eval.api import JobFailed, Json, Lethe
from bench.eval.episodes import Episode, Preference, Step


@dataclass
class Built:
    session_id: str
    namespace: str | None
    acquisition_ids: list[str]
    seconds: float
    notes: list[str] = field(default_factory=list)


@dataclass
class Answer:
    text: str
    tool_calls: list[Json]


@dataclass
class Forgot:
    """One forget job as the harness saw it (the receipt's entry for the episode's session)."""

    strategy: str
    tau: int | None
    T: int | None
    transitions_replayed: int
    reused: int
    prefilled: int
    decoded: int
    full_reset_estimate: int
    duration_ms: float
    client_s: float
    state_before: str | None
    state_after: str | None
    suppressed: int
    committed: int

    @property
    def recomputed(self) -> int:
        return self.prefilled + self.decoded


@dataclass
class MethodRun:
    suite: str
    episode: str
    method: str
    build_s: float
    forgot: Forgot | None
    answers: dict[str, Answer] = field(default_factory=dict)
    state: str = ""  # the live artifacts' text after the forget (before any probe)
    tool_args: list[str] = field(default_factory=list)  # live calls and pending ones, canonical JSON
    memory: dict[str, str] = field(default_factory=dict)  # the namespace's live records (write-backs included)
    isolated: bool = True
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> Json:
        return asdict(self)


def run_steps(
    lethe: Lethe, *, system_prompt: str, tools: list[Json], memory: dict[str, str], steps: list[Step],
    sampling: Json, namespace: str | None, write_back: bool = False,
) -> Built:
    start = time.perf_counter()
    for key, value in memory.items():
        assert namespace is not None
        lethe.remember(namespace, key, value)
    fields: Json = {"system_prompt": system_prompt, "sampling": sampling}
    if tools:
        fields["tools"] = tools
    if namespace is not None:
        fields["memory_namespace"] = namespace
    session_id = lethe.create_session(**fields)
    acquisition: list[str] = []
    notes: list[str] = []
    for step in steps:
        if step.compact:
            lethe.compact(session_id, keep_last_turns=1, write_back=write_back and namespace is not None)
            continue
        inputs = list(step.inputs)
        if step.answer_tool:
            pending = [c for c in lethe.session(session_id)["pending_tool_calls"] if c["name"] == step.answer_tool]
            if pending:
                inputs = [{"type": "tool_result", "tool_call_id": pending[0]["id"], "content": step.content}]
            else:  # the model did not make the call: the observation still arrives, as a document
                inputs = [{"type": "document", "content": step.content, "source": step.answer_tool}]
                notes.append(f"the model did not call {step.answer_tool}: its result arrived as a document")
        turn = lethe.turn(session_id, inputs, generate=step.generate)
        if step.acquisition:
            acquisition = turn.input_ids
    return Built(session_id, namespace, acquisition, time.perf_counter() - start, notes)


def build_episode(lethe: Lethe, episode: Episode, sampling: Json, namespace: str) -> Built:
    return run_steps(
        lethe, system_prompt=episode.system_prompt, tools=episode.tools, memory=episode.memory, steps=episode.steps,
        sampling=sampling, namespace=namespace if episode.memory or episode.write_back else None,
        write_back=episode.write_back,
    )


def target_of(episode: Episode, built: Built) -> Json:
    if episode.target == "memory":
        assert built.namespace is not None
        return {"memory": {"namespace": built.namespace, "key": episode.target_key}}
    return {"session_id": built.session_id, "text": episode.target_key}


def forgot_from(job: Json, session_id: str, client_s: float) -> Forgot:
    entry = next((s for s in job.get("sessions", []) if s["session_id"] == session_id), None) or {}
    tokens = entry.get("tokens") or {}
    return Forgot(
        strategy=str(job["strategy"]), tau=entry.get("tau"), T=entry.get("T"),
        transitions_replayed=int(entry.get("transitions_replayed") or 0), reused=int(tokens.get("reused") or 0),
        prefilled=int(tokens.get("prefilled") or 0),
        # Tokens sampled: decoded, or verified from the recorded reply (LETHE_REPLAY_VERIFY): the same decisions.
        decoded=int(tokens.get("decoded") or 0) + int(tokens.get("verified") or 0),
        full_reset_estimate=int(tokens.get("full_reset_estimate") or 0), duration_ms=float(job.get("duration_ms") or 0),
        client_s=client_s, state_before=entry.get("state_sha256_before"), state_after=entry.get("state_sha256_after"),
        suppressed=len(job.get("suppressed_side_effects") or []),
        committed=len(job.get("committed_side_effects") or []),
    )


def snapshot(lethe: Lethe, run: MethodRun, session_id: str, namespace: str | None) -> None:
    """What the state holds after the forget: live artifacts' text, tool arguments (live and pending), memory."""
    items = lethe.artifacts(session_id)
    run.state = "\n".join(a["content"] for a in items)
    run.tool_args = [a["content"] for a in items if a["kind"] == "tool_call"]
    pending = lethe.session(session_id)["pending_tool_calls"]
    run.tool_args += [json.dumps(c["arguments"], sort_keys=True) for c in pending]
    if namespace is not None:
        run.memory = lethe.memory_values(namespace)


def ask(lethe: Lethe, run: MethodRun, session_id: str, name: str, text: str, isolate: bool) -> None:
    """One probe turn; then, if isolating, forget the probe so the next one sees the same state."""
    turn = lethe.turn(session_id, [{"type": "user", "content": text}])
    run.answers[name] = Answer(turn.reply, turn.tool_calls)
    if isolate and run.isolated:
        try:
            lethe.forget({"artifact_id": turn.input_ids[0]}, "selective_replay")
        except (JobFailed, LetheAPIError) as exc:
            run.isolated = False
            run.notes.append(f"undoing probe {name} failed ({exc}); later probes ran in sequence")


def run_method(
    lethe: Lethe, episode: Episode, method: str, strategy: str, sampling: Json, namespace: str,
    probes: dict[str, str], isolate: bool,
) -> MethodRun:
    built = build_episode(lethe, episode, sampling, namespace)
    run = MethodRun(episode.suite, episode.name, method, built.seconds, None, notes=list(built.notes))
    try:
        job, seconds = lethe.forget(target_of(episode, built), strategy)
        run.forgot = forgot_from(job, built.session_id, seconds)
        snapshot(lethe, run, built.session_id, built.namespace)
        for name, text in probes.items():
            ask(lethe, run, built.session_id, name, text, isolate)
    except (JobFailed, LetheAPIError) as exc:
        run.error = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        with contextlib.suppress(LetheAPIError):
            lethe.http.delete(f"/v1/sessions/{built.session_id}", headers=lethe.auth)
    return run


@dataclass
class PreferenceRun:
    episode: int
    method: str
    excluded: str
    kept: str
    picks: list[str | None]  # per order: the option named first in the answer, None when neither
    answers: list[str]
    forgot: Forgot | None
    error: str | None = None


def pick(answer: str, options: tuple[str, str]) -> str | None:
    """The option the answer names first (by its distinctive first word), None if it names neither."""
    low = answer.lower()
    at = {o: low.find(o.split()[0].lower()) for o in options}
    named = [o for o, i in sorted(at.items(), key=lambda x: x[1]) if i >= 0]
    return named[0] if named else None


def run_preference(
    lethe: Lethe, episode: Preference, method: str, strategy: str, sampling: Json, isolate: bool
) -> PreferenceRun:
    built = run_steps(lethe, system_prompt="You are a helpful assistant that books services for the user.", tools=[],
                      memory={}, steps=episode.steps, sampling=sampling, namespace=None)
    out = PreferenceRun(episode.index, method, episode.excluded, episode.kept, [], [], None)
    try:
        job, seconds = lethe.forget({"artifact_id": built.acquisition_ids[0]}, strategy)
        out.forgot = forgot_from(job, built.session_id, seconds)
        holder = MethodRun("preference", str(episode.index), method, built.seconds, out.forgot)
        for k, query in enumerate(episode.queries):
            ask(lethe, holder, built.session_id, f"order{k}", query, isolate)
            answer = holder.answers[f"order{k}"].text
            out.answers.append(answer)
            out.picks.append(pick(answer, episode.options))
    except (JobFailed, LetheAPIError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        with contextlib.suppress(LetheAPIError):
            lethe.http.delete(f"/v1/sessions/{built.session_id}", headers=lethe.auth)
    return out


def answers_json(runs: list[Any]) -> list[Json]:
    return [asdict(r) for r in runs]
