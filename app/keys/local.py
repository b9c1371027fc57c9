"""The `local` provider: covers as files under `$LETHE_DATA_DIR/keys`, shared by the processes of one machine.

`keys/<tenant>/<shard>.cover` (mode 0600, directories 0700) holds a magic, the version and the cover with a digest,
so a torn or zeroed file reads as `Tampered`, never as another cover. A write, under an exclusive `fcntl` lock on
`keys/<tenant>/.lock`: checks the version, writes a temp file and fsyncs it, hard-links the current file as `.old`,
renames the temp file over the current one and fsyncs the directory (the switch), then overwrites the `.old` inode
with zeros, fsyncs, unlinks it and fsyncs the directory (the destruction). A process killed at any point leaves the
old or the new cover in place; a `.old` or temp file it left is destroyed by the next write or `sweep`. Readers take
no lock: a rename is atomic, and a reader that meets a file being zeroed reads again.

What the filesystem or an SSD keeps of overwritten blocks is outside this guarantee (docs/erasure-at-rest.md says how
an operator closes it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import struct
from collections.abc import Iterator
from pathlib import Path

from app.keys import tree
from app.keys.errors import Tampered, Unavailable
from app.keys.provider import Cover, Step, no_step

_TENANT = re.compile(r"[A-Za-z0-9_-]{1,64}")
_READS = 3  # a reader racing a switch meets a zeroed file at most once per write; a few reads settle it


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _destroy(path: Path) -> None:
    """Zeros the file's blocks (best effort) and unlinks it; the caller fsyncs the directory."""
    with contextlib.suppress(FileNotFoundError), open(path, "r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(0)
        handle.write(b"\0" * size)
        handle.flush()
        os.fsync(handle.fileno())
    path.unlink(missing_ok=True)


class LocalProvider:
    name = "local"

    def __init__(self, directory: Path, *, on_step: Step = no_step) -> None:
        self.directory = directory
        self._on_step = on_step

    def identity(self) -> str:
        path = self.directory / ".identity"  # a tenant id never starts with a dot
        with contextlib.suppress(FileNotFoundError):
            return path.read_text().strip()
        with self._locked(None):
            with contextlib.suppress(FileNotFoundError):
                return path.read_text().strip()
            temp = self.directory / ".identity.tmp"
            temp.write_text(secrets.token_hex(16) + "\n")
            os.chmod(temp, 0o600)
            with open(temp, "rb") as handle:
                os.fsync(handle.fileno())
            os.rename(temp, path)
            _fsync_dir(self.directory)
            return path.read_text().strip()

    def _tenant_dir(self, tenant: str) -> Path:
        if _TENANT.fullmatch(tenant) is None:
            raise ValueError(f"tenant id {tenant!r} cannot name a key directory")
        return self.directory / tenant

    def _path(self, tenant: str, shard: int) -> Path:
        return self._tenant_dir(tenant) / f"{shard:010d}.cover"

    def read(self, tenant: str, shard: int) -> Cover | None:
        path = self._path(tenant, shard)
        for _ in range(_READS):
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise Unavailable(f"key store {self.directory} unreadable: {exc.strerror}") from exc
            with contextlib.suppress(Tampered):  # read while a switch zeroed the old inode: read again
                return Cover(struct.unpack(">Q", raw[:8])[0], tree.decode(raw[8:]))
        raise Tampered(f"the cover file {path} is not a cover")

    @contextlib.contextmanager
    def _locked(self, tenant: str | None) -> Iterator[Path]:
        """The tenant's lock (the store's own with None), its directory made first."""
        directory = self.directory if tenant is None else self._tenant_dir(tenant)
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            directory.mkdir(mode=0o700, exist_ok=True)
            fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise Unavailable(f"key store {self.directory} not writable: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield directory
        finally:
            os.close(fd)  # closing releases the flock

    def _leftovers(self, directory: Path, shard: int) -> list[Path]:
        return [directory / f".{shard:010d}.old", directory / f".{shard:010d}.tmp"]

    def sweep(self, tenant: str, shard: int) -> None:
        with self._locked(tenant) as directory:
            self._sweep(directory, shard)

    def _sweep(self, directory: Path, shard: int) -> None:
        leftovers = [path for path in self._leftovers(directory, shard) if path.exists()]
        for path in leftovers:
            _destroy(path)
        if leftovers:
            _fsync_dir(directory)

    def write(self, tenant: str, shard: int, nodes: tree.Nodes, expected: int) -> Cover | None:
        with self._locked(tenant) as directory:
            current = self.read(tenant, shard)
            if (current.version if current else 0) != expected:
                return None
            self._sweep(directory, shard)
            path = self._path(tenant, shard)
            old, temp = self._leftovers(directory, shard)
            with os.fdopen(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as handle:
                handle.write(struct.pack(">Q", expected + 1) + tree.encode(nodes))
                handle.flush()
                os.fsync(handle.fileno())
            self._on_step("cover-written")
            if current is not None:
                os.link(path, old)  # keeps the old inode reachable until it is zeroed
            os.rename(temp, path)
            _fsync_dir(directory)
            self._on_step("cover-switched")
            if current is not None:
                _destroy(old)
                _fsync_dir(directory)
                self._on_step("cover-destroyed")
            return Cover(expected + 1, nodes)
