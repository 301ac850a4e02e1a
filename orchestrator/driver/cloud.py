"""A cloud provider as the job's world, here on an emulated cloud that really boots.

The driver actor runs on the controller (the VM that holds the overlay's join service and the Ray
head) and reaches the provider from there: it builds the provider's adapter itself
(``cloud_provisioner``), wrapped in ``JoinedProvisioner``, which mints a join token per node, hands
each node its bootstrap as its boot script (user-data on AWS), tags it with the job and a lease
expiry, waits until it has joined Ray over the overlay and turns its on-node watcher's drain into a
``PreemptionNotice``. Nothing of the cloud goes through the submitting process.

``run_on_emulated_cloud`` is ``submit --emulate``: this process makes the job's simulated
internet and controller VM (provisioners/local/vms.py) and an emulated provider on it (moto's
server for AWS, provisioners/emulated/aws.py; every instance it starts boots as a namespace VM
from its decoded user-data), reporting the catalog's published spot prices as its own. The
market's chaos (``--preempt-at``: a spot reclaim with notice, heard by the node's watcher from its
instance metadata) is the emulator's, so it is served to the driver through the gateway
(provisioners/local/gateway.py), as the local cloud's is.
"""

from __future__ import annotations

import dataclasses
import secrets
import shlex
import shutil
import sys
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import UserError

EMULATED = ("aws", "gcp", "azure")  # providers with an emulation that boots
# an Amazon Linux image moto knows (the default Deep Learning AMI parameter is not in moto's SSM)
EMULATED_AMI_PARAMETER = "/aws/service/ami-amazon-linux-latest/amzn2-ami-hvm-x86_64-gp2"
LEASE_S = 6 * 3600.0  # a VM's expiry tag: a job renews it (docs/provisioners.md, leaks)
NOTICE_S = 10.0  # the emulated reclaim's notice (EC2 gives 120 s; shorter keeps runs short)
MIGRATION_S = 13.0  # a move's pause until one is measured: as the local cloud's namespace VMs


@dataclass(frozen=True, kw_only=True)
class CloudSpec:
    """What the driver actor needs to reach the provider and boot nodes into the job's cluster."""

    provider: str
    regions: tuple[str, ...]
    endpoint_url: str | None  # the emulated API; None: the SDK's own
    ray_address: str  # the Ray head's, on the controller's overlay address
    admin_socket: str  # the overlay join service's, on the controller
    install: object  # provisioners.bootstrap.script.Install: how a node gets our code
    nodes_dir: str  # a node's bootstrap folder lives under it
    ray_env: tuple[tuple[str, str], ...]
    shutdown_command: str  # what a node runs to power itself off
    grace_s: float  # the watcher's drain time before the node goes
    node_label: str  # the Ray label a node carries its name in
    api_token: str | None = field(default=None, repr=False)  # an emulated API's bearer token
    # emulated VMs share this machine's /tmp: each node's Ray files go in a folder of its own here
    ray_temp_root: str | None = None
    account: str | None = None  # GCP's project, Azure's subscription
    public_ip: str | None = None  # the controller's: the job's firewall admits it
    node_identity: str | None = None  # what nodes act as (an instance profile): the bucket
    # Azure's controller VM: its managed identity (the SDK's chain cannot tell offline it has one)
    managed_identity: bool = False


def cloud_provisioner(cloud: CloudSpec, *, job: str):
    """The provider's adapter behind ``JoinedProvisioner``, made where it runs (the controller)."""
    from provisioners.bootstrap.joined import JoinedProvisioner

    if cloud.provider not in EMULATED:
        raise UserError(
            f"submit --emulate boots {', '.join(EMULATED)} in this version, not {cloud.provider}",
            field="provider",
            fix="write provider: aws, gcp or azure, or plan and simulate for this provider",
        )
    inner = adapter_for(cloud)
    return JoinedProvisioner(
        inner,
        job=job,
        link=controller_link(cloud),
        boot_for=node_boot(cloud, job),
        lease_s=LEASE_S,
        identity=cloud.node_identity,
    )


def adapter_for(cloud: CloudSpec):
    """The provider's adapter, at the emulated API when there is one."""
    return _adapter_at(
        cloud.provider,
        regions=cloud.regions,
        endpoint_url=cloud.endpoint_url,
        api_token=cloud.api_token,
        account=cloud.account,
        managed_identity=cloud.managed_identity,
    )


def azure_on_vm(subscription_id: str | None, resource_group: str | None = None, **options):
    """The Azure adapter as an Azure VM's managed identity (a job's controller)."""
    from provisioners.azure import AzureProvisioner
    from provisioners.azure.credentials import managed_identity_credential

    if resource_group:
        options["resource_group"] = resource_group
    return AzureProvisioner(
        subscription_id=subscription_id, credential=managed_identity_credential(), **options
    )


def _adapter_at(
    provider: str,
    *,
    regions: tuple[str, ...],
    endpoint_url: str | None,
    api_token: str | None,
    account: str | None,
    aws_session=None,
    managed_identity: bool = False,
):
    if provider == "gcp":
        from provisioners.gcp import GcpProvisioner

        if endpoint_url is None:
            return GcpProvisioner(project=account, regions=regions)
        assert api_token is not None and account is not None
        return GcpProvisioner.at_endpoint(
            endpoint_url, token=api_token, project=account, regions=regions
        )
    if provider == "azure":
        from provisioners.azure import AzureProvisioner

        if endpoint_url is None:
            if managed_identity:
                return azure_on_vm(account, locations=regions)
            return AzureProvisioner(subscription_id=account, locations=regions)
        from provisioners.emulated.azure import SUBNET
        from provisioners.emulated.azure_api import FakeCredential
        from provisioners.emulated.azure_wire import RelayTransport

        return AzureProvisioner(
            subscription_id=account,
            locations=regions,
            credential=FakeCredential(api_token),
            client_kwargs={"transport": RelayTransport(endpoint_url)},
            poll_interval_s=0.5,
            subnet_id=SUBNET,
        )
    from provisioners.aws import AwsProvisioner

    emulated = {}
    if endpoint_url is not None:
        # moto has neither the Pricing API nor placement scores: spot prices are the market
        emulated = {
            "endpoint_url": endpoint_url,
            "ami_ssm_parameter": EMULATED_AMI_PARAMETER,
            "placement_scores": False,
            "on_demand_prices": False,
            "poll_interval_s": 0.5,
            **({"session_factory": aws_session} if aws_session else {}),
        }
    return AwsProvisioner(regions=regions, **emulated)


class InNamespace:
    """An adapter whose every call runs inside a namespace (a standing emulated cloud's API
    listens on its simulated internet, which this machine's own network does not reach)."""

    def __init__(self, adapter, netns_name: str) -> None:
        self._adapter, self._netns = adapter, netns_name

    def __getattr__(self, name: str):
        from provisioners.local import netns

        attribute = getattr(self._adapter, name)
        if not callable(attribute):
            return attribute
        return lambda *args, **kwargs: netns.in_namespace(
            self._netns, lambda: attribute(*args, **kwargs)
        )


def standing_adapter(registration) -> InNamespace:
    """The provider's adapter at a standing emulated cloud's API (standing.py), with keys made
    for the call (the emulation checks none) where the SDK wants some."""

    def aws_session():
        from provisioners.aws.sdk import keyed_session

        return keyed_session(emulated_credentials())

    return InNamespace(emulated_adapter(registration, aws_session), registration.api_netns)


def emulated_adapter(registration, aws_session=None):
    """The provider's adapter at a standing emulated cloud's API, from inside its simulated
    internet (one of its VMs)."""
    return _adapter_at(
        registration.provider,
        regions=registration.regions,
        endpoint_url=registration.endpoint,
        api_token=registration.token,
        account=registration.account,
        aws_session=aws_session,
    )


def controller_link(cloud: CloudSpec):
    from provisioners.bootstrap.joined import ControllerLink
    from provisioners.local.cluster import alive_nodes, preempted_nodes
    from provisioners.overlay.service import WG_PORT, admin_call

    def mint(name: str, ttl_s: float) -> str:
        return admin_call(cloud.admin_socket, {"op": "mint", "node": name, "ttl_s": ttl_s})["token"]

    def endpoints() -> list[str]:
        members = admin_call(cloud.admin_socket, {"op": "nodes"})["nodes"]
        return [m["endpoint"].rsplit(":", 1)[0] for m in members if m.get("endpoint")]

    return ControllerLink(
        mint=mint,
        forget=lambda name: admin_call(cloud.admin_socket, {"op": "remove", "node": name}),
        joined=lambda: alive_nodes(cloud.ray_address, label=cloud.node_label),
        preempted=lambda: preempted_nodes(cloud.ray_address, label=cloud.node_label),
        endpoints=endpoints,
        public_ip=cloud.public_ip,
        overlay_port=WG_PORT,
    )


def node_boot(cloud: CloudSpec, job: str):
    from provisioners.bootstrap.script import NodeBoot
    from provisioners.local.cluster import OBJECT_STORE_BYTES, NodeSpec

    def boot_for(name: str, token: str, request) -> NodeBoot:
        install = cloud.install
        if install is not None and install.wheel.startswith("s3://"):
            # presigned now, for this node's boot: a URL signed with the controller's role keys
            # lives no longer than they do (hours), and a job replaces nodes for days
            from orchestrator.driver.hosts import wheel_url

            install = dataclasses.replace(
                install, wheel=wheel_url(adapter_for(cloud), install.wheel)
            )
        cloud_name, region, zone = (request.infra.split("/") + [""])[:3]
        slots = max(1, request.gpus_per_node)  # a worker slot per GPU of the instance type
        spec = NodeSpec(
            name=name,
            cloud=cloud_name,
            region=region,
            zone=zone,
            gpu=request.gpu,
            gpus=slots,
            vcpus=slots,
            gang=request.gang,
        )
        folder = f"{cloud.nodes_dir}/{name}"
        return NodeBoot(
            job=job,
            node=name,
            install=install,
            join_token=token,
            ray_address=cloud.ray_address,
            node_dir=folder,
            labels={**spec.labels(), cloud.node_label: name},
            resources=spec.resources(),
            num_cpus=slots,
            # an emulated instance's GPUs are CPU slots standing in for them; a real one's are
            # Ray GPUs, on which its workers train with CUDA (runtime/group.py place_devices)
            num_gpus=0 if cloud.endpoint_url is not None else request.gpus_per_node,
            object_store_bytes=OBJECT_STORE_BYTES,
            grace_s=cloud.grace_s,
            # a real VM's interface is found at boot (ens5 on AWS's Nitro VMs); emulated: eth0
            public_iface="eth0" if cloud.endpoint_url is not None else "",
            notice_source=cloud.provider,
            shutdown_command=cloud.shutdown_command,
            log_file=f"{folder}/bootstrap.log",
            ray_env=dict(cloud.ray_env),
            **(
                {"ray_temp_dir": f"{cloud.ray_temp_root}/{zlib.crc32(name.encode()):08x}"}
                if cloud.ray_temp_root
                else {}
            ),
        )

    return boot_for


class EmulatorMarket:
    """The emulated provider's own decisions, served to the driver's chaos schedule: a spot
    reclaim with notice, a host failure without, a zone's capacity taken back."""

    def __init__(self, emulator, *, notice_s: float) -> None:
        self.emulator, self.notice_s = emulator, notice_s

    def preempt_now(self, node_id: str) -> None:
        self.emulator.interrupt(node_id, notice_s=self.notice_s)

    def lose_now(self, node_id: str) -> None:
        self.emulator.lose(node_id)

    def preempt_location(self, infra: str, *, outage_s: float) -> list[str]:
        zone = infra.split("/")[2] if infra.count("/") == 2 else ""
        return self.emulator.interrupt_zone(zone, notice_s=self.notice_s)


def spot_price_book(catalog, provider: str, regions) -> dict[tuple[str, str], float]:
    """The catalog's published spot price per (region, instance type) of ``provider``: what the
    emulated API reports (the lowest where the catalog lists several zones)."""
    book: dict[tuple[str, str], float] = {}
    for offer in catalog.offers.offers:
        region = offer.location.region
        if offer.location.cloud != provider or region not in regions:
            continue
        if offer.spot_usd_per_hour is None:
            continue
        key = (region, offer.instance_type)
        book[key] = min(book.get(key, offer.spot_usd_per_hour), offer.spot_usd_per_hour)
    return book


def check_emulation(provider: str | None, *, recipe_path: Path | None = None) -> None:
    """UserError unless ``provider`` has an emulation and this machine can boot its VMs
    (``provider`` None: only the latter)."""
    from provisioners.local import vms

    where = {"file": str(recipe_path)} if recipe_path is not None else {}
    if provider is not None and provider not in EMULATED:
        raise UserError(
            f"submit --emulate boots {', '.join(EMULATED)} in this version, not {provider}",
            **where,
            field="provider",
            fix="write provider: aws, gcp or azure, or plan and simulate for this provider",
        )
    reason = vms.unsupported_reason()
    if reason is not None:
        raise UserError(
            f"an emulated cloud boots each VM as a network namespace: {reason}",
            **where,
            fix="run as root on Linux with iproute2, nftables and wireguard-go",
        )


def run_on_emulated_cloud(
    spec, *, folder: Path, recipe_path: Path, notice_s: float | None, on_step, refusals=None
):
    """Make the emulated provider and the controller VM, run the job's driver on the controller,
    follow it to its end; the final state and plan. Everything made is removed after.
    ``refusals``: zone or region -> the EC2 error code its launches fail with."""
    from orchestrator.driver.local import serve_and_follow
    from provisioners.local import vms

    recipe = spec.recipe
    check_emulation(recipe.provider, recipe_path=recipe_path)
    regions = tuple(sorted({loc.split("/")[1] for loc in recipe.constraints.locations}))
    if not regions:
        raise UserError(
            "an emulated cloud needs the recipe's locations to know its regions",
            file=str(recipe_path),
            field="constraints.locations",
            fix=f"list the {recipe.provider} zones to train in, e.g. {recipe.provider}/us-east-1/us-east-1a",
        )
    cluster = vms.NamespaceCluster(
        job=folder.name, folder=folder / "vms", grace_s=recipe.recovery.controller_grace_s
    )
    emulator = None
    ray_temp_root = tempfile.mkdtemp(prefix="geo-ray-")  # short: Ray's socket paths live under it
    try:
        address = cluster.address  # the controller VM: overlay join service and Ray head
        emulator = emulator_for(
            recipe.provider,
            internet=cluster.internet,
            folder=folder / "instances",
            refusals=refusals,
            regions=regions,
            gpu_types=recipe.constraints.gpu_types or None,
        )
        endpoint = emulator.start()
        print(
            f"emulated {recipe.provider}: its API at {endpoint} on the job's simulated internet; "
            "every instance boots as a namespace VM from its boot script",
            file=sys.stderr,
        )
        cloud = CloudSpec(
            provider=recipe.provider,
            regions=regions,
            endpoint_url=endpoint,
            ray_address=address,
            admin_socket=str(cluster.admin_socket),
            install=cluster.install,
            nodes_dir=str(folder / "nodes"),
            ray_env=tuple(vms.RAY_ENV.items()),
            shutdown_command=halt_self_command(),
            grace_s=recipe.recovery.controller_grace_s,
            node_label=vms.NODE_LABEL,
            api_token=getattr(emulator, "token", None),
            account=getattr(emulator, "project", None)
            or getattr(emulator, "subscription_id", None),
            ray_temp_root=ray_temp_root,
            public_ip=cluster.internet.vms["controller"].public_ip,
        )
        from provisioners.registry import provisioner_class

        spec = dataclasses.replace(
            spec,
            cloud=cloud,
            migration_s=MIGRATION_S,
            launch_timeout_s=provisioner_class(recipe.provider).launch_timeout_s,
        )
        market = EmulatorMarket(emulator, notice_s=notice_s if notice_s is not None else NOTICE_S)
        return serve_and_follow(
            market,
            spec,
            job=folder.name,
            folder=folder,
            address=address,
            controller=lambda: None,  # the head, in the controller VM
            on_step=on_step,
            env=emulated_credentials() if recipe.provider == "aws" else None,
        )
    finally:
        if emulator is not None:
            emulator.close()  # every instance's VM with it: nothing outlives the emulation
        cluster.shutdown()
        shutil.rmtree(ray_temp_root, ignore_errors=True)


def emulator_for(
    provider: str,
    *,
    internet,
    folder: Path,
    refusals=None,
    regions: tuple[str, ...],
    gpu_types: tuple[str, ...] | None = None,
):
    """The provider's emulation on ``internet`` (not started yet), reporting the catalog's
    published prices in ``regions`` for ``gpu_types`` (None: every GPU the catalog lists)."""
    from orchestrator.catalog import default_catalog
    from provisioners.local import vms

    offers = [
        o
        for o in default_catalog().offers.offers
        if o.location.cloud == provider
        and o.location.region in regions
        and (gpu_types is None or o.gpu in gpu_types)
    ]
    common = {"internet": internet, "folder": folder, "vm_env": vms._vm_env()}
    if provider == "gcp":
        from provisioners.emulated.gcp import EmulatedGcp

        return EmulatedGcp(**common, refusals=refusals)  # its Billing SKUs are its prices
    if provider == "azure":
        from provisioners.emulated.azure import EmulatedAzure

        sizes = {  # the catalog's sizes there, at its published prices
            (o.location.region, o.instance_type): (
                o.gpus_per_node,
                int(o.vcpus),
                o.memory_gib,
                o.on_demand_usd_per_hour,
                o.spot_usd_per_hour,
            )  # fmt: skip
            for o in offers
            if o.spot_usd_per_hour is not None
        }
        return EmulatedAzure(**common, sizes=sizes, refusals=refusals)
    from provisioners.emulated.aws import EmulatedAws

    book = spot_price_book(default_catalog(), provider, regions)
    return EmulatedAws(**common, regions=regions, spot_usd_per_hour=book, refusals=refusals)


def halt_self_command() -> str:
    """What an emulated VM runs to power itself off (its namespace goes, as a VM's power)."""
    from provisioners.local import vms

    halt = f"PYTHONPATH={shlex.quote(str(vms.package_root()))} {sys.executable} -m "
    return halt + "provisioners.local.netns halt-self"


def emulated_credentials() -> dict[str, str]:
    """Keys for the emulated API, made per job (moto accepts any): the driver's SDK chain finds
    them in its environment, and nothing of the user's own configuration is read."""
    return {
        "AWS_ACCESS_KEY_ID": "AKIA" + secrets.token_hex(8).upper(),
        "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
