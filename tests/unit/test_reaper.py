"""The local cloud's reaper alone (provisioners/local/reaper.py), on plain processes: which command
lines name a Ray session, and a fake cluster (a process naming its session, a child, a grandchild)
that dies with its owner on SIGKILL, or is swept when the owner releases it, while the owner's other
child and the processes of another session or of a user live on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioners.local import reaper
from provisioners.local.reaper import Proc, names_session, with_descendants

REPO = Path(__file__).resolve().parents[2]
SESSION = "session_2026-11-22_12-00-00_123456_4242"
GONE_WITHIN_S = 5.0

pytestmark = [
    pytest.mark.skipif(not reaper.supported(), reason="the reaper needs Linux pidfds"),
    pytest.mark.timeout(60),  # a scene that went wrong may leave a read of its pipe blocked
]

# ``chain.py ROLE DEPTH [ARG]``: prints "ROLE PID", starts ``chain.py ROLE DEPTH-1`` (without ARG)
# while DEPTH > 0, then waits for a signal
CHAIN = """\
import os, signal, subprocess, sys
role, depth = sys.argv[1], int(sys.argv[2])
os.write(1, f"{role} {os.getpid()}\\n".encode())  # one write: lines from many processes
if depth:
    subprocess.Popen([sys.executable, __file__, role, str(depth - 1)])
signal.pause()
"""
# ``owner.py SESSION CHAIN``: starts a reaper, a fake cluster and a child of its own, then waits
# for "release" on stdin
OWNER = """\
import os, subprocess, sys
from provisioners.local.reaper import Reaper
session, chain = sys.argv[1], sys.argv[2]
keeper = Reaper.start(session)
os.write(1, f"reaper {keeper.process.pid}\\n".encode())
subprocess.Popen([sys.executable, chain, "cluster", "2", f"--session_dir=/tmp/fake/{session}"])
subprocess.Popen([sys.executable, chain, "user", "0"])
if sys.stdin.readline().strip() == "release":
    keeper.release()
    print("released", flush=True)
    sys.stdin.readline()
"""


def test_only_flags_that_name_the_session_or_a_path_in_it_count():
    assert names_session(["raylet", f"--session_dir=/tmp/ray/{SESSION}"], SESSION)
    assert names_session(["gcs_server", f"--log_dir=/tmp/ray/{SESSION}/logs"], SESSION)
    assert not names_session(["tail", "-f", f"/tmp/ray/{SESSION}/logs/raylet.out"], SESSION)
    assert not names_session([f"--session_dir=/tmp/ray/{SESSION}7"], SESSION)  # another pid
    assert not names_session([f"--session_dir=/tmp/ray/x{SESSION}"], SESSION)
    assert not names_session(["--session_dir", f"/tmp/ray/{SESSION}"], SESSION)


def test_descendants_follow_parent_links_from_the_seeds_only():
    table = {
        pid: Proc(ppid=ppid, start_ticks=1, state="S", argv=())
        for pid, ppid in {10: 1, 11: 10, 12: 11, 13: 1, 14: 13}.items()
    }
    assert with_descendants(table, [10, 99]) == {10, 11, 12}
    assert with_descendants(table, [14]) == {14}


def test_a_killed_owner_takes_its_cluster_and_the_reaper_but_nothing_else(tmp_path):
    with _Scene(tmp_path) as scene:
        scene.owner.send_signal(signal.SIGKILL)
        scene.owner.wait(timeout=10)
        started = time.monotonic()
        left = scene.wait_gone([*scene.pids["cluster"], *scene.pids["reaper"]])
        assert not left, f"still running {time.monotonic() - started:.1f} s after: {left}"
        assert scene.running(scene.pids["user"] + scene.bystanders)


def test_a_release_sweeps_what_is_left_and_the_reaper_exits(tmp_path):
    with _Scene(tmp_path) as scene:
        scene.owner.stdin.write("release\n")
        scene.owner.stdin.flush()
        assert scene.owner.stdout.readline().strip() == "released"  # after the reaper's exit
        assert not scene.running(scene.pids["cluster"] + scene.pids["reaper"])
        assert scene.running(scene.pids["user"] + scene.bystanders + [scene.owner.pid])


class _Scene:
    """An owner with its reaper, fake cluster and own child; another session's process and a
    reader of the session's logs beside them. Everything is killed on exit, whatever happened."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: list[subprocess.Popen] = []
        self.pids: dict[str, list[int]] = {"reaper": [], "cluster": [], "user": []}
        self.starts: dict[int, int] = {}

    def _set_up(self) -> None:
        chain, owner = self.folder / "chain.py", self.folder / "owner.py"
        chain.write_text(CHAIN)
        owner.write_text(OWNER)
        self.owner = self._start([owner, SESSION, chain], stdin=subprocess.PIPE)
        others = [f"--session_dir=/tmp/fake/{SESSION}0", f"/tmp/fake/{SESSION}/logs/raylet.out"]
        self.bystanders = [self._start([chain, "other", "0", arg]).pid for arg in others]
        for _ in range(5):  # the reaper, the cluster's three, the owner's own child
            role, pid = self.owner.stdout.readline().split()
            self.pids[role].append(int(pid))
        self.starts = {p: t.start_ticks for p, t in reaper.process_table().items()}

    def _start(self, args: list, **kwargs) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, *map(str, args)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            **kwargs,
        )
        self.started.append(process)
        return process

    def running(self, pids: list[int]) -> list[int]:
        """Those of ``pids`` still running (the same processes: start times match)."""
        table = reaper.process_table()
        return [
            p
            for p in pids
            if p in table and table[p].start_ticks == self.starts.get(p) and table[p].state != "Z"
        ]

    def wait_gone(self, pids: list[int]) -> list[int]:
        """Poll until none of ``pids`` runs (or ``GONE_WITHIN_S``); those still running."""
        deadline = time.monotonic() + GONE_WITHIN_S
        while (left := self.running(pids)) and time.monotonic() < deadline:
            time.sleep(0.02)  # polling with a deadline: these processes are not ours to wait on
        return left

    def __enter__(self) -> _Scene:
        try:
            self._set_up()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for pid in self.running([p for group in self.pids.values() for p in group]):
            os.kill(pid, signal.SIGKILL)
        for process in self.started:
            process.kill()
            process.wait(timeout=10)
            process.stdout.close()
            if process.stdin is not None:
                process.stdin.close()
