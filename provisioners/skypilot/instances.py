"""The cluster the adapter asks SkyPilot for (the ``sky.Task`` of one gang: ``count`` nodes, each
joining our Ray), and how it reads that cluster's nodes back from a ``sky.status`` record.

With boot scripts (the job's bootstrap, provisioners/bootstrap/), node ``$SKYPILOT_NODE_RANK``
runs its own script: it installs, joins the job's WireGuard overlay and starts a Ray node that
joins the job's one cluster, whose head is on the job's controller (not a Ray head per gang).
Without them (the adapter used on its own), the gang is a Ray cluster of its own: rank 0 is the
head, the others join it at the first address in ``SKYPILOT_NODE_IPS``. Either way SkyPilot's own
Ray (port 6380, which drives its jobs) is left alone, and every node carries the labels and custom
resources the local simulated cloud uses (``geo-cloud``..., ``infra:<...>``, ``gpu:<...>``), so
the runtime places work the same way on both. SkyPilot reports clusters, not single VMs: every
node of a gang has its cluster's state.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Mapping
from typing import Any

from provisioners.base import LaunchRequest, Node, NodeState
from provisioners.bootstrap.script import skypilot_run

SKYPILOT_RAY_PORT = 6380  # SkyPilot's own Ray: never ours
_NOT_IN_NAME = re.compile(r"[^a-z0-9-]+")


def cluster_name(gang: str, *, prefix: str) -> str:
    """A SkyPilot cluster name for ``gang``: lower case letters, digits and dashes, starting with a
    letter (SkyPilot's and the clouds' rule for instance names)."""
    body = _NOT_IN_NAME.sub("-", gang.lower()).strip("-") or "gang"
    return f"{prefix}{body}"[:60].rstrip("-")


def node_labels(request: LaunchRequest, gang: str) -> dict[str, str]:
    """The Ray labels of every node of the gang (label values may not contain ``/``)."""
    parts = request.infra.split("/")
    labels = {"geo-cloud": parts[0], "geo-region": parts[1], "geo-gpu": request.gpu}
    if len(parts) > 2:
        labels["geo-zone"] = parts[2]
    labels["geo-gang"] = gang.replace("/", "-")
    return labels


def ray_run_script(request: LaunchRequest, *, gpus_per_node: int, ray_port: int) -> str:
    """The shell run on every node: start (or join) our Ray with the gang's labels and resources."""
    resources = json.dumps(
        {f"infra:{request.infra}": gpus_per_node, f"gpu:{request.gpu}": gpus_per_node}
    )
    labels = ",".join(f"{k}={v}" for k, v in node_labels(request, request.gang).items())
    common = (
        f"--disable-usage-stats --resources={shlex.quote(resources)} --labels={shlex.quote(labels)}"
    )
    return "\n".join(
        [
            "set -e",
            'HEAD_IP=$(echo "$SKYPILOT_NODE_IPS" | head -n1)',
            'if [ "$SKYPILOT_NODE_RANK" = "0" ]; then',
            f"  ray start --head --port={ray_port} {common}",
            "else",
            f'  ray start --address="$HEAD_IP:{ray_port}" {common}',
            "fi",
        ]
    )


def build_task(
    sdk: Any,
    request: LaunchRequest,
    *,
    cluster: str,
    gpus_per_node: int,
    setup: str | None,
    ray_port: int,
) -> Any:
    """A ``sky.Task`` of ``request.count`` nodes pinned to ``request.infra`` (cloud/region[/zone]),
    spot or on-demand, with the instance type and GPUs asked for."""
    resources = sdk.Resources(
        infra=request.infra,
        instance_type=request.instance_type,
        accelerators={request.gpu: gpus_per_node},
        use_spot=request.spot,
        labels=dict(request.labels) or None,
    )
    if request.boot_scripts:
        run = skypilot_run(request.boot_scripts)
    else:
        run = ray_run_script(request, gpus_per_node=gpus_per_node, ray_port=ray_port)
    task = sdk.Task(name=cluster, setup=setup, run=run, num_nodes=request.count)
    task.set_resources(resources)
    return task


# ---- reading the cluster back ---------------------------------------------------------------------


def record_field(record: Any, name: str) -> Any:
    """A field of a ``sky.status`` record (a dict-like pydantic model, or a dict in tests)."""
    return record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)


def cluster_status(record: Any) -> str | None:
    """UP, INIT or STOPPED as the record says (upper case); ``None`` for no record (gone)."""
    if record is None:
        return None
    status = record_field(record, "status")
    return str(getattr(status, "value", status)).upper()


def cluster_nodes(
    record: Any, request: LaunchRequest, *, cluster: str, gpus_per_node: int, state: NodeState
) -> list[Node]:
    """The gang's nodes as the status record shows them; rank 0 is SkyPilot's head node."""
    handle = record_field(record, "handle")
    launched = getattr(handle, "launched_resources", None)
    parts = request.infra.split("/") + [None]
    region = getattr(launched, "region", None) or parts[1]
    zone = getattr(launched, "zone", None) or parts[2]
    infra = "/".join(p for p in (request.cloud, region, zone) if p)
    ips = getattr(handle, "stable_internal_external_ips", None) or []
    launched_at_s = float(record_field(record, "launched_at") or time.time())
    return [
        Node(
            node_id=f"{cluster}-{rank}",
            gang=request.gang,
            infra=infra,
            instance_type=request.instance_type,
            gpu=request.gpu,
            gpus=gpus_per_node,
            spot=request.spot,
            state=state,
            address=(ips[rank][1] or ips[rank][0]) if rank < len(ips) else None,
            launched_at_s=launched_at_s,
            labels=request.labels,
        )
        for rank in range(request.count)
    ]
