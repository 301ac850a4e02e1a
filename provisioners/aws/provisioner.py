"""``AwsProvisioner``: the cloud contract on EC2 through boto3.

Offers come from ``offers.py``; launch is one ``run_instances`` with MinCount = MaxCount (AWS starts
the whole gang or none), then ``describe_instances`` polling until every node runs, terminating the
gang if any fails or the deadline passes. Events come from comparing each look at
``describe_instances`` and ``describe_spot_instance_requests`` with the last (``instances.py``).
Credentials come only from boto3's chain, through the injected or default Session.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from provisioners.aws import firewall as job_firewall
from provisioners.aws import hosting
from provisioners.aws import offers as market
from provisioners.aws.instances import (
    GONE_STATES,
    infra_of,
    launched_at_s,
    location_of,
    run_params,
    start_failure,
    transition,
)
from provisioners.aws.sdk import (
    CLOUD,
    call,
    credentials_missing,
    error_code,
    guard_sdk_logs,
    import_boto3,
    pages,
    tags_of,
)
from provisioners.base import (
    BOOTSTRAP_INSTALL_S,
    GPU_VM_BOOT_S,
    CapacityError,
    CloudCallError,
    Event,
    Feature,
    Firewall,
    Identities,
    LabelledVm,
    LaunchRequest,
    Node,
    NodeReady,
    NodeState,
    Offer,
    PacedPoll,
    Provisioner,
    ProvisionerError,
)
from provisioners.bootstrap.script import aws_user_data, boot_data
from provisioners.tracker import NodeTracker, Tracked

log = logging.getLogger(__name__)

# AWS's Deep Learning Base AMI (NVIDIA driver, CUDA) for x86 GPUs; SSM keeps the latest id per region.
DEFAULT_AMI_PARAMETER = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
)
PRICING_REGION = "us-east-1"  # the Pricing API answers from us-east-1 for every region
FALLBACK_REGION = "us-east-1"  # where region-less calls go when the session names no region
# the states of an instance that still runs or bills (stopped EBS volumes do): what a sweep lists
LISTED_STATES = ["pending", "running", "stopping", "stopped"]


@dataclass(frozen=True, kw_only=True)
class AwsConfig:
    """What the adapter is allowed to look at and launch with."""

    regions: tuple[str, ...] | None = None  # None: every region the account has enabled
    instance_types: tuple[str, ...] | None = None  # None: every NVIDIA GPU instance type
    image_id: str | None = None  # one AMI id (AMIs are regional); None: look it up in SSM
    ami_ssm_parameter: str = DEFAULT_AMI_PARAMETER
    poll_interval_s: float = 5.0
    placement_scores: bool = True  # ask get_spot_placement_scores (rate-limited by AWS)
    on_demand_prices: bool = True  # ask the Pricing API
    # another endpoint for every service (an emulated EC2: provisioners/emulated/aws.py); None:
    # AWS's own, or what boto3's configuration chain names (AWS_ENDPOINT_URL...)
    endpoint_url: str | None = None

    def __post_init__(self) -> None:
        if self.poll_interval_s < 0:
            raise ValueError(f"poll_interval_s must be >= 0, not {self.poll_interval_s}")


class AwsProvisioner(Provisioner):
    """EC2 GPU instances (spot or on-demand) in any zone boto3 can reach."""

    cloud = CLOUD
    # 90 s: how long SkyPilot waits on AWS for a node to launch before it fails over
    launch_timeout_s = 90.0 + GPU_VM_BOOT_S + BOOTSTRAP_INSTALL_S
    unsupported: Mapping[Feature, str] = {
        Feature.AVAILABLE_COUNT: "AWS does not say how many instances it could start; the spot "
        "placement score (availability_score) is the closest signal it gives",
        Feature.PREEMPTION_RATE: "AWS has no API for interruption rates (the Spot Instance "
        "Advisor's frequency bands are a web page, not per zone)",
    }

    def __init__(
        self,
        *,
        regions: Sequence[str] | None = None,
        instance_types: Sequence[str] | None = None,
        session_factory: Callable[[], Any] | None = None,
        poll_interval_s: float = 5.0,
        image_id: str | None = None,
        ami_ssm_parameter: str = DEFAULT_AMI_PARAMETER,
        placement_scores: bool = True,
        on_demand_prices: bool = True,
        endpoint_url: str | None = None,
    ) -> None:
        self.config = AwsConfig(
            endpoint_url=endpoint_url,
            regions=tuple(regions) if regions else None,
            instance_types=tuple(instance_types) if instance_types else None,
            image_id=image_id,
            ami_ssm_parameter=ami_ssm_parameter,
            poll_interval_s=poll_interval_s,
            placement_scores=placement_scores,
            on_demand_prices=on_demand_prices,
        )
        self._session_factory = session_factory
        self._session: Any = None
        self._clients: dict[tuple[str, str], Any] = {}
        self._tracker = NodeTracker()  # the region to call for each node rides in its ``where``
        # facts that do not change while we run: GPU types per region, AMI per region, list prices
        self._gpu_types: dict[str, dict[str, market.GpuInstanceType]] = {}
        self._launched_types: dict[str, market.GpuInstanceType] = {}  # looked up at launch
        self._groups: dict[tuple[str, str], str] = {}  # (region, name) -> a job's group there
        self._images: dict[str, str] = {}
        self._on_demand: dict[tuple[str, str], float | None] = {}
        self._closed = threading.Event()  # set by close(); also what polling waits on
        self._poll = PacedPoll(
            look=self._observe,
            drain=self._tracker.drain,
            interval_s=self.config.poll_interval_s,
            stop=self._closed,
        )

    # ---- sessions and clients -------------------------------------------------------------------

    def _get_session(self) -> Any:
        if self._session is None:
            if self._session_factory is not None:
                self._session = self._session_factory()
            else:
                self._session = import_boto3().session.Session()
        return self._session

    def _client(self, service: str, region: str) -> Any:
        key = (service, region)
        if key not in self._clients:
            extra = {"endpoint_url": self.config.endpoint_url} if self.config.endpoint_url else {}
            self._clients[key] = self._get_session().client(service, region_name=region, **extra)
            guard_sdk_logs()
        return self._clients[key]

    def check_credentials(self) -> None:
        if self._get_session().get_credentials() is None:
            raise credentials_missing("boto3.session.Session.get_credentials")

    # ---- offers ---------------------------------------------------------------------------------

    def offers(
        self, *, gpus: Collection[str] | None = None, regions: Collection[str] | None = None
    ) -> list[Offer]:
        found: list[Offer] = []
        for region in self._regions():
            if regions is None or region in regions:
                found += self._region_offers(region, gpus)
        return found

    def _regions(self) -> list[str]:
        if self.config.regions:
            return list(self.config.regions)
        home = self._get_session().region_name or FALLBACK_REGION
        answer = call(self._client("ec2", home), "describe_regions")
        return sorted(r["RegionName"] for r in answer["Regions"])

    def _region_offers(self, region: str, gpus: Collection[str] | None) -> list[Offer]:
        ec2 = self._client("ec2", region)
        if region not in self._gpu_types:
            self._gpu_types[region] = market.gpu_instance_types(ec2, self.config.instance_types)
        types = {
            name: t for name, t in self._gpu_types[region].items() if gpus is None or t.gpu in gpus
        }
        if not types:
            return []
        zones = market.zones_by_type(ec2, types)
        now_s = time.time()
        spot = market.spot_prices(ec2, sorted(zones), now_s=now_s)
        scores = (
            market.placement_scores(ec2, region, sorted(zones))
            if self.config.placement_scores
            else {}
        )
        on_demand = self._on_demand_prices(region, sorted(zones))
        found = []
        for name, zone_names in sorted(zones.items()):
            for zone in zone_names:
                offer = self._offer(
                    types[name],
                    region,
                    zone,
                    spot.get((zone, name)),
                    on_demand.get(name),
                    scores.get((zone, name)),
                    now_s,
                )
                if offer is not None:
                    found.append(offer)
        return found

    @staticmethod
    def _offer(
        kind: market.GpuInstanceType,
        region: str,
        zone: str,
        spot: market.SpotPrice | None,
        on_demand_usd_per_hour: float | None,
        score: float | None,
        now_s: float,
    ) -> Offer | None:
        if spot is None and on_demand_usd_per_hour is None:
            return None  # nothing to plan with: neither market has a price here
        return Offer(
            cloud=CLOUD,
            region=region,
            zone=zone,
            instance_type=kind.instance_type,
            gpu=kind.gpu,
            gpus_per_node=kind.gpus_per_node,
            vcpus=kind.vcpus,
            memory_gib=kind.memory_gib,
            on_demand_usd_per_hour=on_demand_usd_per_hour,
            spot_usd_per_hour=spot.usd_per_hour if spot else None,
            availability_score=score,
            observed_at_s=spot.observed_at_s if spot else now_s,
            source="+".join(
                call_name
                for call_name, value in (
                    ("ec2.describe_spot_price_history", spot),
                    ("pricing.get_products", on_demand_usd_per_hour),
                )
                if value is not None
            ),
        )

    def _on_demand_prices(self, region: str, types: Sequence[str]) -> dict[str, float | None]:
        """List prices, cached for the adapter's life; the first refusal stops asking (one log)."""
        if self.config.on_demand_prices:
            pricing = self._client("pricing", PRICING_REGION)
            for name in types:
                if (region, name) in self._on_demand:
                    continue
                try:
                    self._on_demand[(region, name)] = market.on_demand_price(pricing, region, name)
                except ProvisionerError as error:
                    log.warning("aws: no on-demand prices for %s (%s)", region, error.message)
                    break
        return {name: self._on_demand.get((region, name)) for name in types}

    # ---- launch ---------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> list[Node]:
        region, zone = location_of(request)
        ec2 = self._client("ec2", region)
        image = self._image(region)
        # one call for the gang (all or none: MinCount == MaxCount), or, where each node has a
        # boot script of its own (its join token), one call per node and all-or-none by hand
        batches = [
            (1, boot_data(aws_user_data, s, cloud=CLOUD, call="ec2.run_instances"))
            for s in request.boot_scripts
        ] or [(request.count, None)]
        ids: list[str] = []
        try:
            for count, script in batches:
                params = run_params(request, zone, image, count=count, user_data=script)
                if request.firewall is not None:
                    params["SecurityGroupIds"] = [self._group(ec2, region, request.firewall)]
                reply = call(ec2, "run_instances", **params)
                ids += [i["InstanceId"] for i in reply["Instances"]]
            running = self._wait_running(ec2, ids, request)
        except BaseException:
            if ids:
                self._abandon(region, ids, request)
            raise
        nodes = [self._node(request, region, instance) for instance in running]
        for node in nodes:
            self._tracker.add(node, where=region, event=NodeReady(node=node))
        return nodes

    def _group(self, ec2: Any, region: str, firewall: Firewall) -> str:
        """The job's security group in ``region``, its rules as ``firewall`` says."""
        key = (region, firewall.name)
        if key not in self._groups:
            self._groups[key] = job_firewall.ensure_group(ec2, firewall)
        job_firewall.sync(ec2, self._groups[key], firewall)
        return self._groups[key]

    def open_overlay(self, firewall: Firewall) -> None:
        for (region, name), group in self._groups.items():
            if name == firewall.name:
                job_firewall.sync(self._client("ec2", region), group, firewall)

    def _image(self, region: str) -> str:
        if self.config.image_id:
            return self.config.image_id
        if region not in self._images:
            ssm = self._client("ssm", region)
            try:
                answer = call(ssm, "get_parameter", Name=self.config.ami_ssm_parameter)
            except ProvisionerError as error:
                raise CloudCallError(
                    f"no AMI id under the SSM parameter {self.config.ami_ssm_parameter} in "
                    f"{region}: {error.message}",
                    cloud=CLOUD,
                    call="ssm.get_parameter",
                    fix="pass image_id='ami-...' (an AMI of this region with NVIDIA drivers) or "
                    "ami_ssm_parameter='/aws/service/...' to AwsProvisioner",
                ) from None
            self._images[region] = answer["Parameter"]["Value"]
        return self._images[region]

    def _describe(self, ec2: Any, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The instances among ``ids`` that AWS lists now. A filter rather than InstanceIds: right
        after run_instances, or long after termination, an id may be unknown, which is not an error."""
        filters = [{"Name": "instance-id", "Values": list(ids)}]
        found = pages(ec2, "describe_instances", "Reservations", Filters=filters)
        return {i["InstanceId"]: i for reservation in found for i in reservation["Instances"]}

    def _wait_running(
        self, ec2: Any, ids: list[str], request: LaunchRequest
    ) -> list[dict[str, Any]]:
        """Poll until every instance runs; raise if one ends or ``request.timeout_s`` passes."""
        deadline = time.monotonic() + request.timeout_s
        while True:
            seen = self._describe(ec2, ids)
            for instance in seen.values():
                if instance["State"]["Name"] in GONE_STATES:
                    raise start_failure(instance, request)
            if len(seen) == len(ids) and all(
                i["State"]["Name"] == "running" for i in seen.values()
            ):
                return [seen[i] for i in ids]
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                raise CapacityError(
                    f"{len(ids)} x {request.instance_type} in {request.infra} did not all reach "
                    f"'running' within {request.timeout_s:g} s",
                    cloud=CLOUD,
                    call="ec2.describe_instances",
                    fix="try another zone or region, or give the launch a longer timeout_s",
                )
            self._closed.wait(min(self.config.poll_interval_s, left_s))

    def _abandon(self, region: str, ids: list[str], request: LaunchRequest) -> None:
        """Terminate a gang that failed to start; if even that fails, keep tracking its nodes so
        that ``nodes()`` shows them and a later ``terminate`` can retry."""
        try:
            self._terminate_in(region, ids)
            return
        except ProvisionerError as error:
            log.error(
                "aws: could not terminate the failed gang %s (%s): %s",
                request.gang,
                ", ".join(ids),
                error,
            )
        for node_id in ids:
            node = Node(
                node_id=node_id, gang=request.gang, infra=request.infra,
                instance_type=request.instance_type, gpu=request.gpu,
                gpus=self._gpus_per_node(region, request.instance_type), spot=request.spot, state=NodeState.PENDING, labels=request.labels,
            )  # fmt: skip
            self._tracker.add(node, where=region)

    def _gpus_per_node(self, region: str, instance_type: str) -> int:
        """From the offers' cache, or one describe_instance_types when launching before offers()."""
        if instance_type not in self._gpu_types.get(region, {}):
            ec2 = self._client("ec2", region)
            self._launched_types.update(market.gpu_instance_types(ec2, [instance_type]))
        kind = self._gpu_types.get(region, {}).get(instance_type) or self._launched_types.get(
            instance_type
        )
        return kind.gpus_per_node if kind else 0

    def _node(self, request: LaunchRequest, region: str, instance: dict[str, Any]) -> Node:
        return Node(
            node_id=instance["InstanceId"],
            gang=request.gang,
            infra=infra_of(region, instance),
            instance_type=request.instance_type,
            gpu=request.gpu,
            gpus=self._gpus_per_node(region, request.instance_type),
            spot=request.spot,
            state=NodeState.RUNNING,
            address=instance.get("PrivateIpAddress"),
            launched_at_s=launched_at_s(instance),
            labels=request.labels,
        )

    # ---- nodes, terminate, events ---------------------------------------------------------------

    def nodes(self, *, gang: str | None = None) -> list[Node]:
        self._observe()
        return self._tracker.nodes(gang=gang)

    def labelled(self, key: str) -> list[LabelledVm]:
        found = []
        for region in self._regions():
            filters = [
                {"Name": "tag-key", "Values": [key]},
                {"Name": "instance-state-name", "Values": LISTED_STATES},
            ]
            ec2 = self._client("ec2", region)
            for reservation in pages(ec2, "describe_instances", "Reservations", Filters=filters):
                for instance in reservation["Instances"]:
                    zone = instance.get("Placement", {}).get("AvailabilityZone", "")
                    state = instance["State"]["Name"]
                    found.append(
                        LabelledVm(
                            node_id=instance["InstanceId"],
                            infra=f"{CLOUD}/{region}/{zone}",
                            instance_type=instance.get("InstanceType", ""),
                            state=NodeState.PENDING if state == "pending" else NodeState.RUNNING,
                            labels=tags_of(instance),
                        )
                    )
        return found

    def drop_firewalls(self, job: str) -> tuple[list[str], list[str]]:
        dropped, in_use = [], []
        for region in self._regions():
            done, kept = job_firewall.drop(self._client("ec2", region), job)
            dropped += [f"{region}/{name}" for name in done]
            in_use += [f"{region}/{name}" for name in kept]
        return dropped, in_use

    def relabel_labelled(self, vms: Sequence[LabelledVm], labels: Mapping[str, str]) -> None:
        tags = [{"Key": k, "Value": v} for k, v in labels.items()]
        by_region: dict[str, list[str]] = {}
        for vm in vms:
            by_region.setdefault(vm.infra.split("/")[1], []).append(vm.node_id)
        for region, ids in by_region.items():
            call(self._client("ec2", region), "create_tags", Resources=ids, Tags=tags)

    def terminate_labelled(self, vms: Sequence[LabelledVm]) -> None:
        by_region: dict[str, list[str]] = {}
        for vm in vms:
            by_region.setdefault(vm.infra.split("/")[1], []).append(vm.node_id)
        for region, ids in by_region.items():
            self._terminate_in(region, ids)

    def terminate(self, node_ids: Sequence[str]) -> None:
        live = self._tracker.known(node_ids)
        live_ids = {t.node.node_id for t in live}
        for node_id in dict.fromkeys(i for i in node_ids if i not in live_ids):
            log.debug("aws: %s is unknown or already gone; nothing to terminate", node_id)
        for region, group in _by_where(live).items():
            self._terminate_in(region, [t.node.node_id for t in group])
            for tracked in group:
                self._tracker.ended(tracked, state=NodeState.TERMINATED, reason="terminated")

    def relabel(self, node_ids: Sequence[str], labels: Mapping[str, str]) -> None:
        tags = [{"Key": k, "Value": v} for k, v in labels.items()]
        for region, group in _by_where(self._tracker.known(node_ids)).items():
            ids = [t.node.node_id for t in group]
            call(self._client("ec2", region), "create_tags", Resources=ids, Tags=tags)

    def _terminate_in(self, region: str, ids: Sequence[str]) -> None:
        """terminate_instances, ignoring ids AWS no longer knows (one unknown id fails a batch, so
        the batch is retried one by one)."""
        ec2 = self._client("ec2", region)
        try:
            call(ec2, "terminate_instances", InstanceIds=list(ids))
        except ProvisionerError as error:
            if error_code(error) != "InvalidInstanceID.NotFound":
                raise
            for node_id in ids if len(ids) > 1 else ():
                self._terminate_in(region, [node_id])

    def poll_events(self, *, timeout_s: float = 0.0) -> list[Event]:
        return self._poll(timeout_s=timeout_s)

    def _observe(self) -> None:
        """One look at every live node; queue the events its changes mean."""
        for region, group in self._tracker.by_where().items():
            ec2 = self._client("ec2", region)
            ids = [t.node.node_id for t in group]
            statuses = self._spot_statuses(ec2, [t.node.node_id for t in group if t.node.spot])
            instances = self._describe(ec2, ids)
            now_s = time.time()
            for tracked in group:
                node_id = tracked.node.node_id
                self._tracker.update(
                    tracked,
                    partial(
                        transition,
                        instance=instances.get(node_id),
                        spot_status=statuses.get(node_id),
                        now_s=now_s,
                    ),
                )

    def _spot_statuses(self, ec2: Any, ids: Sequence[str]) -> dict[str, str]:
        """Spot request status code per instance id (where the notice shows first). Without the
        permission to read spot requests, losses are still seen, only without notice: log it."""
        if not ids:
            return {}
        filters = [{"Name": "instance-id", "Values": list(ids)}]
        try:
            requests = pages(
                ec2, "describe_spot_instance_requests", "SpotInstanceRequests", Filters=filters
            )
            return {
                r["InstanceId"]: r.get("Status", {}).get("Code", "")
                for r in requests
                if r.get("InstanceId")
            }
        except ProvisionerError as error:
            log.warning(
                "aws: cannot read spot requests, so no preemption notices: %s", error.message
            )
            return {}

    # ---- hosting a job's controller (hosting.py) -------------------------------------------------

    def job_bucket(self, region: str) -> str:
        account = hosting.account_of(self._client("sts", region))
        return hosting.ensure_bucket(self._s3(region), hosting.bucket_name(account, region), region)

    def job_buckets(self) -> dict[str, str]:
        region = (self.config.regions or (FALLBACK_REGION,))[0]
        account = hosting.account_of(self._client("sts", region))
        return hosting.job_buckets(self._s3(region), account)

    def identities(self, bucket_url: str) -> Identities:
        return hosting.ensure_identities(self._client("iam", "us-east-1"), bucket_url)

    def presign(self, url: str, *, expires_s: float) -> str:
        region = (self.config.regions or ("us-east-1",))[0]
        return hosting.presign(self._s3(region), url, expires_s=expires_s)

    def _s3(self, region: str) -> Any:
        """S3 with SigV4; by path at an emulated endpoint (an address: no bucket subdomains)."""
        key = ("s3", region)
        if key not in self._clients:
            from botocore.config import Config

            # SigV4 (a presigned URL's only lasting form); by path at an emulated endpoint
            style = "path" if self.config.endpoint_url else "auto"
            extra: dict[str, Any] = {
                "config": Config(signature_version="s3v4", s3={"addressing_style": style})
            }
            if self.config.endpoint_url:
                extra["endpoint_url"] = self.config.endpoint_url
            self._clients[key] = self._get_session().client("s3", region_name=region, **extra)
        return self._clients[key]

    def close(self) -> None:
        self._closed.set()


def _by_where(group: Sequence[Tracked]) -> dict[str, list[Tracked]]:
    """``group`` by the region each node is called in, in ``group``'s order."""
    regions: dict[str, list[Tracked]] = {}
    for tracked in group:
        regions.setdefault(tracked.where, []).append(tracked)
    return regions
