"""Where one selective-replay forget spends its time, sampled by py-spy on the server while the forget runs.

    python -m bench.forget_profile [--tau 4] [--engine hf] [--py-spy PATH] [--rate 200]

The session is bench.forget_bench's at the paper's setting (T = 16 transitions, the target at `--tau`, a ~1000-token
clean handbook in the system prompt, greedy, 16-token replies), on a fresh `lethe serve` (`--engine hf`, or
`hf-decode` for replays that decode every reply). One throwaway forget first (a process's first job pays one-off
costs), then a second identical session is built and forgotten while `py-spy record --subprocesses --format raw`
samples the server. py-spy is not a dependency of the project: install it anywhere (`pip install --target DIR
py-spy`) and pass `--py-spy DIR/bin/py-spy`.

Reports the forget's wall time, its receipt's token counts, and the sampled seconds by where they went: the engine
thread's decode steps, observation prefills and verification passes, the forget's own Python and database work (the
executor, heartbeats, session leases), and request handling; and the CPU seconds the embedded PostgreSQL spent
meanwhile (read from /proc: py-spy sees Python only). Writes bench/results/forget_profile.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.forget_bench import SYSTEM, build_session, forget, handbook, script, serve, tenant_key

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"

# A sample's stack, reduced to the first of these frames it holds (in this order): where the time went.
PLACES = (
    ("decode steps", "Generating._decode"),
    ("verification passes", "Generating._verify"),
    ("observation prefills", "HFEngine._prefill"),
    ("other engine work", "PriorityWorker._advance"),
    ("forget executor (Python, database)", "ForgetWorker.run"),
    ("heartbeats and session leases", "ForgetWorker._heartbeat"),
    ("heartbeats and session leases", "SessionLocks._renew"),
    ("request handling", "ObservabilityMiddleware.__call__"),
)
_FRAME = re.compile(r"^\s*(\S+) \(")


def places(raw: Path, rate: int) -> dict[str, float]:
    """Seconds per place in a py-spy raw profile (`stack;stack;... count` per line); what matches none is left out
    (idle threads, the event loop waiting)."""
    seconds: collections.defaultdict[str, float] = collections.defaultdict(float)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [m.group(1) for f in stack.split(";") if (m := _FRAME.match(f))]
        place = next((name for name, frame in PLACES if frame in frames), None)
        if place is not None:
            seconds[place] += int(count) / rate
    return dict(seconds)


def postgres_cpu_s(data_dir: Path) -> float:
    """CPU seconds (user + system) spent so far by the embedded PostgreSQL under `data_dir`: its postmaster (the
    process whose command line names the directory) and the backends it forked (py-spy samples Python only)."""
    ticks = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent, cpu seconds)
    postmasters = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if str(data_dir).encode() in (entry / "cmdline").read_bytes():
                postmasters.append(int(entry.name))
        except OSError:
            continue  # ended meanwhile
        stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
    return sum(cpu for pid, (parent, cpu) in stats.items() if pid in postmasters or parent in postmasters)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tau", type=int, default=4)
    parser.add_argument("--engine", default="hf", choices=["hf", "hf-decode"])
    parser.add_argument("--py-spy", default="py-spy", help="the py-spy executable")
    parser.add_argument("--rate", type=int, default=200, help="samples per second")
    args = parser.parse_args()
    sampling = {"temperature": 0, "max_tokens": 16, "seed": 7}
    system = SYSTEM + "\n\n" + handbook(700)
    raw = Path(tempfile.mkdtemp(prefix="forget-profile-")) / "profile.txt"
    with serve(args.engine, 600) as server:
        key = tenant_key(server, "profile")
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=600) as client:
            _, warm = build_session(client, script(args.tau, 16), sampling, system)
            forget(client, warm, "selective_replay", 600)
            _, target = build_session(client, script(args.tau, 16), sampling, system)
            spy = subprocess.Popen(
                [args.py_spy, "record", "--pid", str(server.proc.pid), "--subprocesses", "--rate", str(args.rate),
                 "--format", "raw", "-o", str(raw)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ},
            )
            time.sleep(2)  # py-spy attaches: nothing to wait on but its start
            postgres_before = postgres_cpu_s(server.data_dir)
            try:
                job, wall_s = forget(client, target, "selective_replay", 600)
            finally:
                postgres_s = postgres_cpu_s(server.data_dir) - postgres_before
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=120)
    tokens: dict[str, Any] = job["sessions"][0]["tokens"]
    sampled = places(raw, args.rate)
    result = {
        "engine": args.engine, "tau": args.tau, "wall_s": round(wall_s, 2), "tokens": tokens,
        "transitions_replayed": job["sessions"][0]["transitions_replayed"],
        "seconds": {k: round(v, 2) for k, v in sorted(sampled.items(), key=lambda kv: -kv[1])},
        "postgres_cpu_s": round(postgres_s, 2),
        "load_avg": os.getloadavg(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "forget_profile.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
