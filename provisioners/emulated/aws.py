"""An emulated EC2 that really boots: moto's server as the API, namespace VMs as the instances.

The real boto3 client (provisioners/aws/) talks to moto's server over the job's simulated
internet (netns.py): the server listens on a VM of its own, ``aws-api``, at a TEST-NET address,
so only the job's namespaces reach it. A booter thread watches moto's EC2 state; every instance
that moto starts becomes a namespace VM that runs the instance's decoded user-data, as cloud-init
does, with an IMDSv2 metadata service of its own (imds.py). The two ends stay in step:

- an instance terminated through the API loses its VM (every process in it at once);
- a VM that shuts itself down (the bootstrap's failure path, the watcher's dead-man switch)
  leaves its instance terminated, reason ``Client.InstanceInitiatedShutdown``;
- ``interrupt`` is a spot reclaim: the VM's metadata shows ``spot/instance-action`` at once,
  and at the deadline the VM vanishes and the instance is terminated with reason
  ``Server.SpotInstanceTermination``, as EC2 does.

Needs root (namespaces) and moto's server (``pip install 'moto[server]'``).
"""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from provisioners.emulated.imds import InstanceMetadata, MetadataService
from provisioners.local import netns

log = logging.getLogger(__name__)

API_VM = "aws-api"
API_PORT = 5000
LOOK_S = 0.25  # how often the booter looks at moto's instances
ACCOUNT_ID = "123456789012"  # moto's default account


@dataclass
class _Booted:
    vm: netns.Vm
    metadata: MetadataService
    process: subprocess.Popen | None
    reclaim_at_s: float | None = None


class EmulatedAws:
    def __init__(
        self,
        *,
        internet: netns.Internet,
        folder: Path,
        regions: tuple[str, ...] = ("us-east-1",),
        vm_env: dict[str, str] | None = None,
        spot_usd_per_hour: Mapping[tuple[str, str], float] | None = None,
        refusals: Mapping[str, str] | None = None,
    ) -> None:
        """``internet``: the job's simulated internet (made); ``folder``: where each VM's
        user-data and console log go; ``regions``: where instances boot; ``vm_env``: the
        environment a VM's boot starts with; ``spot_usd_per_hour``: the spot price the API
        reports per (region, instance type) (moto's own is $0.00001 for everything; a type
        missing here keeps it); ``refusals``: RunInstances in a zone or region named here fails
        with that EC2 error code (``InsufficientInstanceCapacity``: no capacity there;
        ``MaxSpotInstanceCountExceeded``, ``VcpuLimitExceeded``: the account's quota)."""
        self.internet, self.folder, self.regions = internet, Path(folder), tuple(regions)
        self.prices = dict(spot_usd_per_hour or {})
        self.refusals = dict(refusals or {})
        self.vm_env = vm_env or {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        self._server = None
        self._unpatch = None
        self._booted: dict[str, _Booted] = {}
        self._done: set[str] = set()  # instances whose VM came and went
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.endpoint_url = ""

    def start(self) -> str:
        """Start the API and the booter; the endpoint URL for boto3."""
        from moto.moto_server.threaded_moto_server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per API call
        self._unpatch = _patch_api(self.prices, self.refusals)
        api = self.internet.add_vm(API_VM)
        self._server = ThreadedMotoServer(ip_address=api.public_ip, port=API_PORT, verbose=False)
        netns.in_namespace(api.netns, self._server.start)  # its socket in the api VM
        self.endpoint_url = f"http://{api.public_ip}:{API_PORT}"
        self._thread = threading.Thread(target=self._boot_loop, name="aws-booter", daemon=True)
        self._thread.start()
        return self.endpoint_url

    def _instances(self) -> list:
        from moto.ec2.models import ec2_backends

        return [
            i
            for region in self.regions
            for r in ec2_backends[ACCOUNT_ID][region].all_reservations()
            for i in r.instances
        ]

    def _boot_loop(self) -> None:
        while not self._stop.wait(LOOK_S):
            try:
                self._look()
            except (OSError, netns.NetnsError) as error:  # one bad look: log it, look again
                log.warning("emulated aws: %s", error)

    def _look(self) -> None:
        alive = set(netns.namespaces())
        now_s = time.time()
        with self._lock:
            for instance in self._instances():
                booted = self._booted.get(instance.id)
                state = instance.state
                if booted is None and state in ("pending", "running"):
                    if instance.id not in self._done:
                        self._boot(instance)
                elif booted is not None and state not in ("pending", "running"):
                    self._remove(instance.id)  # terminated through the API
                elif booted is not None and booted.vm.netns not in alive:
                    self._remove(instance.id)  # it shut itself down
                    self._end(
                        instance,
                        "Client.InstanceInitiatedShutdown",
                        "Client.InstanceInitiatedShutdown: Instance initiated shutdown",
                    )
                elif booted is not None and booted.reclaim_at_s and now_s >= booted.reclaim_at_s:
                    self._remove(instance.id)
                    self._end(
                        instance,
                        "Server.SpotInstanceTermination",
                        "Server.SpotInstanceTermination: Spot instance termination",
                    )

    def _boot(self, instance) -> None:
        vm = self.internet.add_vm(instance.id)
        folder = self.folder / instance.id
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        metadata = MetadataService(
            vm,
            InstanceMetadata(
                instance_id=instance.id,
                launch_index=int(getattr(instance, "ami_launch_index", 0)),
                zone=instance.placement.zone or "",
            ),
        )
        script = _user_data(instance)
        process = None
        if script is not None:
            path = folder / "user-data"
            path.write_bytes(script)
            path.chmod(0o700)
            process = self.internet.popen(
                vm, ["bash", str(path)], log_file=folder / "console.log", env=self.vm_env
            )
        self._booted[instance.id] = _Booted(vm, metadata, process)
        log.info("emulated aws: %s booted as %s", instance.id, vm.netns)

    def _remove(self, instance_id: str) -> None:
        booted = self._booted.pop(instance_id)
        self._done.add(instance_id)
        booted.metadata.close()
        self.internet.kill_vm(booted.vm.name)

    @staticmethod
    def _end(instance, code: str, message: str) -> None:
        from moto.ec2.models.instances import StateReason

        instance.terminate()
        instance.state_reason = StateReason(message, code)

    def interrupt(self, instance_id: str, *, notice_s: float) -> None:
        """Reclaim a spot instance: the notice on its metadata now, the end in ``notice_s``."""
        with self._lock:
            booted = self._booted[instance_id]
            booted.reclaim_at_s = time.time() + notice_s
            booted.metadata.metadata.notice_at_s = booted.reclaim_at_s

    def interrupt_zone(self, zone: str, *, notice_s: float) -> list[str]:
        """Reclaim every running instance in ``zone`` (a zone's spot capacity taken back)."""
        with self._lock:
            taken = [
                i.id for i in self._instances() if i.id in self._booted and i.placement.zone == zone
            ]
        for instance_id in taken:
            self.interrupt(instance_id, notice_s=notice_s)
        return taken

    def lose(self, instance_id: str) -> None:
        """The instance's host fails: its VM vanishes now, with no notice."""
        with self._lock:
            self._booted[instance_id].reclaim_at_s = time.time()

    def vm_of(self, instance_id: str) -> netns.Vm | None:
        booted = self._booted.get(instance_id)
        return None if booted is None else booted.vm

    def console(self, instance_id: str) -> str:
        """What the instance printed (EC2's get-console-output)."""
        try:
            return (self.folder / instance_id / "console.log").read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        """Stop booting, remove every VM, stop the API."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            for instance_id in list(self._booted):
                self._remove(instance_id)
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._unpatch is not None:
            self._unpatch()
            self._unpatch = None
        self.internet.kill_vm(API_VM)


def _user_data(instance) -> bytes | None:
    """The instance's user-data as cloud-init reads it (moto keeps what the API got: base64)."""
    data = instance.user_data
    if isinstance(data, list):
        data = data[0] if data else None
    if not data:
        return None
    text = data.as_bytes() if hasattr(data, "as_bytes") else data  # moto's Base64EncodedString
    return base64.b64decode(text)


REFUSALS = {
    "InsufficientInstanceCapacity": "We currently do not have sufficient {type} capacity in the "
    "Availability Zone you requested ({zone}). Our system will be working on provisioning "
    "additional capacity.",
    "MaxSpotInstanceCountExceeded": "Max spot instance count exceeded",
    "VcpuLimitExceeded": "You have requested more vCPU capacity than your current vCPU limit of 0 "
    "allows for the instance bucket that the specified instance type belongs to.",
}


def _patch_api(prices: Mapping[tuple[str, str], float], refusals: Mapping[str, str]):
    """Have moto's DescribeSpotPriceHistory report ``prices`` (per region and instance type)
    and its RunInstances fail where ``refusals`` say, while the emulator runs, in this process
    (moto's server runs here); returns the undo."""
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.responses.instances import InstanceResponse
    from moto.ec2.responses.spot_instances import SpotInstances

    original = SpotInstances.describe_spot_price_history
    original_run = InstanceResponse.run_instances

    def run(response):
        zone = response._get_param("Placement.AvailabilityZone") or ""
        code = refusals.get(zone) or refusals.get(response.region)
        if code:
            kind = response._get_param("InstanceType")
            # an EC2 error class: moto serializes an error by the service of its class's module
            raise EC2ClientError(code, REFUSALS.get(code, code).format(type=kind, zone=zone))
        return original_run(response)

    def describe(response):
        result = original(response)
        region = response.region
        for entry in result.result["SpotPriceHistory"]:  # moto's ActionResult
            price = prices.get((region, entry["InstanceType"]))
            if price is not None:
                entry["SpotPrice"] = f"{price:.6f}"
        return result

    SpotInstances.describe_spot_price_history = describe
    InstanceResponse.run_instances = run

    def undo() -> None:
        SpotInstances.describe_spot_price_history = original
        InstanceResponse.run_instances = original_run

    return undo
