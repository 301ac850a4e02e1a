"""Where a command's CPU time goes, by kind of process: every process on this machine is read
from /proc while the command runs, and the CPU each one used meanwhile is summed by what it is
(a Ray actor by its class, Ray's own daemons by name, the rest by its program).

Usage: python bench/cpu_by_process.py [--top N] COMMAND [ARGS...]
e.g.   python bench/cpu_by_process.py python -m pytest -q -n 2 tests/integration

``--top N`` also lists the N command lines (cut to 150 characters) that used the most CPU in all,
their processes summed: which of "the command's own python processes" cost what.

Linux only. A process that starts and ends between two reads (every 0.2 s) is missed; the
project's are all longer. Other users' processes count too: run it with nothing else running.
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import threading
import time

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
READ_EVERY_S = 0.2

# (what the command line contains, the kind it is counted as), first match wins
KINDS = [
    ("gcs_server", "ray: gcs"),
    ("/raylet", "ray: raylet"),
    ("runtime_env/agent", "ray: runtime-env agent"),
    ("dashboard/agent", "ray: dashboard agent"),
    ("dashboard/dashboard", "ray: dashboard"),
    ("log_monitor", "ray: log monitor"),
    ("monitor.py", "ray: monitor"),
    ("wireguard-go", "wireguard-go"),
]


def kind_of(command: str) -> str:
    if command.startswith("ray::"):  # a Ray worker names itself after its actor or task
        return "ray::" + command.split()[0][5:].split(".")[0]
    for needle, kind in KINDS:
        if needle in command:
            return kind
    if "pytest" in command or "orchestrator" in command:
        return "the command's own python processes"
    return os.path.basename(command.split()[0]) if command else "?"


def read_all(seen: dict) -> None:
    """Each live process's CPU seconds so far, keyed by (pid, start time): pids are reused."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline") as f:
                command = f.read().replace("\0", " ").strip()
        except OSError:  # gone meanwhile
            continue
        key = (pid, fields[19])
        cpu_s = (int(fields[11]) + int(fields[12])) / TICKS_PER_S
        seen[key] = (cpu_s, command or seen.get(key, (0.0, ""))[1])


def main(argv: list[str]) -> int:
    top = 0
    if argv[:1] == ["--top"] and len(argv) > 2 and argv[1].isdigit():
        top, argv = int(argv[1]), argv[2:]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 0 if argv else 2
    if shutil.which(argv[0]) is None:
        print(
            f"{argv[0]}: no such command; give the command to measure, e.g. bash -c '...'",
            file=sys.stderr,
        )
        return 2
    before: dict = {}
    read_all(before)
    seen = dict(before)
    started = time.monotonic()
    process = subprocess.Popen(argv)
    done = threading.Event()
    threading.Thread(target=lambda: (process.wait(), done.set()), daemon=True).start()
    while not done.wait(READ_EVERY_S):
        read_all(seen)
    read_all(seen)
    wall_s = time.monotonic() - started
    cpu, count, lines = collections.Counter(), collections.Counter(), collections.Counter()
    for key, (cpu_s, command) in seen.items():
        used = cpu_s - before.get(key, (0.0, ""))[0]
        if used > 0:
            kind = kind_of(command)
            cpu[kind] += used
            count[kind] += 1
            lines[command[:150]] += used
    print(f"wall {wall_s:.1f} s, CPU {sum(cpu.values()):.1f} s; by kind (CPU s, processes):")
    for kind, seconds in cpu.most_common(25):
        print(f"{seconds:8.1f} {count[kind]:5d}  {kind}")
    if top:
        print(f"the {top} costliest command lines (CPU s):")
        for command, seconds in lines.most_common(top):
            print(f"{seconds:8.1f}  {command}")
    return process.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
