"""Which replayed replies a forget leaves unchanged: the figure that decides what verified replay can save.

    .venv/bin/python -m bench.replay_dependence --url http://127.0.0.1:8000 --key <key> [--tau 4] [--turns 16]
        [--target "By the way, it is sunny here today."]

Runs `bench/forget_bench.py`'s session (greedy, T transitions, the ~1000-token clean prefix, the target at τ), forgets
the target with `selective_replay`, and prints each reply after the target before and after the forget, with the
mode the receipt gives its replay (`verified`: the recorded reply accepted whole; `verified+decoded`: accepted up to
its first difference, decoded on; `decoded`: different from its first token). Against any running server: its engine
and `LETHE_REPLAY_VERIFY` are the server's. The receipt's token counts close the report.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx

import bench.forget_bench as forget_bench


def replies(client: httpx.Client, session_id: str) -> dict[int, dict[str, Any]]:
    """The session's replies by transition."""
    r = client.get(f"/v1/sessions/{session_id}/artifacts")
    r.raise_for_status()
    return {a["turn"]: a for a in r.json()["artifacts"] if a["kind"] == "assistant"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--tau", type=int, default=4)
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--handbook-words", type=int, default=700)
    parser.add_argument("--target", default=forget_bench.TARGET, help="the forgotten message")
    args = parser.parse_args()

    forget_bench.TARGET = args.target  # build_session finds the target by its text
    client = httpx.Client(base_url=args.url, headers={"Authorization": f"Bearer {args.key}"}, timeout=900)
    system = forget_bench.SYSTEM + "\n\n" + forget_bench.handbook(args.handbook_words)
    sampling = {"temperature": 0, "max_tokens": args.max_tokens}
    session_id, target = forget_bench.build_session(client, forget_bench.script(args.tau, args.turns), sampling, system)
    before = replies(client, session_id)
    job, seconds = forget_bench.forget(client, target, "selective_replay", timeout_s=900)
    after = replies(client, session_id)

    [receipt] = job["sessions"]
    modes = receipt.get("replay_modes") or {}
    unchanged = 0
    for turn in sorted(t for t in before if t > args.tau):
        old, new = before[turn]["content"], after[turn]["content"] if turn in after else None
        unchanged += old == new
        print(f"transition {turn}: {modes.get(str(turn), '?')}, {'unchanged' if old == new else 'changed'}\n"
              f"  before: {old!r}\n  after:  {new!r}")
    replayed = len([t for t in before if t > args.tau])
    print(f"\n{unchanged} of {replayed} replies after the target unchanged; forget {seconds:.2f} s; receipt tokens "
          f"{json.dumps(receipt['tokens'])}")


if __name__ == "__main__":
    main()
