"""An emulated EC2 that really boots: moto's server as the API, namespace VMs as the instances.

The real boto3 client (provisioners/aws/) talks to moto's server over the job's simulated
internet (netns.py): the server listens on a VM of its own, ``aws-api``, at a TEST-NET address,
so only the job's namespaces reach it. A booter thread watches moto's EC2 state; every instance
that moto starts becomes a namespace VM that runs the instance's decoded user-data, as cloud-init
does, with an IMDSv2 metadata service of its own (imds.py). The two ends stay in step:

- an instance terminated through the API loses its VM (every process in it at once);
- a VM that shuts itself down (the bootstrap's failure path, the watcher's dead-man switch)
  leaves its instance terminated, reason ``Client.InstanceInitiatedShutdown``;
- an instance's security groups stand in front of its VM as nftables rules, kept in step with the
  API (a rule authorized or revoked changes them): what EC2 does not admit does not arrive;
- ``interrupt`` is a spot reclaim: the VM's metadata shows ``spot/instance-action`` at once,
  and at the deadline the VM vanishes and the instance is terminated with reason
  ``Server.SpotInstanceTermination``, as EC2 does.

Needs root (namespaces) and moto's server (``pip install 'moto[server]'``).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping
from pathlib import Path

from provisioners.emulated.booter import EmulatedCloud, Seen
from provisioners.emulated.imds import InstanceMetadata, MetadataService
from provisioners.local import netns

log = logging.getLogger(__name__)

API_VM = "aws-api"
API_PORT = 5000
ACCOUNT_ID = "123456789012"  # moto's default account


class EmulatedAws(EmulatedCloud):
    name = "aws"
    api_vm = API_VM  # the VM its API listens on

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
        super().__init__(internet=internet, folder=folder, vm_env=vm_env)
        self.regions = tuple(regions)
        self.prices = dict(spot_usd_per_hour or {})
        self.refusals = dict(refusals or {})
        self._server = None
        self._unpatch = None
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
        self.booter.start()
        return self.endpoint_url

    def _instances(self) -> dict[str, object]:
        from moto.ec2.models import ec2_backends

        return {
            i.id: i
            for region in self.regions
            for r in ec2_backends[ACCOUNT_ID][region].all_reservations()
            for i in r.instances
        }

    def _seen(self) -> list[Seen]:
        instances = self._instances()
        return [
            Seen(
                instance_id=i.id,
                zone=i.placement.zone or "",
                running=i.state in ("pending", "running"),
                script=_user_data(i),
                launch_index=int(getattr(i, "ami_launch_index", 0)),
                ingress=self._ingress(i, instances),
            )
            for i in instances.values()
        ]

    def _ingress(self, instance, instances: dict) -> tuple[tuple[str, int, int, str], ...]:
        """What the instance's security groups admit, as EC2 applies them: a rule's CIDR, or
        the addresses of the instances in the group it names (a group's default rule admits its
        own members only)."""
        rules = set()
        for group in instance.security_groups:
            for rule in group.ingress_rules:
                first = rule.from_port if rule.from_port is not None else 0
                last = rule.to_port if rule.to_port is not None else 65535
                sources = [rule.ip_range["CidrIp"]] if rule.ip_range.get("CidrIp") else []
                member_of = rule.source_group.get("GroupId")
                if member_of:
                    sources += [
                        f"{vm.public_ip}/32"
                        for other in instances.values()
                        if any(g.id == member_of for g in other.security_groups)
                        and (vm := self.vm_of(other.id)) is not None
                    ]
                rules.update((rule.ip_protocol or "-1", first, last, s) for s in sources)
        return tuple(sorted(rules))

    def _metadata(self, vm: netns.Vm, seen: Seen) -> MetadataService:
        return MetadataService(
            vm,
            InstanceMetadata(
                instance_id=seen.instance_id,
                launch_index=seen.launch_index,
                zone=seen.zone,
                role=self._role_of(seen.instance_id),
            ),
        )

    def tagged(self, tags: dict[str, str]) -> list[str]:
        return [
            i.id
            for i in self._instances().values()
            if self.vm_of(i.id) is not None
            and tags.items() <= {t["key"]: t["value"] for t in i.get_tags()}.items()
        ]

    def _role_of(self, instance_id: str) -> str | None:
        """The role of the instance profile the instance was launched with (moto checked that
        the profile exists), or None."""
        instance = self._instances().get(instance_id)
        profile = getattr(instance, "iam_instance_profile", None) or {}
        name = profile.get("Name") or str(profile.get("Arn", "")).rsplit("/", 1)[-1]
        if not name:
            return None
        from moto.iam.exceptions import NotFoundException
        from moto.iam.models import iam_backends

        try:
            found = iam_backends[ACCOUNT_ID]["aws"].get_instance_profile(name)
        except NotFoundException:  # deleted since the launch
            return None
        return found.roles[0].name if found.roles else None

    def _ended(self, instance_id: str, why: str) -> None:
        """The instance's VM is gone: EC2 terminates it with the reason it gives."""
        from moto.ec2.models.instances import StateReason

        code = ENDINGS[why]
        instance = self._instances()[instance_id]
        instance.terminate()
        instance.state_reason = StateReason(f"{code}: {code.split('.')[1]}", code)

    def close(self) -> None:
        """Stop booting, remove every VM, stop the API."""
        self.booter.close()
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._unpatch is not None:
            self._unpatch()
            self._unpatch = None
        self.internet.kill_vm(API_VM)


# how EC2 says an instance whose VM went ended (its state reason)
ENDINGS = {
    "shutdown": "Client.InstanceInitiatedShutdown",
    "reclaimed": "Server.SpotInstanceTermination",
    "lost": "Server.InternalError",
}


def _user_data(instance) -> bytes | None:
    """The instance's user-data as cloud-init reads it (moto keeps what the API got: base64)."""
    data = instance.user_data
    if isinstance(data, list):
        data = data[0] if data else None
    if not data:
        return None
    text = data.as_bytes() if hasattr(data, "as_bytes") else data  # moto's Base64EncodedString
    return base64.b64decode(text)


REFUSAL_KINDS = {  # the emulators' common words for a refusal
    "capacity": "InsufficientInstanceCapacity",
    "quota": "MaxSpotInstanceCountExceeded",
}
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
        code = REFUSAL_KINDS.get(code, code)
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
