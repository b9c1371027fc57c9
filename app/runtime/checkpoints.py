"""Checkpoints: metadata only, so restoring one is a crop of the cache to its token offset (Lemma 1).

A checkpoint names a transition boundary: `turn` (the transition it ends), `token_offset` (the log length there: a
chunk boundary of the cache, transition 0 included, since the first turn prefills the system block in its own call,
see transition.py), `env_snapshot_id` (none until tools have environments) and `manifest_sha256`, the SHA-256
of the prompt manifest at that boundary: for every live artifact in log order the line
`<artifact id>\\t<token_start>\\t<token_end>\\n`. A forget checks the manifest before it crops, so a boundary
whose prefix has changed since (another forget, a compaction) is never restored by mistake.

Policies (the paper's granularity ablation: any policy is exact, finer ones only reuse more prefix):
- `every_turn`: one at the end of every transition, transition 0 and empty transitions included;
- `session_start`: only the end of transition 0;
- `before_injections`: the boundary just before a transition that adds outside content (a document, a tool result),
  i.e. the end of the previous transition.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from app.runtime.blocks import INJECTION_KINDS

CheckpointPolicy = Literal["every_turn", "before_injections", "session_start"]


@dataclass(frozen=True)
class Boundary:
    turn: int
    token_offset: int
    manifest_sha256: str


def manifest_sha256(entries: Iterable[tuple[str, int, int]]) -> str:
    digest = hashlib.sha256()
    for artifact_id, start, end in entries:
        digest.update(f"{artifact_id}\t{start}\t{end}\n".encode())
    return digest.hexdigest()


def boundary(turn: int, entries: list[tuple[str, int, int]]) -> Boundary:
    offset = entries[-1][2] if entries else 0
    return Boundary(turn, offset, manifest_sha256(entries))


def at_session_start(policy: str, entries: list[tuple[str, int, int]]) -> list[Boundary]:
    return [boundary(0, entries)] if policy in ("every_turn", "session_start") else []


def for_transition(
    policy: str,
    turn: int,
    added_kinds: Iterable[str],
    before: list[tuple[str, int, int]],
    after: list[tuple[str, int, int]],
) -> list[Boundary]:
    """The checkpoints transition `turn` records; `before`/`after` are the manifests at its start and end."""
    if policy == "every_turn":
        return [boundary(turn, after)]
    if policy == "before_injections" and INJECTION_KINDS.intersection(added_kinds):
        return [boundary(turn - 1, before)]
    return []
