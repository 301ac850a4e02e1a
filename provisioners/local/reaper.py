"""A local cloud's Ray processes die with the process that owns them, even by ``kill -9``.

Why they outlived it: Ray ties a node's processes to their starter with ``PR_SET_PDEATHSIG`` only
for nodes started with exit hooks, which Python allows on the main thread alone, so nodes added
from another thread (the gateway serving a driver actor) had none; and the signal reaches only
the starter's children: a raylet's agents and workers are its grandchildren. A raylet that loses
its GCS retries for 60 s, an agent whose raylet died tries to flush its logs to the dead GCS for
longer still: a tester counted 12 processes alive for minutes.

The mechanism: a small watchdog, this file run as a script, started by the owner before the
cluster's first process. It holds the read end of a pipe whose write end only the owner holds
(close-on-exec, so Ray's processes do not inherit it) and a pidfd of its owner; it blocks on both.
When the owner goes, even by SIGKILL, the kernel closes the pipe and marks the pidfd: the reaper
wakes and kills the cluster. The pidfd covers a forked child that kept a copy of the write end; a
normal shutdown writes one byte, then the reaper sweeps what is left and exits, and the owner waits
for it (no reaper is left behind). It runs in a session of its own, so a Ctrl-C or a hang-up meant
for the owner's terminal does not take it first.

What it kills, and only that: the processes of the owner's uid that name this cluster's Ray session
in a command-line flag (``--session_dir=/tmp/ray/<session>``, ``--log_dir=.../<session>/logs``:
the GCS, raylets, monitor, dashboard and log monitor), and everything below them (agents, workers,
detached actors, their children). The session name carries the head's start time to the
microsecond and the owner's pid, so another cluster on this machine, or a user's
``tail -f /tmp/ray/<session>/logs/raylet.out`` (no flag), never matches. The owner chooses the
name before the head starts, so the reaper knows it from the first process on. Ray's own
fate-sharing is turned off (cluster.py): were the kernel to kill a raylet first, its children would
be re-parented to init and out of reach. Killing freezes the tree first (SIGSTOP, again until no
new child appears: a stopped process cannot fork), then SIGKILLs it all at once; every signal
goes through a pidfd checked against the process's start time, so a reused pid is never hit;
waiting blocks on those pidfds, with a timeout. Linux >= 5.3 (pidfds); elsewhere the owner runs
without a reaper and says so. It writes no files.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

KILL_WAIT_S = 5.0  # how long a sweep waits for the processes it killed to be gone
RELEASE_WAIT_S = 10.0  # how long a normal shutdown waits for the reaper's last sweep
MAX_FREEZE_ROUNDS = 50  # a tree that keeps growing for this many rounds is killed as found


@dataclass(frozen=True)
class Proc:
    """One process as /proc shows it."""

    ppid: int
    start_ticks: int  # since boot: with the pid, names the process even after pid reuse
    state: str  # R, S, D, T (stopped), Z (zombie: it runs nothing, its parent has not reaped it)
    argv: tuple[str, ...]


def process_table(uid: int | None = None) -> dict[int, Proc]:
    """Every process of ``uid`` (default: ours), by pid."""
    uid = os.getuid() if uid is None else uid
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            ppid, start, state = _stat(pid)
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = tuple(a.decode(errors="replace") for a in handle.read().split(b"\0") if a)
        except (FileNotFoundError, ProcessLookupError):
            continue  # it ended while we looked
        except PermissionError:
            continue  # it changed owner meanwhile: not ours to read, not ours to kill
        table[pid] = Proc(ppid=ppid, start_ticks=start, state=state, argv=argv)
    return table


def _stat(pid: int) -> tuple[int, int, str]:
    """(parent pid, start time in ticks, state) from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        text = handle.read()
    # the command name (field 2) may hold spaces and parentheses: fields follow its last ")"
    fields = text[text.rindex(b")") + 2 :].split()
    return int(fields[1]), int(fields[19]), fields[0].decode()


def names_session(argv: Iterable[str], session: str) -> bool:
    """True when a ``--flag=value`` argument names the Ray session's folder or a path in it:
    the session is one of the value's path components (after a ``/``: Ray's paths are absolute)."""
    return any(
        arg.startswith("--") and session in arg.partition("=")[2].split(os.sep)[1:] for arg in argv
    )


def session_processes(table: dict[int, Proc], session: str) -> set[int]:
    """The processes Ray started for ``session`` with the session in their flags."""
    return {pid for pid, proc in table.items() if names_session(proc.argv, session)}


def with_descendants(table: dict[int, Proc], seeds: Iterable[int]) -> set[int]:
    """``seeds`` that are in ``table`` and every process below them."""
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.ppid, []).append(pid)
    found, todo = set(), [pid for pid in seeds if pid in table]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def kill_all(
    find: Callable[[dict[int, Proc]], set[int]],
    *,
    timeout_s: float = KILL_WAIT_S,
    exclude: Iterable[int] = (),
) -> int:
    """Freeze what ``find`` names and everything below it, SIGKILL it all, wait until it is gone
    (zombies count as gone: they run nothing); return how many processes were killed."""
    exclude = {os.getpid(), *exclude}
    frozen: dict[int, int] = {}  # pid -> pidfd
    try:
        for _ in range(MAX_FREEZE_ROUNDS):
            table = process_table()
            found = with_descendants(table, find(table) | set(frozen))
            new = {p for p in found - frozen.keys() - exclude if table[p].state != "Z"}
            if not new:
                break
            for pid in new:
                fd = _pidfd(pid, table[pid].start_ticks)
                if fd is not None:
                    frozen[pid] = fd
                    _signal(fd, signal.SIGSTOP)
        for fd in frozen.values():
            _signal(fd, signal.SIGKILL)
        _wait_exited(frozen.values(), timeout_s)
        return len(frozen)
    finally:
        for fd in frozen.values():
            os.close(fd)


def _pidfd(pid: int, start_ticks: int) -> int | None:
    """A pidfd for ``pid`` if it is still the process the table saw, else None."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    try:
        same = _stat(pid)[1] == start_ticks
    except (FileNotFoundError, ProcessLookupError):
        same = False
    if not same:  # the pid was reused between the table and the pidfd
        os.close(fd)
        return None
    return fd


def _signal(fd: int, signum: int) -> None:
    try:
        signal.pidfd_send_signal(fd, signum)
    except ProcessLookupError:
        pass  # already gone (and reaped): nothing to do


def _wait_exited(fds: Iterable[int], timeout_s: float) -> None:
    """Block until every pidfd says its process exited, or ``timeout_s``."""
    poller = select.poll()
    waiting = set(fds)
    for fd in waiting:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout_s
    while waiting:
        left_ms = (deadline - time.monotonic()) * 1000
        if left_ms <= 0:
            log.warning("%d killed processes still there after %.1f s", len(waiting), timeout_s)
            return
        for fd, _ in poller.poll(left_ms):
            poller.unregister(fd)
            waiting.discard(fd)


NETNS_DIR = Path("/run/netns")
WIREGUARD_SOCKETS = Path("/var/run/wireguard")


def namespace_pids(netns: str) -> set[int]:
    """The processes in network namespace ``netns`` (none when it is gone)."""
    done = subprocess.run(
        ["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=10, check=False
    )
    return {int(p) for p in done.stdout.split() if p.isdigit()}


def remove_namespace(netns: str) -> bool:
    """Kill every process in ``netns`` (as ``kill_all`` does: frozen first, then all at once),
    delete the namespace and the control sockets wireguard-go left; False if it was not there."""
    if not (NETNS_DIR / netns).exists():
        return False
    kill_all(lambda table: namespace_pids(netns) & table.keys())
    subprocess.run(["ip", "netns", "delete", netns], capture_output=True, timeout=10, check=False)
    _remove_stale_wireguard_sockets()
    return True


def sweep_namespaces(prefix: str) -> list[str]:
    """Remove every namespace whose name starts with ``prefix`` (its "+inet" last)."""
    names = sorted(
        (p.name for p in NETNS_DIR.glob("*") if p.name.startswith(prefix)),
        key=lambda name: (name.endswith("+inet"), name),
    )
    return [name for name in names if remove_namespace(name)]


def _remove_stale_wireguard_sockets() -> None:
    """wireguard-go's control sockets whose daemon is gone (they block a restart by that name)."""
    import socket

    for path in WIREGUARD_SOCKETS.glob("gw*.sock") if WIREGUARD_SOCKETS.exists() else ():
        with socket.socket(socket.AF_UNIX) as sock:
            try:
                sock.connect(str(path))
            except ConnectionRefusedError:
                path.unlink(missing_ok=True)
            except OSError:
                continue


def supported() -> bool:
    """Whether this system has what the reaper needs (/proc and pidfds)."""
    return sys.platform.startswith("linux") and hasattr(os, "pidfd_open")


class Reaper:
    """The owner's side: ``start`` before the cluster's first process, ``release`` after a
    normal shutdown. A dead owner needs no call: the kernel closes its end."""

    def __init__(self, process: subprocess.Popen, write_fd: int) -> None:
        self.process, self._write_fd = process, write_fd

    @classmethod
    def start(
        cls, session: str, *, netns_prefix: str | None = None, remove_dir: str | None = None
    ) -> Reaper | None:
        """A reaper for Ray session ``session`` (a name, ``session_<date>_<pid>``) and, with
        ``netns_prefix``, the network namespaces of the job's VMs (and ``remove_dir``, a folder
        of theirs outside the job's); None where this system has no pidfds (the cluster then
        dies with its owner only on a normal exit)."""
        if not supported():
            log.warning("local cloud: no reaper on %s: nodes may outlive a crash", sys.platform)
            return None
        read_fd, write_fd = os.pipe()  # both close-on-exec: only the reaper gets the read end
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", str(Path(__file__).resolve()), "--session", session]
                + ["--owner", str(os.getpid()), "--fd", str(read_fd)]
                + (["--netns-prefix", netns_prefix] if netns_prefix else [])
                + (["--remove-dir", remove_dir] if remove_dir else []),
                pass_fds=(read_fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # terminal signals for the owner do not reach it
            )
        except OSError:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        return cls(process, write_fd)

    def release(self, timeout_s: float = RELEASE_WAIT_S) -> None:
        """Ask for a last sweep (what a normal shutdown left) and wait for the reaper's exit."""
        if self._write_fd < 0:
            return
        try:
            os.write(self._write_fd, b"x")  # a byte, not only EOF: a forked child may hold a copy
        except BrokenPipeError:
            log.warning("local cloud: the reaper (pid %d) was already gone", self.process.pid)
        finally:
            os.close(self._write_fd)
            self._write_fd = -1
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("local cloud: the reaper (pid %d) still sweeps", self.process.pid)


def _wait_for_owner(read_fd: int, owner: int) -> str:
    """Block until the owner releases the cluster or dies; say which."""
    try:
        owner_fd = os.pidfd_open(owner)
    except ProcessLookupError:
        return "owner gone"
    try:
        # it died before the pidfd was open: the pidfd may name another process
        if os.getppid() != owner:
            return "owner gone"
        poller = select.poll()
        poller.register(read_fd, select.POLLIN)
        poller.register(owner_fd, select.POLLIN)
        ready = dict(poller.poll())
        if read_fd in ready and os.read(read_fd, 1):
            return "released"
        return "owner gone"
    finally:
        os.close(owner_fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--session", required=True, help="the Ray session's name")
    parser.add_argument("--owner", type=int, required=True, help="the owner's pid")
    parser.add_argument("--fd", type=int, required=True, help="the pipe's read end")
    parser.add_argument("--netns-prefix", help="also remove the namespaces named so")
    parser.add_argument("--remove-dir", help="and this folder (a dead owner's runtime files)")
    args = parser.parse_args(argv)
    why = _wait_for_owner(args.fd, args.owner)
    started = time.monotonic()
    killed = kill_all(lambda table: session_processes(table, args.session), exclude=(args.owner,))
    if killed:
        print(
            f"local cloud reaper ({why}): killed {killed} processes of Ray session "
            f"{args.session} in {time.monotonic() - started:.2f} s",
            file=sys.stderr,
        )
    if args.netns_prefix and why != "released":  # a normal shutdown removes its own
        removed = sweep_namespaces(args.netns_prefix)
        if removed:
            print(f"local cloud reaper ({why}): removed {len(removed)} namespaces", file=sys.stderr)
    if args.remove_dir and why != "released":
        import shutil

        shutil.rmtree(args.remove_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
