"""A real multi-node Ray cluster on this machine: each simulated VM is a Ray node.

Every node carries its place and GPU type twice, so that actors land by location either way:
as labels (``geo-cloud``, ``geo-region``, ``geo-zone``, ``geo-gpu``, ``geo-gang``; label values may
not contain ``/``) and as custom resources (``infra:<cloud/region/zone>`` and ``gpu:<type>``, one
unit per GPU). A preemption drains the node through the GCS with reason PREEMPTION and a deadline (so
Ray records the death as a preemption and stops placing work there), then kills its processes.

Health checks are tightened (``HEALTH_CHECK``): a killed node is declared dead in about 1.4 s
rather than about 14 s. Ray >= 2.60 enables token authentication by default; local test clusters
run with ``RAY_AUTH_MODE=disabled``.

The cluster dies with the process that started it (``dies_with_owner``, on by default): a reaper
process (reaper.py, which also says why this mechanism) kills every process of its Ray session when
that process is gone, even by ``kill -9``; a normal shutdown stops the nodes as Ray does, then the
reaper sweeps what is left. Ray's own exit hooks and fate-sharing are off for every node (they worked only
for nodes started on the main thread, and only for the starter's children). A node killed as a
vanished VM loses its raylet and everything the raylet started at once.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import fcntl
import logging
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from provisioners.local import reaper

log = logging.getLogger(__name__)

HEALTH_CHECK = {
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # per node: the smallest Ray accepts comfortably
# Ray's log monitor tails a node's log folder and publishes each line to drivers that print the
# workers' output. Every node of the local cloud shares one session folder on one host, so each
# node's monitor would read all the nodes' logs; and no driver of ours prints them
# (``log_to_driver=False``): the logs stay in their files (the job's ``ray-logs``).
QUIET_NODE = {"include_log_monitor": False}
# On a machine with CUDA GPUs a simulated node's GPUs are this machine's, in turn: Ray is told
# not to set CUDA_VISIBLE_DEVICES (it would show every node "its" GPU 0) and the node's workers
# read which of this machine's GPUs their GPU 0 is (runtime/devices.py reads the same name)
CUDA_FIRST_ENV = "GEO_LOCAL_CUDA_FIRST"


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cloud: str
    region: str
    zone: str | None
    gpu: str
    gpus: int
    vcpus: float
    gang: str

    @property
    def infra(self) -> str:
        return "/".join(p for p in (self.cloud, self.region, self.zone) if p)

    role: str = "worker"  # or "controller": a job's driver runs there (no GPU, no market offer)
    # > 1: the node emulates a device this many times slower than its type (a noisy neighbour);
    # its workers read the label and slow their compute (runtime/actor.py SLOWDOWN_LABEL)
    slowdown: float = 1.0

    def resources(self) -> dict[str, float]:
        if self.role == "controller":
            return {"controller": 1.0}
        return {f"infra:{self.infra}": float(self.gpus), f"gpu:{self.gpu}": float(self.gpus)}

    def labels(self) -> dict[str, str]:
        labels = {
            "geo-cloud": self.cloud,
            "geo-region": self.region,
            "geo-gpu": self.gpu,
            "geo-gang": self.gang,
            "geo-role": self.role,
        }
        if self.zone:
            labels["geo-zone"] = self.zone
        if self.slowdown > 1.0:
            labels["geo-slowdown"] = f"{self.slowdown:g}"
        return labels


class ClusterNodes:
    """What both kinds of local VMs (these processes, vms.py's namespaces) answer the same way:
    subclasses set ``_cluster`` (the head, once started), ``_nodes`` (node id -> their record)
    and ``address``."""

    _cluster = None
    _nodes: dict

    address: str

    def drain_for_preemption(self, node_id: str, *, deadline_s: float, message: str) -> bool:
        """Tell the GCS the node will be preempted at ``deadline_s`` (Unix s); True if accepted."""
        return drain_for_preemption(self.address, node_id, deadline_s=deadline_s, message=message)

    def alive(self) -> set[str]:
        """Ids of the worker nodes the GCS considers alive."""
        if self._cluster is None:
            return set()
        return set(alive_nodes(self.address)) & set(self._nodes)

    def owns(self, node_id: str) -> bool:
        return node_id in self._nodes

    host_gpus = 0  # this machine's CUDA GPUs the simulated nodes' GPUs map onto (0: CPU slots)
    _gpus_given = 0

    def _gpu_settings(self, spec: NodeSpec) -> tuple[int, dict[str, str]]:
        """The Ray GPUs of ``spec``'s node and the environment that maps them onto this
        machine's GPUs, round robin over nodes (several nodes share a GPU where there are
        fewer GPUs than the market's nodes hold): none on a machine without GPUs."""
        if not self.host_gpus or spec.role == "controller" or spec.gpus < 1:
            return 0, {}
        first = self._gpus_given % self.host_gpus
        self._gpus_given += spec.gpus
        return spec.gpus, {
            "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
            CUDA_FIRST_ENV: str(first),
        }


class LocalCluster(ClusterNodes):
    """Starts the head on first use; adds, drains and kills worker nodes."""

    mode = "processes"  # what a VM is (vms.py: "namespaces")

    def __init__(
        self,
        *,
        head_cpus: int = 1,
        dies_with_owner: bool = True,
        host_gpus: int = 0,
        dashboard: bool = False,
    ) -> None:
        """``dies_with_owner=False`` starts no reaper: the nodes then outlive a crash of this
        process (the way to a detached job, which would also skip the exit hook below);
        ``host_gpus``: this machine's CUDA GPUs, which the nodes' GPUs then are; ``dashboard``:
        the head runs Ray's dashboard (a job's; tests go without)."""
        self._head_cpus, self.host_gpus, self.dashboard = head_cpus, host_gpus, dashboard
        self._dies_with_owner = dies_with_owner
        self._cluster = None
        self._reaper: reaper.Reaper | None = None
        self._nodes: dict[str, object] = {}  # Ray node id (hex) -> ray._private.node.Node

    @property
    def address(self) -> str:
        return self._started().address

    def reachable(self, host: str, port: int) -> str:
        """``host:port`` of the cluster's network as this machine reaches it: the same (its
        nodes are processes here)."""
        return f"{host}:{port}"

    def _started(self):
        if self._cluster is None:
            start = time.monotonic()
            # named here, not by Ray, so that the reaper knows it before the first process
            session = session_name()
            if self._dies_with_owner:
                self._reaper = reaper.Reaper.start(session)
            try:
                with dashboard_port_lock() if self.dashboard else contextlib.nullcontext():
                    self._cluster = start_head(session, self._head_cpus, dashboard=self.dashboard)
            except BaseException:
                self._release_reaper()  # it sweeps what a failed start left running
                raise
            atexit.register(self.shutdown)
            log.info(
                "local cloud: Ray head at %s in %.1f s",
                self._cluster.address,
                time.monotonic() - start,
            )
        return self._cluster

    def add(self, spec: NodeSpec, *, timeout_s: float) -> str:
        """Start a Ray node for ``spec`` and wait until it registers; return its node id."""
        cluster = self._started()
        gpus, env = self._gpu_settings(spec)
        node = cluster.add_node(
            wait=False,
            num_cpus=max(1, int(spec.vcpus)),
            num_gpus=gpus,
            env_vars=env or None,
            resources=spec.resources(),
            labels=spec.labels(),
            object_store_memory=OBJECT_STORE_BYTES,
            **QUIET_NODE,
        )
        import ray._private.services

        ray._private.services.wait_for_node(
            node.gcs_address, node.plasma_store_socket_name, timeout_s
        )
        self._nodes[node.node_id] = node
        return node.node_id

    def kill(self, node_id: str) -> None:
        """Kill every process of the node at once (no graceful shutdown: a VM that vanishes)."""
        node = self._nodes.pop(node_id, None)
        if node is None:
            return
        if reaper.supported():
            # Ray kills the raylet alone; its agents and workers would live on until they
            # notice (a worker about 2 s, an agent longer): a vanished VM takes them all at once
            roots = {process.pid for _, process in node.live_processes()}
            reaper.kill_all(lambda table: roots)
        self._started().remove_node(node, allow_graceful=False)  # Ray's books; reaps the raylet

    def shutdown(self) -> None:
        """Stop every node (gracefully, as Ray does), then let the reaper sweep what is left."""
        try:
            if self._cluster is not None:
                self._cluster.shutdown()
                self._cluster, self._nodes = None, {}
        finally:
            self._release_reaper()

    def _release_reaper(self) -> None:
        if self._reaper is not None:
            self._reaper.release()
            self._reaper = None


def drain_for_preemption(address: str, node_id: str, *, deadline_s: float, message: str) -> bool:
    """Tell the GCS at ``address`` the node will be preempted at ``deadline_s`` (Unix s)."""
    import ray._raylet
    from ray.core.generated import autoscaler_pb2

    client = ray._raylet.GcsClient(address=address)
    accepted, why = client.drain_node(
        node_id,
        autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
        message,
        int(deadline_s * 1000),
    )
    if not accepted:
        log.warning("drain of Ray node %s refused: %s", node_id, why)
    return bool(accepted)


def alive_nodes(address: str, *, label: str | None = None) -> dict[str, str]:
    """The nodes the GCS at ``address`` considers alive: id -> the value of ``label`` (or "")."""
    import ray._raylet
    from ray.core.generated import gcs_pb2

    client = ray._raylet.GcsClient(address=address)
    infos = client.get_all_node_info(timeout=10)
    return {
        node_id.hex(): (info.labels.get(label, "") if label else "")
        for node_id, info in infos.items()
        if info.state == gcs_pb2.GcsNodeInfo.ALIVE
    }


def preempted_nodes(address: str, *, label: str) -> dict[str, float]:
    """Nodes drained for a preemption (a watcher heard its cloud's notice): the value of
    ``label`` -> the reclaim deadline (Unix s). A drained node that is idle ends at once, so the
    dead are included, with their end time; the living need ``ray.init`` for their deadline."""
    import ray
    import ray._private.state
    import ray._raylet
    from ray.core.generated import gcs_pb2

    preempted = gcs_pb2.GcsNodeInfo.DESCRIPTOR.fields_by_name["death_info"].message_type
    drained = preempted.enum_types_by_name["Reason"].values_by_name["AUTOSCALER_DRAIN_PREEMPTED"]
    client = ray._raylet.GcsClient(address=address)
    infos = client.get_all_node_info(timeout=10)
    draining = ray._private.state.state.get_draining_nodes() if ray.is_initialized() else {}
    found: dict[str, float] = {}
    for node_id, info in infos.items():
        name = info.labels.get(label)
        if not name:
            continue
        if node_id.hex() in draining:  # 0: a drain without a deadline
            found[name] = draining[node_id.hex()] / 1000 or time.time()
        elif info.state == gcs_pb2.GcsNodeInfo.DEAD and info.death_info.reason == drained.number:
            found[name] = info.end_time_ms / 1000
    return found


DASHBOARD_PORT = 8265  # Ray's own default: the one people type


@contextlib.contextmanager
def dashboard_port_lock():
    """Held while a head picks its dashboard's port and starts on it: two jobs starting at once
    on this machine would otherwise both find Ray's default port free, and the second head
    would wait a minute for a dashboard that cannot bind, then fail."""
    path = Path(tempfile.gettempdir()) / f"geo-orchestrator-dashboard-{os.getuid()}.lock"
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # and the lock with it


def dashboard_port() -> int:
    """Ray's default dashboard port where it is free on this network's 127.0.0.1, else a free
    one (Ray gives up on a taken port: another job's dashboard)."""
    for port in (DASHBOARD_PORT, 0):
        try:
            with socket.create_server(("127.0.0.1", port)) as probe:
                return probe.getsockname()[1]
        except OSError:
            continue
    raise AssertionError("no free port on 127.0.0.1")


def start_head(
    session: str,
    cpus: int,
    *,
    node_ip: str | None = None,
    dashboard: bool = False,
):
    """A ``ray.cluster_utils.Cluster`` with its head node started, in Ray session ``session``
    (listening on ``node_ip`` where given: a namespace VM's overlay address); ``dashboard``:
    with Ray's dashboard and its HTTP API (``ray list actors``) on the head's 127.0.0.1."""
    import ray.cluster_utils

    # why: Ray 2.60 turns token auth on by default; a local test cluster has no tokens
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray's usage stats would try to reach the internet from every job; the nodes we boot say
    # --disable-usage-stats (bootstrap/node.sh), the local head says it here
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    return ray.cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": cpus,
            # the head (this machine, never preempted) also takes a job's driver when its
            # controller node is gone (provisioner.launch_controller)
            "resources": {"head": 1.0, "controller": 1.0},
            "object_store_memory": OBJECT_STORE_BYTES,
            "include_dashboard": dashboard,
            **({"dashboard_port": dashboard_port()} if dashboard else {}),
            "_system_config": dict(HEALTH_CHECK),
            "session_name": session,
            **QUIET_NODE,
            # Ray's autoscaler monitor: nothing here autoscales (the driver rents and frees the
            # nodes); the dashboard's cluster-status panel reads its report, so it runs with one
            "no_monitor": not dashboard,
            **({"node_ip_address": node_ip} if node_ip else {}),
        },
        # Ray's hooks: a SIGTERM handler (main thread only) and kernel fate-sharing, which
        # would kill raylets before the reaper sees their children (reaper.py)
        shutdown_at_exit=False,
    )


def session_name() -> str:
    """A Ray session name in Ray's own format: the time to the microsecond and our pid."""
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")
    return f"session_{stamp}_{os.getpid()}"
