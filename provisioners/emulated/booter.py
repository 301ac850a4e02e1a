"""Boot what an emulated cloud API says is running as namespace VMs, and keep the two in step.

Each emulated cloud (aws.py, gcp.py) keeps its API's state (moto's EC2 backend, the Compute
Engine fake) and lists it here as ``Seen`` instances; a ``Booter`` thread looks every ``LOOK_S``:

- an instance the API shows as pending or running with no VM yet becomes a VM (provisioners/local/
  netns.py) that runs the instance's boot script (decoded user-data, a startup-script) as
  cloud-init or the guest agent does, with the cloud's metadata service inside it;
- an instance the API no longer shows running (terminated, deleted) loses its VM;
- a VM that powered itself off (``netns halt-self``) is reported to the cloud as ``shutdown``;
- ``interrupt`` is a reclaim with notice: the metadata shows it now, and at the deadline the VM
  goes and the cloud is told ``reclaimed``; ``lose`` the same with no notice (``lost``).

Nothing waits by sleeping: the loop waits on its stop event with the look period.
"""

from __future__ import annotations

import abc
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provisioners.local import netns

log = logging.getLogger(__name__)

LOOK_S = 0.25  # how often the booter looks at the API's instances


@dataclass(frozen=True)
class Seen:
    """One instance as the API's state shows it."""

    instance_id: str
    zone: str
    running: bool  # pending or running: it should have a VM
    script: bytes | None  # its boot script, decoded
    launch_index: int = 0
    # what the cloud's firewall admits to it: (protocol, first port, last port, source CIDR)
    # rules; None where the emulation has no cloud firewall in front of its VMs
    ingress: tuple[tuple[str, int, int, str], ...] | None = None


@dataclass
class _Booted:
    vm: netns.Vm
    metadata: object  # the cloud's metadata service in the VM: .notice(at_s), .close()
    process: subprocess.Popen | None
    zone: str
    ends_at_s: float | None = None  # a reclaim's (or loss's) deadline
    why: str = "reclaimed"
    ingress: tuple | None = None  # the firewall rules applied to its public interface


class Booter:
    def __init__(
        self,
        *,
        internet: netns.Internet,
        folder: Path,
        vm_env: dict[str, str],
        seen: Callable[[], list[Seen]],
        metadata: Callable[[netns.Vm, Seen], object],
        ended: Callable[[str, str], None],
        name: str,
    ) -> None:
        """``seen``: the API's instances now; ``metadata``: the metadata service for a new VM;
        ``ended(instance_id, why)``: tell the API an instance's VM is gone (``shutdown``,
        ``reclaimed``, ``lost``); ``name``: the cloud, for logs and the thread."""
        self.internet, self.folder, self.vm_env = internet, Path(folder), vm_env
        self._seen, self._metadata, self._ended, self.name = seen, metadata, ended, name
        self._booted: dict[str, _Booted] = {}
        self._done: set[str] = set()  # instances whose VM came and went
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"{self.name}-booter", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(LOOK_S):
            try:
                self._look()
            except (OSError, netns.NetnsError) as error:  # one bad look: log it, look again
                log.warning("emulated %s: %s", self.name, error)

    def _look(self) -> None:
        alive = set(netns.namespaces())
        now_s = time.time()
        with self._lock:
            seen = self._seen()
            for gone in set(self._booted) - {i.instance_id for i in seen}:
                self._remove(gone)  # deleted through the API
            for instance in seen:
                booted = self._booted.get(instance.instance_id)
                if booted is None:
                    if instance.running and instance.instance_id not in self._done:
                        self._boot(instance)
                elif not instance.running:
                    self._remove(instance.instance_id)  # ended through the API
                elif booted.vm.netns not in alive:
                    self._remove(instance.instance_id)  # it powered itself off
                    self._ended(instance.instance_id, "shutdown")
                elif booted.ends_at_s is not None and now_s >= booted.ends_at_s:
                    self._remove(instance.instance_id)
                    self._ended(instance.instance_id, booted.why)
                elif instance.ingress != booted.ingress:  # its firewall's rules changed
                    apply_firewall(booted.vm, instance.ingress)
                    booted.ingress = instance.ingress

    def _boot(self, instance: Seen) -> None:
        vm = self.internet.add_vm(instance.instance_id)
        folder = self.folder / instance.instance_id
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if instance.ingress is not None:  # in front of it before anything in it runs
            apply_firewall(vm, instance.ingress)
        metadata = self._metadata(vm, instance)
        process = None
        if instance.script is not None:
            path = folder / "boot-script"
            path.write_bytes(instance.script)
            path.chmod(0o700)
            process = self.internet.popen(
                vm, ["bash", str(path)], log_file=folder / "console.log", env=self.vm_env
            )
        self._booted[instance.instance_id] = _Booted(
            vm, metadata, process, instance.zone, ingress=instance.ingress
        )
        log.info("emulated %s: %s booted as %s", self.name, instance.instance_id, vm.netns)

    def _remove(self, instance_id: str) -> None:
        booted = self._booted.pop(instance_id)
        self._done.add(instance_id)
        booted.metadata.close()
        self.internet.kill_vm(booted.vm.name)

    # -- the cloud's own decisions ----------------------------------------------------------------

    def interrupt(self, instance_id: str, *, notice_s: float) -> None:
        """Reclaim an instance: its metadata shows the notice now, the VM goes in ``notice_s``."""
        with self._lock:
            booted = self._booted[instance_id]
            booted.ends_at_s, booted.why = time.time() + notice_s, "reclaimed"
            booted.metadata.notice(booted.ends_at_s)

    def interrupt_zone(self, zone: str, *, notice_s: float) -> list[str]:
        """Reclaim every instance with a VM in ``zone``."""
        with self._lock:
            taken = [i for i, b in self._booted.items() if b.zone == zone]
        for instance_id in taken:
            self.interrupt(instance_id, notice_s=notice_s)
        return taken

    def shutdown(self, instance_id: str, *, grace_s: float) -> None:
        """The VM's orderly shutdown, as an ACPI power button or ``shutdown`` starts it: its boot
        script gets SIGTERM (to hand on to what it runs), and the VM goes once the script has
        ended or after ``grace_s``; its instance ends ``shutdown``."""
        import signal

        with self._lock:
            booted = self._booted[instance_id]
        if booted.process is not None and booted.process.poll() is None:
            booted.process.send_signal(signal.SIGTERM)
            try:
                booted.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass  # powered off regardless
        with self._lock:
            if instance_id in self._booted:
                booted.ends_at_s, booted.why = time.time(), "shutdown"

    def lose(self, instance_id: str) -> None:
        """The instance's host fails: its VM goes now, with no notice."""
        with self._lock:
            booted = self._booted[instance_id]
            booted.ends_at_s, booted.why = time.time(), "lost"

    def vm_of(self, instance_id: str) -> netns.Vm | None:
        booted = self._booted.get(instance_id)
        return None if booted is None else booted.vm

    def console(self, instance_id: str) -> str:
        """What the instance printed (its serial console)."""
        try:
            return (self.folder / instance_id / "console.log").read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        """Stop booting and remove every VM."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            for instance_id in list(self._booted):
                self._remove(instance_id)


FIREWALL_TABLE = "emulated_cloud_firewall"


def apply_firewall(vm: netns.Vm, ingress: tuple | None) -> None:
    """The cloud's firewall in front of ``vm``'s public interface, as nftables rules in a table
    of their own (the VM's own rules, its bootstrap's, stay beside them and both must admit a
    packet): replies to what the VM opened, the ``ingress`` rules, nothing else. None: none."""
    lines = [f"table inet {FIREWALL_TABLE}", f"delete table inet {FIREWALL_TABLE}"]
    if ingress is None:
        netns.run_in(vm, ["nft", "-f", "-"], input_text="\n".join(lines) + "\n")
        return
    rules = ['    iifname "eth0" ct state established,related accept']
    for protocol, first, last, source in ingress:
        ports = "" if protocol == "-1" else f"{protocol} dport {first}-{last} "
        rules.append(f'    iifname "eth0" ip saddr {source} {ports}accept')
    rules.append('    iifname "eth0" drop')
    table = (
        f"table inet {FIREWALL_TABLE} {{\n  chain input {{\n"
        "    type filter hook input priority -10; policy accept;\n"
        + "\n".join(rules)
        + "\n  }\n}\n"
    )
    netns.run_in(vm, ["nft", "-f", "-"], input_text="\n".join(lines) + "\n" + table)


class EmulatedCloud(abc.ABC):
    """What every emulated cloud shares: its booter, and the cloud's own decisions and views
    delegated to it. A subclass lists its API's instances (``_seen``), makes a VM's metadata
    service (``_metadata``) and tells its API when a VM went (``_ended``)."""

    name = ""

    def __init__(self, *, internet: netns.Internet, folder: Path, vm_env: dict[str, str] | None):
        self.internet = internet
        self.booter = Booter(
            internet=internet,
            folder=folder,
            vm_env=vm_env or {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            seen=self._seen,
            metadata=self._metadata,
            ended=self._ended,
            name=self.name,
        )

    @abc.abstractmethod
    def _seen(self) -> list[Seen]:
        """The API's instances now."""

    @abc.abstractmethod
    def _metadata(self, vm: netns.Vm, seen: Seen) -> object:
        """The metadata service of a VM just booted (``.notice(at_s)``, ``.close()``)."""

    @abc.abstractmethod
    def _ended(self, instance_id: str, why: str) -> None:
        """Tell the API an instance's VM went (``shutdown``, ``reclaimed``, ``lost``)."""

    def interrupt(self, instance_id: str, *, notice_s: float) -> None:
        self.booter.interrupt(instance_id, notice_s=notice_s)

    def interrupt_zone(self, zone: str, *, notice_s: float) -> list[str]:
        return self.booter.interrupt_zone(zone, notice_s=notice_s)

    def lose(self, instance_id: str) -> None:
        self.booter.lose(instance_id)

    def shutdown(self, instance_id: str, *, grace_s: float) -> None:
        self.booter.shutdown(instance_id, grace_s=grace_s)

    def tagged(self, tags: dict[str, str]) -> list[str]:
        """The instances with a VM whose tags (labels) include ``tags``: what the cloud's own
        console finds by tag. An emulation that cannot tell answers none."""
        return []

    def vm_of(self, instance_id: str) -> netns.Vm | None:
        return self.booter.vm_of(instance_id)

    def console(self, instance_id: str) -> str:
        return self.booter.console(instance_id)
