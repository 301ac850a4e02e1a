"""The cloud contract: what every provisioner takes, returns and raises.

A provisioner lists offers (a market snapshot), launches a gang of nodes all-or-nothing, reports node
states, terminates nodes, and streams events (node ready, preemption notice, node lost). Every
adapter implements the whole contract or declares, as data in ``unsupported``, what it cannot do and
why; callers check ``supports`` instead of branching on the cloud's name.

Errors are typed so that a caller can act: ``CapacityError`` and ``QuotaError`` mean "try the next
location", ``CredentialsMissing`` names the credential and where the SDK looks for it. Messages never
carry secrets (``scrub``).
"""

from __future__ import annotations

import abc
import enum
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

SWEEP_FIX = "look them up in the cloud's console by the label (tag) geo-job"
HOST_FIX = (
    "run the job on a provider that hosts controllers (aws, gcp, azure), or with submit --emulate"
)


class Feature(enum.Enum):
    """What an adapter may be unable to do (declared in ``Provisioner.unsupported``)."""

    LIST_OFFERS = "list offers"
    AVAILABLE_COUNT = "available node count per offer"
    AVAILABILITY_SCORE = "availability score per offer"
    PREEMPTION_RATE = "preemption rate per offer"
    SPOT = "spot nodes"
    ON_DEMAND = "on-demand nodes"
    ZONE_PLACEMENT = "choosing the zone of a node"
    PREEMPTION_NOTICE = "preemption notice before a node dies"
    LAUNCH = "launching nodes"
    LIST_LABELLED = "listing and terminating VMs by label, whoever launched them (leak sweeps)"
    FIREWALL = "a firewall per job that admits only the overlay's port from the job's own nodes"
    RELABEL = "changing a running VM's labels (a job renewing its VMs' lease)"
    CONTROLLER_HOST = (
        "hosting a job's controller: a private bucket for the job's state and the identities "
        "its controller and nodes act as"
    )


class NodeState(enum.Enum):
    PENDING = "pending"  # asked for, not yet usable
    RUNNING = "running"
    PREEMPTING = "preempting"  # a preemption notice arrived; the node dies at its deadline
    TERMINATED = "terminated"  # we asked for it to go
    LOST = "lost"  # preempted or failed without our asking


# ---- errors ---------------------------------------------------------------------------------------


class ProvisionerError(Exception):
    """A provisioner call failed: which cloud, which call, what happened and what to do; ``code``:
    the cloud's own error code where it gave one (error_map.py), for callers that tell one
    refusal from another (e.g. "already gone")."""

    def __init__(self, message: str, *, cloud: str, call: str, fix: str, code: str = "") -> None:
        self.cloud, self.call, self.code = cloud, call, code
        self.message, self.fix = scrub(message), scrub(fix)
        super().__init__(f"{cloud} {call}: {self.message}\n  To fix: {self.fix}")

    def __reduce__(self):
        # sent between processes (Ray, the local cloud's gateway): rebuilt from its fields, since
        # the default rebuilds an exception from ``args`` alone and this one needs keywords
        fields = (type(self), self.message, self.cloud, self.call, self.fix, self.code)
        return (_rebuild_error, fields)


def _rebuild_error(
    cls, message: str, cloud: str, call: str, fix: str, code: str = ""
) -> ProvisionerError:
    return cls(message, cloud=cloud, call=call, fix=fix, code=code)


class CapacityError(ProvisionerError):
    """The location has no capacity for the request now: try another location or later."""


class QuotaError(ProvisionerError):
    """The account's quota forbids the request: raise the quota or go elsewhere."""


class CredentialsMissing(ProvisionerError):
    """The SDK's standard credential chain found nothing; names what it looked for."""


class SdkMissing(ProvisionerError):
    """The cloud's SDK is not installed (the adapter imports it only when used)."""


class Unsupported(ProvisionerError):
    """The adapter declared that it cannot do this (``Provisioner.unsupported``)."""


class CloudCallError(ProvisionerError):
    """Any other failure of a cloud API call."""


# Environment variables whose values are secrets in any of the SDKs' chains.
SECRET_ENV = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_CLIENT_CERTIFICATE_PASSWORD",
    "GOOGLE_OAUTH_ACCESS_TOKEN",
)
_SECRET_PATTERNS = (
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+"),
    re.compile(r"(?i)(x-amz-security-token['\"]?\s*[:=]\s*b?['\"]?)[^'\"\s,;&}]+"),
    # ``client_secret=...``, ``"token": "..."``, ``password: b'...'``; not ``AuthenticationToken:``
    re.compile(
        r"(?i)((?<![a-z])(?:secret|token|password|signature|credential)s?[\"']?\s*[:=]\s*b?[\"']?)"
        r"[^\s\"',;&}]+"
    ),
    re.compile(r"\b(A[SK]IA)[A-Z0-9]{12,}\b"),
)


def scrub(text: str) -> str:
    """``text`` with secrets replaced by ``***``: values of the SDKs' secret environment variables,
    bearer tokens, ``secret=...``-style pairs and AWS access key ids."""
    for name in SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + "***", text)
    return text


# ---- data in and out ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Offer:
    """A VM type with GPUs in one place, as the cloud reports it now. Prices are per node-hour."""

    cloud: str
    region: str
    zone: str | None
    instance_type: str
    gpu: str  # SkyPilot's accelerator name: A100, A100-80GB, V100, T4, L4, A10G, H100, ...
    gpus_per_node: int
    vcpus: float
    memory_gib: float
    on_demand_usd_per_hour: float | None
    spot_usd_per_hour: float | None
    available_count: int | None = None  # nodes the cloud says it can give now, where it tells
    availability_score: float | None = None  # 0..1, e.g. AWS spot placement score / 10
    preemption_rate_per_hour: float | None = None  # where the cloud (or a trace) tells
    observed_at_s: float  # Unix time the price or capacity was observed
    source: str  # the call or file it came from

    @property
    def infra(self) -> str:
        return "/".join(p for p in (self.cloud, self.region, self.zone) if p)


@dataclass(frozen=True, kw_only=True)
class LaunchRequest:
    """``count`` nodes of one type in one place, all or none."""

    gang: str  # a name for the group; node names derive from it
    infra: str  # cloud/region[/zone]; without a zone the adapter picks one
    instance_type: str
    gpu: str
    count: int
    spot: bool = True
    gpus_per_node: int = 1  # the instance type's (a node's worker slots)
    labels: tuple[tuple[str, str], ...] = ()  # extra key/value labels to put on every node
    timeout_s: float = 600.0  # how long to wait for every node to run before giving up
    # the boot script of each node, in order (user-data, startup-script, customData, a SkyPilot
    # run): node i of the answer ran script i. () boots the image as it is. A script holds a
    # one-use join token: a secret, never logged (repr hides it)
    boot_scripts: tuple[str, ...] = field(default=(), repr=False)
    # the job's firewall the nodes go behind (None: the cloud's default for new VMs)
    firewall: Firewall | None = None
    # what the VMs act as toward the cloud's APIs (``Provisioner.identities``: an AWS instance
    # profile); None: no identity, the VMs reach no API
    identity: str | None = None

    def __post_init__(self) -> None:
        assert self.count >= 1, "a gang has at least one node"
        assert self.infra.count("/") >= 1, "infra names a cloud and a region"
        assert not self.boot_scripts or len(self.boot_scripts) == self.count, "a script per node"

    @property
    def cloud(self) -> str:
        return self.infra.split("/")[0]


@dataclass(frozen=True, kw_only=True)
class Firewall:
    """What a job's VMs admit from the internet: the overlay's UDP ``port`` from ``sources`` (the
    public addresses of the job's controller and nodes), nothing else (replies to what a VM
    opened aside). The sources change as nodes come and go: ``Provisioner.open_overlay``."""

    job: str
    port: int
    sources: tuple[str, ...]  # addresses (one host each) or CIDR blocks (0.0.0.0/0: anyone)
    # whose firewall: the job's nodes, or its controller (open to nodes not yet known: the
    # overlay admits only WireGuard peers with the job's keys)
    role: str = "nodes"

    @property
    def name(self) -> str:
        """The firewall's (security group's, rule's) name in the cloud."""
        return f"geo-{self.job}" if self.role == "nodes" else f"geo-{self.job}-{self.role}"

    def cidrs(self) -> tuple[str, ...]:
        return tuple(s if "/" in s else f"{s}/32" for s in self.sources)


@dataclass(frozen=True, kw_only=True)
class Identities:
    """What a job's VMs act as: the cloud's names for them (an AWS instance profile each)."""

    controller: str
    node: str


@dataclass(frozen=True, kw_only=True)
class LabelledVm:
    """A VM found by its labels (tags), whatever process launched it."""

    node_id: str
    infra: str  # cloud/region/zone
    instance_type: str
    state: NodeState
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Node:
    """One VM as the provisioner last saw it."""

    node_id: str  # the cloud's id (instance id, VM name; the Ray node id on the local cloud)
    gang: str
    infra: str  # cloud/region/zone where it really landed
    instance_type: str
    gpu: str
    gpus: int
    spot: bool
    state: NodeState
    address: str | None = None  # IP address, or the Ray node id on the local cloud
    launched_at_s: float = 0.0
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, kw_only=True)
class NodeReady:
    node: Node
    at_s: float = field(default_factory=time.time)


@dataclass(frozen=True, kw_only=True)
class PreemptionNotice:
    """The cloud will take ``node_id`` back at ``deadline_s`` (Unix time)."""

    node_id: str
    infra: str
    deadline_s: float
    at_s: float = field(default_factory=time.time)


@dataclass(frozen=True, kw_only=True)
class NodeLost:
    """``node_id`` is gone: ``reason`` is ``preempted``, ``failed`` or ``terminated``."""

    node_id: str
    infra: str
    reason: str
    at_s: float = field(default_factory=time.time)


Event = NodeReady | PreemptionNotice | NodeLost


class PacedPoll:
    """``poll_events`` of an adapter that polls a control plane: ``look`` (one look at the cloud,
    queueing the events its changes mean) at most once per ``interval_s``, and ``drain`` (the
    queued events) on every call; waits up to ``timeout_s`` for the first event, or until ``stop``
    is set.

    The pace matters because the driver asks for events between every two training steps
    (``timeout_s=0``): unpaced, that is a describe call or two per step, which a real account's
    API throttles (EC2 answers RequestLimitExceeded) and which cost an emulated cloud's API server
    most of a core. A cloud's notice comes seconds to minutes ahead, so a look per interval
    loses nothing."""

    def __init__(
        self,
        *,
        look: Callable[[], None],
        drain: Callable[[], list[Event]],
        interval_s: float,
        stop: threading.Event,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._look, self._drain, self._clock = look, drain, clock
        self.interval_s, self._stop = interval_s, stop
        self._next_look_s = float("-inf")  # the first call looks

    def __call__(self, *, timeout_s: float) -> list[Event]:
        deadline = self._clock() + timeout_s
        while True:
            if self._clock() >= self._next_look_s:
                self._look()
                self._next_look_s = self._clock() + self.interval_s
            events = self._drain()
            left_s = deadline - self._clock()
            if events or left_s <= 0 or self._stop.is_set():
                return events
            self._stop.wait(min(max(self._next_look_s - self._clock(), 0.0), left_s))


# ---- the contract ---------------------------------------------------------------------------------


# A cloud launch's budget beyond placing the VM: a GPU VM boots (its OS, the NVIDIA driver), then its
# bootstrap installs torch and Ray from PyPI and joins the job's cluster
GPU_VM_BOOT_S = 120.0
BOOTSTRAP_INSTALL_S = 300.0


class Provisioner(abc.ABC):
    """One cloud (or the local simulated cloud) behind the contract."""

    cloud: str = ""
    # what this adapter cannot do, and why (shown to users; checked by ``require``)
    unsupported: Mapping[Feature, str] = {}
    # how long a launch may take, from the call to every node running its bootstrap's last step
    # (capabilities as data: callers read it, never the cloud's name); adapters set their own
    launch_timeout_s: float = 600.0  # the contract's LaunchRequest default

    @property
    def clouds(self) -> tuple[str, ...]:
        """The clouds whose offers this provisioner returns: a multi-cloud adapter (SkyPilot) names
        several, and its offers carry the real cloud, not the adapter's name."""
        return (self.cloud,)

    def supports(self, feature: Feature) -> bool:
        return feature not in self.unsupported

    def require(self, feature: Feature, *, call: str) -> None:
        reason = self.unsupported.get(feature)
        if reason is not None:
            raise Unsupported(
                f"{feature.value} is not supported: {reason}",
                cloud=self.cloud,
                call=call,
                fix="choose another provider for this, or do without it",
            )

    @abc.abstractmethod
    def check_credentials(self) -> None:
        """Raise ``CredentialsMissing`` naming what the SDK's standard chain lacks."""

    @abc.abstractmethod
    def offers(
        self, *, gpus: Collection[str] | None = None, regions: Collection[str] | None = None
    ) -> list[Offer]:
        """The market now: every GPU offer (optionally only these GPUs / regions)."""

    @abc.abstractmethod
    def launch(self, request: LaunchRequest) -> list[Node]:
        """Start ``request.count`` nodes and wait until all run; if any cannot start, terminate
        those that did and raise (``CapacityError``, ``QuotaError``, ``CloudCallError``)."""

    @abc.abstractmethod
    def nodes(self, *, gang: str | None = None) -> list[Node]:
        """Every node this provisioner launched and still knows of, with its current state."""

    @abc.abstractmethod
    def terminate(self, node_ids: Sequence[str]) -> None:
        """Release these nodes (unknown or already gone ids are ignored)."""

    @abc.abstractmethod
    def poll_events(self, *, timeout_s: float = 0.0) -> list[Event]:
        """Events since the last call; waits up to ``timeout_s`` for the first one."""

    def labelled(self, key: str) -> list[LabelledVm]:
        """Every VM of this cloud not yet terminated that carries label ``key`` (any value),
        whoever launched it: what ``status --all`` and ``down`` see (every region the adapter is
        configured for)."""
        raise self._lacking(Feature.LIST_LABELLED, "labelled", "lists no VMs by label", SWEEP_FIX)

    def terminate_labelled(self, vms: Sequence[LabelledVm]) -> None:
        """Terminate VMs ``labelled`` found (ids gone meanwhile are ignored)."""
        raise self._lacking(
            Feature.LIST_LABELLED, "terminate_labelled", "terminates no VMs by label", SWEEP_FIX
        )

    def open_overlay(self, firewall: Firewall) -> None:
        """Make the job's firewall admit exactly ``firewall.sources`` (where it has VMs)."""
        raise self._lacking(
            Feature.FIREWALL,
            "open_overlay",
            "makes no firewall per job",
            "launch without LaunchRequest.firewall on this cloud",
        )

    def drop_firewalls(self, job: str) -> tuple[list[str], list[str]]:
        """Delete the job's firewalls (its nodes' and its controller's, every place the adapter
        sees); the names deleted, and those the cloud keeps while VMs still use them (their VMs
        are shutting down: ask again once they are gone)."""
        raise self._lacking(
            Feature.FIREWALL, "drop_firewalls", "makes no firewall per job", SWEEP_FIX
        )

    def relabel(self, node_ids: Sequence[str], labels: Mapping[str, str]) -> None:
        """Set these labels (tags) on the running VMs ``node_ids`` (others kept as they are)."""
        raise self._lacking(
            Feature.RELABEL, "relabel", "relabels no VM", "set the labels in the cloud's console"
        )

    def job_bucket(self, region: str) -> str:
        """The account's private bucket for jobs' state in ``region`` (made when missing), as a
        URL (``s3://...``): a job's controller keeps its state there, and finds it again."""
        raise self._lacking(Feature.CONTROLLER_HOST, "job_bucket", "keeps no job state", HOST_FIX)

    def job_buckets(self) -> dict[str, str]:
        """The account's buckets for jobs' state that exist now (``job_bucket`` made them):
        region -> URL, where ``status`` looks for a job submitted from another machine."""
        raise self._lacking(Feature.CONTROLLER_HOST, "job_buckets", "keeps no job state", HOST_FIX)

    def identities(self, bucket_url: str) -> Identities:
        """The identities a job's controller and its nodes act as (made when missing), allowed
        what each needs: the controller this cloud's VM calls and the bucket, a node the bucket
        (its checkpoints)."""
        raise self._lacking(Feature.CONTROLLER_HOST, "identities", "makes no identity", HOST_FIX)

    def presign(self, url: str, *, expires_s: float) -> str:
        """A URL that fetches the object ``url`` of the job's bucket without credentials until
        ``expires_s`` from now (what a VM installs our package from before it has any SDK)."""
        raise self._lacking(Feature.CONTROLLER_HOST, "presign", "presigns no URL", HOST_FIX)

    def relabel_labelled(self, vms: Sequence[LabelledVm], labels: Mapping[str, str]) -> None:
        """Set these labels on VMs ``labelled`` found, whoever launched them (a job's
        controller renewing its own lease)."""
        raise self._lacking(
            Feature.RELABEL,
            "relabel_labelled",
            "relabels no VM",
            "set the labels in the cloud's console",
        )

    def _lacking(self, feature: Feature, call: str, what: str, fix: str) -> Unsupported:
        """What an adapter without an optional method says: the reason it declared in
        ``unsupported``, or that it has none yet (an adapter that forgot to declare it)."""
        self.require(feature, call=call)
        return Unsupported(f"this adapter {what} yet", cloud=self.cloud, call=call, fix=fix)

    def close(self) -> None:  # noqa: B027 (optional hook: most adapters hold nothing to stop)
        """Stop background work; nodes stay as they are unless the adapter owns them."""
