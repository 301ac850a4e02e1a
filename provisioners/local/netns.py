"""Simulated VMs as Linux network namespaces, wired to a simulated internet.

Each job gets an "internet": a namespace ``geo+<job>+inet`` holding a bridge; each VM is a
namespace ``geo+<job>+<vm>`` whose ``eth0`` (one end of a veth pair, the other end on the bridge)
has a "public" address from TEST-NET-2 (198.51.100.0/24, documentation space, routed nowhere).
Every interface is made inside the job's namespaces: nothing is added to the machine's own
namespace, and no route or NAT leads from these namespaces to the machine's real interfaces.

A VM's processes run under ``ip netns exec`` (its own network, the machine's files). Killing a VM
kills every process in its namespace at once, then removes the namespace (its veth pair goes with
it): a spot VM that vanishes. ``sweep(job)`` removes whatever a job left, also after a crash; names
start with the job's slug, so one job's sweep never touches another's. Needs root (CAP_NET_ADMIN
and CAP_SYS_ADMIN); ``unsupported_reason()`` says why not where it cannot run.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from provisioners.commands import CommandError, run_command
from provisioners.local import reaper

log = logging.getLogger(__name__)

PUBLIC_NETWORK = ipaddress.ip_network("198.51.100.0/24")  # TEST-NET-2
BRIDGE = "inet0"
PREFIX = "geo+"  # then the job, "+", the VM: "+" is not in a job slug, so no job prefixes another
T = TypeVar("T")


class NetnsError(CommandError):
    """A namespace command failed; the message names it."""


@dataclass(frozen=True)
class Vm:
    name: str
    netns: str
    public_ip: str


def unsupported_reason() -> str | None:
    """None where namespace VMs can run here; else why not (shown to the user)."""
    if os.geteuid() != 0:
        return "not running as root (network namespaces need CAP_NET_ADMIN)"
    tools = ("ip", "wg", "wireguard-go", "nft")
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        return (
            f"{', '.join(missing)} not installed "
            "(apt install iproute2 wireguard-tools wireguard-go nftables)"
        )
    return None


def _ip(*args: str) -> str:
    return run_command(["ip", *args], error=NetnsError, install_hint="install iproute2")


def namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


class Internet:
    """A job's simulated internet and its VMs."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.netns = f"{PREFIX}{job}+inet"
        self._hosts = PUBLIC_NETWORK.hosts()
        self._ports = 0
        self.vms: dict[str, Vm] = {}

    def create(self) -> None:
        sweep(self.job)  # what a crashed run of this job left
        _ip("netns", "add", self.netns)
        _ip("-n", self.netns, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", self.netns, "link", "set", BRIDGE, "up")

    def add_vm(self, name: str) -> Vm:
        """A new VM namespace with its public address on the bridge, loopback up."""
        vm = Vm(name=name, netns=f"{PREFIX}{self.job}+{name}", public_ip=str(next(self._hosts)))
        self._ports += 1
        port = f"p{self._ports}"  # the bridge's side, a name inside the internet namespace only
        _ip("netns", "add", vm.netns)
        try:
            _ip(
                "-n",
                vm.netns,
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                self.netns,
            )
            _ip("-n", self.netns, "link", "set", port, "master", BRIDGE, "up")
            _ip(
                "-n",
                vm.netns,
                "address",
                "add",
                f"{vm.public_ip}/{PUBLIC_NETWORK.prefixlen}",
                "dev",
                "eth0",
            )
            _ip("-n", vm.netns, "link", "set", "eth0", "up")
            _ip("-n", vm.netns, "link", "set", "lo", "up")
        except NetnsError:
            remove_namespace(vm.netns)
            raise
        self.vms[name] = vm
        return vm

    def popen(
        self,
        vm: Vm,
        argv: list[str],
        *,
        log_file: Path,
        env: dict | None = None,
        stdout_pipe: bool = False,
    ):
        """Start ``argv`` inside ``vm`` (a session of its own), output appended to ``log_file``
        (stdout to a pipe instead with ``stdout_pipe``)."""
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "ab") as out:
            return subprocess.Popen(
                ["ip", "netns", "exec", vm.netns, *argv],
                stdout=subprocess.PIPE if stdout_pipe else out,
                stderr=out if stdout_pipe else subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )

    def kill_vm(self, name: str) -> None:
        vm = self.vms.pop(name, None)
        if vm is not None:
            remove_namespace(vm.netns)

    def close(self) -> None:
        sweep(self.job)
        self.vms.clear()


def run_in(vm: Vm, argv: list[str], *, input_text: str | None = None) -> str:
    """Run ``argv`` inside ``vm`` to its end; its stdout."""
    return run_command(
        ["ip", "netns", "exec", vm.netns, *argv], error=NetnsError, input_text=input_text
    )


def remove_namespace(netns: str) -> None:
    """Kill every process in ``netns``, wait for them, delete the namespace (idempotent)."""
    reaper.remove_namespace(netns)


def sweep(job: str) -> list[str]:
    """Remove every namespace of ``job`` (VMs first, its internet last); the names removed."""
    return reaper.sweep_namespaces(prefix(job))


def prefix(job: str) -> str:
    """What every namespace of ``job`` is named with first."""
    return f"{PREFIX}{job}+"


CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise NetnsError(f"setns failed: {os.strerror(ctypes.get_errno())}")


class Entered:
    """This thread (the main one: threads and processes it starts later follow it) inside a VM's
    network, until ``leave``: how the local cloud's controller VM runs the Ray head and the
    cloud's API in the submitting process."""

    def __init__(self, netns: str) -> None:
        import threading

        assert threading.current_thread() is threading.main_thread(), "enter from the main thread"
        self._home = os.open("/proc/self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)

    def at_home(self, make: Callable[[], T]) -> T:
        """``make()`` run on a thread of its own in the network this thread left (this
        machine's): a socket it makes listens there."""
        assert self._home >= 0, "left already"
        return _in_network(self._home, make)

    def leave(self) -> None:
        if self._home >= 0:
            try:
                _setns(self._home)
            finally:
                os.close(self._home)
                self._home = -1


def in_namespace(netns: str, make: Callable[[], T]) -> T:
    """``make()`` run on a thread of its own inside ``netns``: the sockets it binds, and the
    threads it starts, live in that VM's network, while this thread stays where it is (how an
    emulated cloud serves its API and each VM's metadata service from this process)."""
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)  # gone: the caller hears it
    try:
        return _in_network(target, make, name=f"in-{netns}")
    finally:
        os.close(target)


def _in_network(fd: int, make: Callable[[], T], *, name: str = "in-network") -> T:
    """``make()`` on a thread of its own in the network namespace ``fd`` names."""
    import threading

    outcome: list = []

    def enter_and_make() -> None:
        try:
            _setns(fd)  # this thread only: it ends right after
            outcome.append(("ok", make()))
        except BaseException as error:  # handed to the caller, which re-raises it
            outcome.append(("error", error))

    thread = threading.Thread(target=enter_and_make, name=name, daemon=True)
    thread.start()
    thread.join()
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


def main(argv: list[str] | None = None) -> int:
    """``python -m provisioners.local.netns halt NETNS`` (or ``halt-self``, inside the VM): a
    namespace VM shuts itself down (its watcher's dead-man switch runs this inside it)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("command", choices=["halt", "halt-self"])
    parser.add_argument("netns", nargs="?", help="halt: the VM's namespace")
    args = parser.parse_args(argv)
    if args.command == "halt-self":  # the VM this process runs in, whatever its name
        args.netns = _ip("netns", "identify", str(os.getpid())).strip()
    if not (args.netns or "").startswith(PREFIX):
        print(f"not a simulated VM: {args.netns}", file=sys.stderr)
        return 2
    remove_namespace(args.netns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
