"""A PostgreSQL primary and a streaming replica on loopback, made from the binaries the `pgserver` package ships.

The tests of read replicas (tests/replicas/) and `bench.memory_bench --replica` use it, and so can anyone trying the
README's "Read replicas" section without a PostgreSQL of their own:

    python -m bench.replication up /tmp/lethe-pair      # prints LETHE_DATABASE_URL and LETHE_DATABASE_REPLICA_URLS
    python -m bench.replication catch-up /tmp/lethe-pair  # returns once the replica has replayed all there is
    python -m bench.replication pause /tmp/lethe-pair   # the replica stops replaying (it lags from now on)
    python -m bench.replication resume /tmp/lethe-pair
    python -m bench.replication down /tmp/lethe-pair    # stops both servers and removes the directory

`initdb --auth=trust`, then `pg_basebackup -R -X stream` of the running primary, so the replica follows it over
streaming replication like any production standby. PostgreSQL refuses to run as root; as root every binary runs as
the system user `pgserver` (the one pgserver itself creates and uses). Servers listen on 127.0.0.1 only, on free
ports, with no Unix socket, and are stopped by the pid in their `postmaster.pid`, never by name.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil

from bench.serve import free_port

DATABASE = "lethe"
POLL_S = 0.02  # a barrier looking again (replay caught up, a server gone); it waits for an event, not a duration


def _pgserver() -> Any:
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")  # pgserver's lock directory falls back to /tmp
    import pgserver  # type: ignore[import-untyped]

    return pgserver


def _bin(name: str) -> str:
    return str(Path(_pgserver().__file__).parent / "pginstall" / "bin" / name)


def _as_postgres_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", "pgserver", "--", *command] if os.geteuid() == 0 else command


def _run(*command: str) -> str:
    done = subprocess.run(_as_postgres_user(list(command)), capture_output=True, text=True, check=False, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip() or done.stdout}")
    return done.stdout


def _let_postgres_user_in() -> None:
    """What pgserver does before its own initdb as root: the user exists and can reach and run the binaries."""
    import stat

    _pgserver()
    from pgserver._commands import POSTGRES_BIN_PATH  # type: ignore[import-untyped]
    from pgserver.utils import (  # type: ignore[import-untyped]
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

    ensure_user_exists("pgserver")
    ensure_prefix_permissions(POSTGRES_BIN_PATH)
    readable, runnable = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
    ensure_folder_permissions(POSTGRES_BIN_PATH, runnable | readable)
    ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", readable)


def query(url: str, sql: str, *args: object) -> list[asyncpg.Record]:
    """One statement on a connection of its own (setup, barriers, looking at a server)."""
    import asyncio

    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(url, timeout=10)
        try:
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()

    return asyncio.run(run())


def served_reads(base_url: str) -> Counter[tuple[str, str]]:
    """A Lethe server's `lethe_reads_total` (reads a replica may serve) as {(served_by, reason): count}."""
    counts: Counter[tuple[str, str]] = Counter()
    for line in httpx.get(f"{base_url}/metrics", timeout=30).text.splitlines():
        if line.startswith("lethe_reads_total{"):
            labels = dict(re.findall(r'([a-z_]+)="([^"]*)"', line))
            counts[(labels["served_by"], labels["reason"])] = int(float(line.rsplit(" ", 1)[1]))
    return counts


@dataclass
class Server:
    pgdata: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def log(self) -> Path:
        return self.pgdata.parent / f"{self.pgdata.name}.log"

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''"
        _run(_bin("pg_ctl"), "-D", str(self.pgdata), "-o", options, "-l", str(self.log), "-w", "-t", "120", "start")

    def pid(self) -> int | None:
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
            pid = int((self.pgdata / "postmaster.pid").read_text().splitlines()[0])
            return pid if psutil.pid_exists(pid) else None
        return None

    def stop(self) -> None:
        if self.pid() is not None:
            _run(_bin("pg_ctl"), "-D", str(self.pgdata), "-m", "fast", "-w", "-t", "120", "stop")

    def kill(self) -> None:
        """SIGKILL to the postmaster and each of its processes, by pid: the server is gone at once, like a crash."""
        pid = self.pid()
        if pid is None:
            return
        postmaster = psutil.Process(pid)
        processes = [postmaster, *postmaster.children(recursive=True)]
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(processes, timeout=30)


class ReplicaPair:
    """A primary and one streaming replica of it under `root` (a directory of their own)."""

    def __init__(self, root: Path, primary: Server, replica: Server) -> None:
        self.root = root
        self.primary = primary
        self.replica = replica
        self.promoted = False  # the replica was promoted: it replicates nothing any more

    @classmethod
    def create(cls, root: Path | None = None, *, durable: bool = True, archive: bool = False) -> ReplicaPair:
        """Init, start and replicate. `durable=False` turns fsync off (tests: faster, and nothing to survive);
        `archive` copies every finished WAL segment of the primary to `root/archive`, as a production WAL archive
        (`archive_command`) does."""
        root = Path(tempfile.mkdtemp(prefix="lethe-replicas-")) if root is None else root
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)
        if os.geteuid() == 0:
            shutil.chown(root, "pgserver", "pgserver")
        pair = cls(root, Server(root / "primary", free_port()), Server(root / "replica", free_port()))
        try:
            pair._init(durable, archive)
        except BaseException:
            pair.destroy()
            raise
        (root / "pair.json").write_text(json.dumps({"primary": pair.primary.port, "replica": pair.replica.port}))
        return pair

    @classmethod
    def load(cls, root: Path) -> ReplicaPair:
        ports = json.loads((root / "pair.json").read_text())
        return cls(root, Server(root / "primary", ports["primary"]), Server(root / "replica", ports["replica"]))

    @property
    def archive(self) -> Path:
        return self.root / "archive"

    def _init(self, durable: bool, archive: bool) -> None:
        if os.geteuid() == 0:
            _let_postgres_user_in()
        _run(_bin("initdb"), "-D", str(self.primary.pgdata), "--auth=trust", "-U", "postgres", "-E", "utf8")
        settings = ["hot_standby = on", "wal_level = replica", "max_wal_senders = 10"]
        if not durable:
            settings.append("fsync = off")
        if archive:
            self.archive.mkdir()
            if os.geteuid() == 0:
                shutil.chown(self.archive, "pgserver", "pgserver")
            settings += ["archive_mode = on", f"archive_command = 'cp %p {self.archive}/%f'"]
        with (self.primary.pgdata / "postgresql.conf").open("a") as conf:
            conf.write("\n".join(["", "# bench/replication.py", *settings, ""]))
        self.primary.start()
        admin = self.primary.url.rsplit("/", 1)[0] + "/postgres"
        query(admin, f"CREATE DATABASE {DATABASE}")
        _run(_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
             "-D", str(self.replica.pgdata), "-R", "-X", "stream", "-c", "fast")
        self.replica.start()
        self.wait_caught_up()

    # ---- replay control: the barriers tests use instead of sleeping ------------------------------------------------

    def pause_replay(self) -> None:
        query(self.replica.url, "SELECT pg_wal_replay_pause()")
        while query(self.replica.url, "SELECT pg_get_wal_replay_pause_state() AS s")[0]["s"] != "paused":
            time.sleep(POLL_S)

    def resume_replay(self) -> None:
        query(self.replica.url, "SELECT pg_wal_replay_resume()")

    def wait_caught_up(self, timeout_s: float = 120) -> None:
        """Until the replica has replayed everything the primary had written when this was called."""
        target = query(self.primary.url, "SELECT pg_current_wal_lsn() AS at")[0]["at"]
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError, asyncpg.PostgresError):
                replayed = query(self.replica.url, "SELECT pg_last_wal_replay_lsn() AS at")[0]["at"]
                if replayed is not None and replayed >= target:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the replica did not replay up to {target} in {timeout_s:.0f} s")
            time.sleep(POLL_S)

    def base_backup(self, name: str) -> Server:
        """A base backup of the primary as it is now (`pg_basebackup -X stream`, with the WAL it needs), under
        `root/name`: started, it is the database restored from that backup (a primary of its own, archiving
        nothing)."""
        restored = Server(self.root / name, free_port())
        _run(_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
             "-D", str(restored.pgdata), "-X", "stream", "-c", "fast")
        with (restored.pgdata / "postgresql.conf").open("a") as conf:
            conf.write("\n# restored from a base backup\narchive_mode = off\n")
        return restored

    def promote(self) -> None:
        """The replica becomes a primary on a new timeline (a failover)."""
        _run(_bin("pg_ctl"), "-D", str(self.replica.pgdata), "-w", "-t", "120", "promote")
        self.promoted = True

    def stop(self) -> None:
        for server in (self.replica, self.primary):
            try:
                server.stop()
            except RuntimeError:
                server.kill()

    def destroy(self) -> None:
        """Stop both servers (by pid) and remove the directory."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down", "catch-up", "pause", "resume"])
    parser.add_argument("root", type=Path, help="a directory of the pair's own")
    args = parser.parse_args()
    root: Path = args.root.resolve()
    if args.action == "up":
        pair = ReplicaPair.create(root)
        print(f"LETHE_DATABASE_URL={pair.primary.url}")
        print(f"LETHE_DATABASE_REPLICA_URLS={pair.replica.url}")
        return
    pair = ReplicaPair.load(root)
    if args.action == "down":
        pair.destroy()
    elif args.action == "catch-up":
        pair.wait_caught_up()
    elif args.action == "pause":
        pair.pause_replay()
    else:
        pair.resume_replay()
    sys.exit(0)


if __name__ == "__main__":
    main()
