"""A standing emulated cloud: one provider's emulation as a process of its own, outliving jobs.

``python -m orchestrator emulate up aws`` (or ``submit --emulate``, when none stands) starts
``python -m orchestrator.driver.standing serve aws`` detached from the terminal. It holds what a
cloud holds for its users: a simulated internet (provisioners/local/netns.py), the provider's API
on it (moto's server, the Compute Engine fake, the ARM fake: provisioners/emulated/) and every
instance that API starts, booted as a namespace VM from its boot script. It serves every region of
the provider the catalog lists, at the catalog's published prices, until ``emulate down``.

What a user's machine needs to reach it, as a cloud's credentials and endpoint, is registered in
``<home>/emulated/<provider>/cloud.json`` (owner-only): the API's endpoint and bearer token, the
account, the namespace the API listens in (a laptop outside the simulated internet enters it to
call the API: ``status --all``, ``down``) and the control socket. The control socket (owner-only,
root's) carries what is not an API call of the provider: the cloud's own decisions (a spot reclaim
with notice, a host failure: ``--preempt-at``, ``--lose-at``) and what befalls a job's controller
instance (hosts.py launches it through the provider's API, as on the real cloud):
``shutdown_controller`` is its VM's orderly shutdown (SIGTERM, then off after a grace period),
``kill_controller`` its loss (off at once).

A daemon that dies however it dies leaves nothing: a reaper (provisioners/local/reaper.py) sweeps
the namespaces of its internet when its process is gone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.errors import UserError

PROVIDERS = ("aws", "gcp", "azure")
READY_S = 120.0  # moto's server, the fakes and the internet start in seconds
CALL_S = 60.0


@dataclass(frozen=True, kw_only=True)
class Registration:
    """How to reach a standing emulated cloud (owner-only: it holds the API's token)."""

    provider: str
    endpoint: str
    token: str | None
    account: str | None
    regions: tuple[str, ...]
    api_netns: str  # the namespace the API listens in
    internet: str  # the simulated internet's name (its namespaces' prefix)
    socket: str  # the control socket
    pid: int
    folder: str


def emulation_home(provider: str) -> Path:
    from orchestrator.driver.job import jobs_home

    return jobs_home().parent / "emulated" / provider


def find(provider: str) -> Registration | None:
    """The standing emulated cloud of ``provider``, or None when none answers."""
    path = emulation_home(provider) / "cloud.json"
    try:
        record = json.loads(path.read_text())
        registration = Registration(**{**record, "regions": tuple(record["regions"])})
    except (OSError, ValueError, TypeError, KeyError):
        return None
    try:
        call(registration, "ping", timeout_s=5.0)
    except (OSError, ValueError):
        return None  # its daemon died: a stale record
    return registration


def call(registration: Registration, op: str, *, timeout_s: float = CALL_S, **args) -> dict:
    """One request on the cloud's control socket; OSError when it does not answer, ValueError
    when it refuses."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(registration.socket)
        sock.sendall((json.dumps({"op": op, **args}) + "\n").encode())
        reply = sock.makefile("rb").readline()
    if not reply:
        raise OSError(f"emulated {registration.provider}: no answer to {op}")
    out = json.loads(reply)
    if "error" in out:
        raise ValueError(f"emulated {registration.provider}: {op}: {out['error']}")
    return out


def ensure(
    provider: str, *, refusals: tuple[tuple[str, str], ...] = ()
) -> tuple[Registration, bool]:
    """The standing cloud of ``provider``, started when none stands; whether it was started."""
    found = find(provider)
    if found is not None:
        return found, False
    return start(provider, refusals=refusals), True


def start(provider: str, *, refusals: tuple[tuple[str, str], ...] = ()) -> Registration:
    """Start the daemon, detached from this terminal; its registration once it serves."""
    import select

    folder = emulation_home(provider)
    elsewhere = _standing_elsewhere(provider)
    if elsewhere:
        # its simulated internet has one set of names per machine: a second would sweep it
        raise UserError(
            f"an emulated {provider} cloud of another home already runs on this machine "
            f"({len(elsewhere)} of its namespaces are in use, e.g. {elsewhere[0]})",
            file=str(folder.parent),
            fix="use that home (GEO_ORCHESTRATOR_HOME), or take its cloud down there with "
            f"`python -m orchestrator emulate down {provider}`",
        )
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    argv = [sys.executable, "-m", "orchestrator.driver.standing", "serve", provider]
    for place, kind in refusals:
        argv += ["--refuse", f"{place}={kind}"]
    with open(folder / "daemon.log", "ab") as log:
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C and a closed terminal do not reach it
            env={**os.environ, "PYTHONPATH": _package_root()},
        )
    ready, _, _ = select.select([process.stdout], [], [], READY_S)
    line = process.stdout.readline() if ready else b""
    process.stdout.close()
    if not line:
        process.kill()
        raise UserError(
            f"the emulated {provider} cloud did not start in {READY_S:g} s",
            file=str(folder / "daemon.log"),
            fix="read its log; the emulation needs root, iproute2, nftables, wireguard-go and "
            "moto's server (pip install 'moto[server]')",
        )
    registration = find(provider)
    assert registration is not None, "the daemon said it serves"
    return registration


def _standing_elsewhere(provider: str) -> list[str]:
    """The namespaces of ``provider``'s emulated internet that processes still use: another
    home's standing cloud (a crashed one's empty namespaces are swept when the next one starts)."""
    from provisioners.local import netns, reaper

    mine = netns.prefix(f"emulated-{provider}")
    return [n for n in netns.namespaces() if n.startswith(mine) and reaper.namespace_pids(n)]


def stop(provider: str, *, timeout_s: float = 60.0) -> bool:
    """Take the standing cloud down (every VM with it); False when none stood."""
    registration = find(provider)
    if registration is None:
        return False
    call(registration, "down")
    _wait_gone(registration.pid, timeout_s)
    return True


def _wait_gone(pid: int, timeout_s: float) -> None:
    """Until process ``pid`` (not our child) has exited: a pidfd turns readable when it does."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        select.select([fd], [], [], timeout_s)
    finally:
        os.close(fd)


def _package_root() -> str:
    from provisioners.local.vms import package_root

    return str(package_root())


# -- the daemon ------------------------------------------------------------------------------------


class _ControlHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        daemon: _Daemon = self.server.daemon
        for line in self.rfile:
            try:
                reply = daemon.answer(json.loads(line))
            except (ValueError, KeyError, TypeError, OSError) as error:
                reply = {"error": str(error)}
            self.wfile.write((json.dumps(reply) + "\n").encode())


class _ControlServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


class _Daemon:
    def __init__(self, emulator, done: threading.Event) -> None:
        self.emulator, self.done = emulator, done

    def _controller_instances(self, job: str) -> list[str]:
        """The job's controller launched as an instance of the cloud (hosts.py CloudHost)."""
        return self.emulator.tagged({"geo-job": job, "geo-role": "controller"})

    def answer(self, request: dict) -> dict:
        op = request["op"]
        if op == "ping":
            return {}
        if op == "interrupt":
            self.emulator.interrupt(request["instance"], notice_s=float(request["notice_s"]))
            return {}
        if op == "lose":
            self.emulator.lose(request["instance"])
            return {}
        if op == "interrupt_zone":
            zone, notice_s = request["zone"], float(request["notice_s"])
            return {"instances": self.emulator.interrupt_zone(zone, notice_s=notice_s)}
        if op == "shutdown_controller":
            for instance in self._controller_instances(request["job"]):
                self.emulator.shutdown(instance, grace_s=float(request["grace_s"]))
            return {"state": "off"}
        if op == "kill_controller":
            for instance in self._controller_instances(request["job"]):
                self.emulator.lose(instance)
            return {"state": "off"}
        if op == "down":
            self.done.set()
            return {}
        raise ValueError(f"unknown op {op!r}")


def serve(provider: str, refusals: dict[str, str]) -> int:
    """The daemon: make the cloud, register it, serve until ``down`` or SIGTERM, remove it all."""
    from orchestrator.driver.cloud import emulator_for
    from provisioners.local import netns, reaper

    folder = emulation_home(provider)
    internet = netns.Internet(f"emulated-{provider}")
    runtime = Path(tempfile.mkdtemp(prefix=f"geo-emu-{provider}-"))  # short: the socket's path
    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: done.set())
    keeper = reaper.Reaper.start(
        f"emulated-{provider}-{os.getpid()}",
        netns_prefix=netns.prefix(internet.job),
        remove_dir=str(runtime),
    )
    emulator, server = None, None
    try:
        internet.create()
        regions = tuple(emulator_regions(provider))
        emulator = emulator_for(
            provider,
            internet=internet,
            folder=folder / "instances",
            refusals=refusals,
            regions=regions,
        )
        endpoint = emulator.start()
        server = _ControlServer(str(runtime / "control.sock"), _ControlHandler)
        server.daemon = _Daemon(emulator, done)
        threading.Thread(target=server.serve_forever, name="control", daemon=True).start()
        _register(
            folder,
            Registration(
                provider=provider,
                endpoint=endpoint,
                token=getattr(emulator, "token", None),
                account=getattr(emulator, "project", None)
                or getattr(emulator, "subscription_id", None),
                regions=regions,
                api_netns=internet.vms[emulator.api_vm].netns,
                internet=internet.job,
                socket=str(runtime / "control.sock"),
                pid=os.getpid(),
                folder=str(folder),
            ),
        )
        print("serving", flush=True)  # the starter's ready line
        print(f"emulated {provider} serves at {endpoint}", file=sys.stderr, flush=True)
        done.wait()
    finally:
        (folder / "cloud.json").unlink(missing_ok=True)
        # the disks of its controller VMs (hosts.py CloudHost: a folder each), gone with them
        shutil.rmtree(folder / "controllers", ignore_errors=True)
        if server is not None:
            server.shutdown()
        if emulator is not None:
            emulator.close()
        internet.close()
        if keeper is not None:
            keeper.release()
        shutil.rmtree(runtime, ignore_errors=True)
    return 0


def emulator_regions(provider: str) -> list[str]:
    """Every region of ``provider`` the catalog lists: the standing cloud serves them all."""
    from orchestrator.catalog import default_catalog

    offers = default_catalog().offers.offers
    return sorted({o.location.region for o in offers if o.location.cloud == provider})


def _register(folder: Path, registration: Registration) -> None:
    path = folder / "cloud.json"
    descriptor = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(asdict(registration), handle)
    os.replace(path.with_suffix(".tmp"), path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.driver.standing")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("provider", choices=PROVIDERS)
    parser.add_argument("--refuse", action="append", default=[], metavar="PLACE=KIND")
    args = parser.parse_args(argv)
    refusals = dict(item.split("=", 1) for item in args.refuse)
    return serve(args.provider, refusals)


if __name__ == "__main__":
    sys.exit(main())
