"""DeLLM evaluation on persona facts (the paper's PF experiment, section VI-E): deletion rate and utility, before and
after a deletion request, for provenance deletion, selective regeneration and semantic deletion.

    python -m bench.dellm_eval [--records 6] [--seed 0] [--thresholds 0.2,0.4,0.6,0.8] [--max-tokens 20]

One `lethe serve` (embedded PostgreSQL in a temp dir, the tiny default model). For each record of
bench/persona_facts.py and each system below, a fresh session hears the ten statements and the five requests (one
turn each, the model replying), is asked the four questions (before), gets the deletion request for the forget fact,
and is asked the four questions again (after). Systems:

- `retrieval + delete_dependents` (DeLLM): a retrieval session (top_k 5, min_similarity 0.25); the user says
  "Forget that <statement>" in the session, which answers with a plan; the plan is confirmed with
  `delete_dependents` (M and Dep(M) deleted).
- `retrieval + selective_replay`: the same plan confirmed with `selective_replay` (Dep(M) regenerated).
- `full + selective_replay`: a full-history session (the whole transcript is the context), the plan confirmed with
  `selective_replay` (Algorithm 1: replay from the checkpoint before the statement).
- `full + semantic_deletion@t`: a full-history session; every artifact at least t similar to the statement is
  deleted (`semantic_deletion`, a query target), no provenance, no regeneration.

Scores, per system, over records, before and after the deletion:

- in context: whether the gold answer was in what the question's reply was generated from (its provenance parents
  in a retrieval session, the whole live log in a full one). For the forget question this is the deletion rate's
  complement (lower is better after); for the three retain questions it is the utility the system keeps available
  (higher is better). It does not depend on the model's skill, only on what the system lets it see;
- `residual`: the share of records whose live state still holds the forget answer anywhere after the deletion;
  `collateral`: retain statements deleted with it;
- accuracy: the reply holds the gold answer (no judge model: we have none offline; the paper's ROUGE-L recall table
  makes the same kind of call). The tiny default model (SmolLM2-135M) rarely answers these questions even with the
  fact in its context, so its accuracies are near 0 before deletion too: read the context columns.

Writes bench/results/dellm_eval.json and .md and prints the markdown.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from bench.forget_bench import API_KEY, RESULTS, serve
from bench.persona_facts import Record, generate

SYSTEM = "You are a helpful personal assistant. Answer briefly."


@dataclass(frozen=True)
class System:
    name: str
    policy: str  # context policy
    strategy: str
    threshold: float | None = None  # semantic deletion only


@dataclass
class Outcome:
    system: str
    record: int
    forget_before: bool
    forget_after: bool
    retain_before: list[bool]
    retain_after: list[bool]
    forget_context_before: bool  # the forget answer was in the forget question's context
    forget_context_after: bool
    retain_context_before: list[bool]
    retain_context_after: list[bool]
    residual: bool
    collateral: int  # retain statements deleted
    deleted: int  # artifacts the forget removed
    regenerated: int  # model outputs the forget regenerated
    forget_s: float
    errors: list[str] = field(default_factory=list)


def systems(thresholds: list[float]) -> list[System]:
    return [
        System("retrieval + delete_dependents (DeLLM)", "retrieval", "delete_dependents"),
        System("retrieval + selective_replay", "retrieval", "selective_replay"),
        System("full + selective_replay", "full", "selective_replay"),
        *(System(f"full + semantic_deletion@{t:g}", "full", "semantic_deletion", t) for t in thresholds),
    ]


def correct(answer: str, gold: str) -> bool:
    return gold.casefold() in answer.casefold()


def turn(client: httpx.Client, session_id: str, text: str) -> dict[str, Any]:
    r = client.post(f"/v1/sessions/{session_id}/turns", json={"inputs": [{"type": "user", "content": text}]})
    r.raise_for_status()
    body: dict[str, Any] = r.json()
    return body


@dataclass(frozen=True)
class Asked:
    correct: list[bool]  # per question (qa order): the reply holds the gold answer
    in_context: list[bool]  # per question: the gold answer was in what the reply was generated from


def ask(client: httpx.Client, session_id: str, record: Record, policy: str) -> Asked:
    answers, contexts = [], []
    for fact in record.qa:
        reply = turn(client, session_id, fact.question)["reply"]
        answers.append(correct(reply["content"], fact.answer))
        contexts.append(any(correct(text, fact.answer) for text in context_of(client, session_id, reply, policy)))
    return Asked(answers, contexts)


def context_of(client: httpx.Client, session_id: str, reply: dict[str, Any], policy: str) -> list[str]:
    """What a reply was generated from: its provenance parents in a retrieval session; in a full session, the whole
    live log before it (its stored parents are only the transitive reduction of that prefix)."""
    items = live(client, session_id)
    index = next(i for i, a in enumerate(items) if a["id"] == reply["artifact_id"])
    if policy == "retrieval":
        by_id = {a["id"]: a for a in items}
        return [by_id[p]["content"] for p in items[index]["parents"] if p in by_id]
    return [a["content"] for a in items[:index]]


def live(client: httpx.Client, session_id: str) -> list[dict[str, Any]]:
    r = client.get(f"/v1/sessions/{session_id}/artifacts")
    r.raise_for_status()
    items: list[dict[str, Any]] = r.json()["artifacts"]
    return items


def wait(client: httpx.Client, job: dict[str, Any], timeout_s: float = 900) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while job["status"] in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(0.2)  # polling a job as a client would
        job = client.get(f"/v1/forget/{job['id']}").json()
    return job


def forget(client: httpx.Client, system: System, session_id: str, record: Record) -> dict[str, Any]:
    statement = record.forget.statement
    if system.strategy == "semantic_deletion":
        target = {"session_id": session_id, "query": statement, "min_similarity": system.threshold}
        r = client.post("/v1/forget", json={"target": target, "strategy": system.strategy, "wait": True})
    else:
        # The request in plain words; the session answers with a plan, which the client confirms.
        plan = turn(client, session_id, f"Forget that {statement[0].lower()}{statement[1:]}")["forget_plan"]
        if plan is None:
            raise RuntimeError("the deletion request matched nothing")
        r = client.post("/v1/forget", json={"plan_id": plan["id"], "strategy": system.strategy, "wait": True})
    r.raise_for_status()
    return wait(client, r.json())


def run_one(client: httpx.Client, system: System, record: Record, args: argparse.Namespace) -> Outcome:
    config: dict[str, Any] = {
        "system_prompt": SYSTEM, "context_policy": system.policy,
        "sampling": {"temperature": 0, "max_tokens": args.max_tokens, "seed": record.index},
    }
    if system.policy == "retrieval":
        config["retrieval"] = {"top_k": args.top_k, "min_similarity": args.min_similarity}
    r = client.post("/v1/sessions", json=config)
    r.raise_for_status()
    session_id = r.json()["id"]
    ids = {}
    for text in [*record.statements, *record.requests]:
        ids[text] = turn(client, session_id, text)["inputs"][0]["artifact_id"]
    before = ask(client, session_id, record, system.policy)
    count = len(live(client, session_id))
    started = time.monotonic()
    job = forget(client, system, session_id, record)
    forget_s = time.monotonic() - started
    errors = [] if job["status"] == "succeeded" else [f"forget {job['status']}: {job.get('error')}"]
    items = live(client, session_id)
    kept = {a["id"] for a in items}
    residual = any(correct(a["content"], record.forget.answer) for a in items)
    collateral = sum(1 for f in record.retain if ids[f.statement] not in kept)
    regenerated = sum(s["transitions_replayed"] for s in job.get("sessions", []))
    after = ask(client, session_id, record, system.policy)
    client.delete(f"/v1/sessions/{session_id}")
    return Outcome(
        system.name, record.index, before.correct[0], after.correct[0], before.correct[1:], after.correct[1:],
        before.in_context[0], after.in_context[0], before.in_context[1:], after.in_context[1:], residual, collateral,
        max(0, count - len(kept)), regenerated, forget_s, errors,
    )


def pct(values: list[bool]) -> float:
    return 100.0 * sum(values) / len(values) if values else 0.0


def table(outcomes: list[Outcome], names: list[str]) -> str:
    lines = [
        "| system | forget answer in context: before / after (lower is better) | retain answers in context: before / "
        "after | forget answer left in live state | retain statements deleted | forget acc. before / after "
        "| retain acc. before / after | artifacts deleted | outputs regenerated | forget wall s (median) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        rows = [o for o in outcomes if o.system == name and not o.errors]
        if not rows:
            lines.append(f"| {name} | failed | | | | | | | | |")
            continue

        def both(before: list[bool], after: list[bool]) -> str:
            return f"{pct(before):.0f}% / {pct(after):.0f}%"

        retain_context = both(
            [v for o in rows for v in o.retain_context_before], [v for o in rows for v in o.retain_context_after]
        )
        lines.append(
            f"| {name} | {both([o.forget_context_before for o in rows], [o.forget_context_after for o in rows])} "
            f"| {retain_context} "
            f"| {pct([o.residual for o in rows]):.0f}% | {sum(o.collateral for o in rows)}/{3 * len(rows)} "
            f"| {both([o.forget_before for o in rows], [o.forget_after for o in rows])} "
            f"| {both([v for o in rows for v in o.retain_before], [v for o in rows for v in o.retain_after])} "
            f"| {statistics.mean(o.deleted for o in rows):.1f} | {statistics.mean(o.regenerated for o in rows):.1f} "
            f"| {statistics.median(o.forget_s for o in rows):.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--thresholds", default="0.2,0.4,0.6,0.8")
    parser.add_argument("--max-tokens", type=int, default=20)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--min-similarity", type=float, default=0.25)
    parser.add_argument("--engine", default="hf")
    args = parser.parse_args()
    records = generate(args.records, args.seed)
    chosen = systems([float(t) for t in args.thresholds.split(",") if t])
    outcomes: list[Outcome] = []
    started = time.monotonic()
    with serve(args.engine, 600) as server, httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=600
    ) as client:
        for record in records:
            for system in chosen:
                try:
                    outcome = run_one(client, system, record, args)
                except (httpx.HTTPError, RuntimeError, KeyError) as exc:
                    outcome = Outcome(system.name, record.index, False, False, [], [], False, False, [], [],
                                      False, 0, 0, 0, 0.0, [f"{type(exc).__name__}: {exc}"])
                outcomes.append(outcome)
                print(f"record {record.index} {system.name}: {asdict(outcome)}", flush=True)
    elapsed = time.monotonic() - started
    md = (
        f"# DeLLM on persona facts ({args.records} records, seed {args.seed}, engine {args.engine}, "
        f"max_tokens {args.max_tokens}, top_k {args.top_k}, min_similarity {args.min_similarity})\n\n"
        f"{table(outcomes, [s.name for s in chosen])}\n\n"
        f"Run time {elapsed / 60:.1f} min. Errors: {sum(1 for o in outcomes if o.errors)}.\n"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "dellm_eval.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    (RESULTS / "dellm_eval.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
