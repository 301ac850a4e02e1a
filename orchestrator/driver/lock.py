"""One running driver per job: an exclusive lock on ``<job folder>/driver.lock``.

``submit`` (and the notebook API) holds it while the job runs in its process. The lock is the
kernel's (``flock``), so it goes with its process however that process ends (exit, Ctrl-C,
``kill -9``, a crash): a crashed submit never leaves a stale lock, and no pid file has to be
trusted. The file's content says who holds it (pid, host, since when, the command), so a second
submit of a running job can name the holder; ``holder`` reads it for ``status`` and ``stop``.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import UserError

LOCK_FILE = "driver.lock"


class JobRunning(UserError):
    """Another process runs this job's driver."""


@dataclass
class JobLock:
    """Held until ``release`` (or the process ends)."""

    path: Path
    descriptor: int | None

    @classmethod
    def acquire(cls, folder: Path, *, job: str) -> JobLock:
        """Take the job's lock; JobRunning naming the holder when another process has it."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / LOCK_FILE
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            who = holder(folder)
            raise JobRunning(
                f"job {job} is already running: {describe(who)}",
                file=str(path),
                fix=f"follow it with `python -m orchestrator status {job}` or `logs {job}`, or "
                f"stop it with `python -m orchestrator stop {job}` before submitting again",
            ) from None
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since_s": time.time(),
            "command": " ".join(
                os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv)
            )[:300],
        }
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, json.dumps(record).encode(), 0)
        return cls(path, descriptor)

    def release(self) -> None:
        if self.descriptor is not None:
            os.close(self.descriptor)  # closing drops the flock
            self.descriptor = None

    def __enter__(self) -> JobLock:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


def holder(folder: Path) -> dict | None:
    """Who runs the job's driver now (pid, host, since_s, command), or None when nobody does."""
    path = folder / LOCK_FILE
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read(descriptor)
        return None  # we could take it: nobody holds it (closing below drops ours)
    finally:
        os.close(descriptor)


def describe(record: dict | None) -> str:
    if not record:
        return "another process holds its lock"
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record.get("since_s", 0)))
    return (
        f"pid {record.get('pid')} on {record.get('host')} since {since} "
        f"({record.get('command', '?')})"
    )


def _read(descriptor: int) -> dict | None:
    try:
        record = json.loads(os.pread(descriptor, 4096, 0).decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # being written this very moment, or garbled: the lock still counts
    return record if isinstance(record, dict) else None
