"""An emulated Compute Engine that really boots: the in-memory Compute API (gcp_api.py) on a VM of
the job's simulated internet, namespace VMs as the instances.

The real google-cloud-compute client of the GCP adapter calls the API at ``http://<gcp-api VM>``
with a bearer token made per emulation; every instance it inserts boots (booter.py) as a
namespace VM that runs its ``startup-script`` metadata item, as GCE's guest agent does, with a GCE
metadata server inside the VM (``Metadata-Flavor: Google``; ``instance/preempted``). The two stay
in step: a deleted instance loses its VM; a VM that powers itself off leaves its instance
TERMINATED, as GCE keeps a stopped VM; ``interrupt(name, notice_s)`` is a spot preemption
(``preempted`` reads TRUE at once, then at the deadline the VM goes, the instance is deleted and
a ``compute.instances.preempted`` zone operation is recorded, as GCE does for a spot VM whose
termination action is DELETE); ``lose`` takes it with no notice.

Needs root (namespaces).
"""

from __future__ import annotations

import secrets
from pathlib import Path

from provisioners.emulated.booter import EmulatedCloud, Seen
from provisioners.emulated.gcp_api import PROJECT, ZONES, FakeGcp
from provisioners.emulated.imds import GceMetadata, MetadataService
from provisioners.local import netns

API_VM = "gcp-api"
API_PORT = 80


class EmulatedGcp(EmulatedCloud):
    name = "gcp"
    api_vm = API_VM  # the VM its API listens on

    def __init__(
        self,
        *,
        internet: netns.Internet,
        folder: Path,
        vm_env: dict[str, str] | None = None,
        refusals: dict[str, str] | None = None,
    ) -> None:
        """``refusals``: zone or region -> ``capacity`` (inserts there end
        ZONE_RESOURCE_POOL_EXHAUSTED) or ``quota`` (a 403 quotaExceeded)."""
        super().__init__(internet=internet, folder=folder, vm_env=vm_env)
        self.token = "ya29.emulated-" + secrets.token_urlsafe(24)  # the API's bearer token
        self.project = PROJECT
        refusals = {  # a region's refusal holds in each of its zones
            zone: kind
            for where, kind in (refusals or {}).items()
            for zone in ZONES
            if zone == where or zone.rsplit("-", 1)[0] == where
        }
        self.api = FakeGcp(
            token=self.token,
            capacity={z: 0 for z, kind in refusals.items() if kind == "capacity"},
            quota_zones={z for z, kind in refusals.items() if kind == "quota"},
        )
        self.endpoint_url = ""

    def start(self) -> str:
        """Start the API and the booter; the endpoint for ``client_options``."""
        api = self.internet.add_vm(API_VM)
        self.api.start(
            host=api.public_ip,
            port=API_PORT,
            listen=lambda make: netns.in_namespace(api.netns, make),
        )
        self.endpoint_url = self.api.url
        self.booter.start()
        return self.endpoint_url

    def _seen(self) -> list[Seen]:
        seen = []
        for zone, instance in self.api.snapshot():
            script = next(
                (
                    item.get("value", "")
                    for item in instance.get("metadata", {}).get("items", [])
                    if item.get("key") == "startup-script"
                ),
                None,
            )
            seen.append(
                Seen(
                    instance_id=instance["name"],
                    zone=zone,
                    running=instance["status"] != "TERMINATED",
                    script=None if script is None else script.encode(),
                    ingress=self.api.ingress(instance),
                )
            )
        return seen

    def _metadata(self, vm: netns.Vm, seen: Seen) -> MetadataService:
        accounts = next(
            (i.get("serviceAccounts", []) for _, i in self.api.snapshot() if i["name"] == seen.instance_id),
            [],
        )  # fmt: skip
        email = accounts[0]["email"] if accounts else None
        if email == "default":  # GCE's word for the project's compute default account
            email = f"123456789012-compute@{PROJECT}.iam.gserviceaccount.com"
        return MetadataService(
            vm,
            GceMetadata(
                instance_id=seen.instance_id,
                name=seen.instance_id,
                zone=seen.zone,
                project_id=PROJECT,
                external_ip=vm.public_ip,
                service_account=email,
                token=self.token if email else None,
            ),
        )

    def tagged(self, tags: dict[str, str]) -> list[str]:
        """Instances with a VM whose labels include ``tags`` (GCP keeps them lowercased)."""
        want = {k: v.lower() for k, v in tags.items()}
        return [
            i["name"]
            for _, i in self.api.snapshot()
            if self.vm_of(i["name"]) is not None and want.items() <= i.get("labels", {}).items()
        ]

    def _ended(self, name: str, why: str) -> None:
        if why == "shutdown":
            self.api.stopped(name)
        elif why == "reclaimed":
            self.api.preempt(name)
        else:
            self.api.vanish(name)

    def close(self) -> None:
        """Stop booting, remove every VM, stop the API."""
        self.booter.close()
        self.api.stop()
        self.internet.kill_vm(API_VM)
