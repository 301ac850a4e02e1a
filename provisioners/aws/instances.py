"""Instances the adapter launched, as AWS describes them: ``Node`` records, and the events that a
change between two looks at ``describe_instances`` / ``describe_spot_instance_requests`` means.

AWS gives a spot instance about two minutes of warning: its spot request's status turns
``marked-for-termination`` (a ``PreemptionNotice``), then the instance goes ``shutting-down`` /
``terminated`` with the state reason ``Server.SpotInstanceTermination`` (``NodeLost`` preempted).
Any other end we did not ask for is ``NodeLost`` failed.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from provisioners.aws.sdk import CLOUD, error_for
from provisioners.base import (
    Event,
    LaunchRequest,
    NodeLost,
    NodeReady,
    NodeState,
    PreemptionNotice,
    ProvisionerError,
)
from provisioners.tracker import Tracked

GANG_TAG = "geo-orchestrator:gang"
SPOT_MARKET = {
    "MarketType": "spot",
    "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
}

NOTICE_WINDOW_S = 120.0  # AWS's documented spot interruption notice
# spot request status codes: the instance is about to be interrupted
NOTICE_CODES = frozenset({"marked-for-termination", "marked-for-stop", "marked-for-hibernation"})
# spot request status codes: AWS interrupted the instance
INTERRUPTED_CODES = frozenset(
    {
        "instance-terminated-by-price",
        "instance-terminated-no-capacity",
        "instance-terminated-capacity-oversubscribed",
        "instance-terminated-launch-group-constraint",
        "instance-stopped-by-price",
        "instance-stopped-no-capacity",
        "instance-stopped-capacity-oversubscribed",
    }
)
# instance state reasons of a spot interruption
SPOT_REASONS = frozenset({"Server.SpotInstanceTermination", "Server.SpotInstanceShutdown"})
# instance states of a node that no longer works (we launch with terminate-on-interruption)
GONE_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})


def infra_of(region: str, instance: dict[str, Any]) -> str:
    zone = instance.get("Placement", {}).get("AvailabilityZone")
    return "/".join(p for p in ("aws", region, zone) if p)


def launched_at_s(instance: dict[str, Any]) -> float:
    launched = instance.get("LaunchTime")
    return launched.timestamp() if hasattr(launched, "timestamp") else time.time()


def transition(
    tracked: Tracked, instance: dict[str, Any] | None, spot_status: str | None, *, now_s: float
) -> list[Event]:
    """Update ``tracked`` from a fresh look at its instance (None: AWS no longer lists it) and its
    spot request's status code; return the events that change means, notice before loss. Run it
    through ``NodeTracker.update`` so that the change happens under the tracker's lock."""
    events: list[Event] = []
    node = tracked.node
    if spot_status in NOTICE_CODES and not tracked.notice_sent:
        tracked.notice_sent = True
        node = replace(node, state=NodeState.PREEMPTING)
        events.append(
            PreemptionNotice(
                node_id=node.node_id, infra=node.infra, deadline_s=now_s + NOTICE_WINDOW_S
            )
        )
    state = instance["State"]["Name"] if instance else "terminated"
    if instance and instance.get("PrivateIpAddress") and node.address is None:
        node = replace(node, address=instance["PrivateIpAddress"])
    if state == "running" and node.state == NodeState.PENDING:
        node = replace(node, state=NodeState.RUNNING)
        events.append(NodeReady(node=node))
    elif state in GONE_STATES:
        reason = "preempted" if _interrupted(tracked, instance, spot_status) else "failed"
        node = replace(node, state=NodeState.LOST)
        events.append(NodeLost(node_id=node.node_id, infra=node.infra, reason=reason))
    tracked.node = node
    return events


def _interrupted(
    tracked: Tracked, instance: dict[str, Any] | None, spot_status: str | None
) -> bool:
    """Did AWS take this spot node back (rather than it failing)?"""
    if not tracked.node.spot:
        return False
    reason = (instance or {}).get("StateReason", {}).get("Code", "")
    return (
        reason in SPOT_REASONS
        or spot_status in INTERRUPTED_CODES
        or spot_status in NOTICE_CODES
        or tracked.notice_sent
    )


def run_params(
    request: LaunchRequest,
    zone: str | None,
    image: str,
    *,
    count: int,
    user_data: str | None,
) -> dict[str, Any]:
    """``run_instances``'s parameters for ``count`` nodes of ``request``."""
    tags = [{"Key": GANG_TAG, "Value": request.gang}, {"Key": "Name", "Value": request.gang}]
    tags += [{"Key": k, "Value": v} for k, v in request.labels]
    params: dict[str, Any] = {
        "ImageId": image,
        "InstanceType": request.instance_type,
        "MinCount": count,
        "MaxCount": count,
        "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
        # a VM that powers itself off (its bootstrap failed, its controller is gone) is gone,
        # not a stopped instance that keeps its disk and its cost
        "InstanceInitiatedShutdownBehavior": "terminate",
        "MetadataOptions": {"HttpTokens": "required"},  # IMDSv2 only, as the watcher asks
    }
    if user_data is not None:
        params["UserData"] = user_data  # boto3 base64-encodes it
    if zone:
        params["Placement"] = {"AvailabilityZone": zone}
    if request.spot:
        params["InstanceMarketOptions"] = SPOT_MARKET
    if request.identity is not None:
        params["IamInstanceProfile"] = {"Name": request.identity}
    return params


def location_of(request: LaunchRequest) -> tuple[str, str | None]:
    """(region, zone or None) from ``aws/<region>[/<zone>]``."""
    parts = request.infra.split("/")
    if parts[0] != CLOUD or len(parts) > 3:
        raise ValueError(f"infra {request.infra!r} is not aws/<region>[/<zone>]")
    return parts[1], (parts[2] if len(parts) == 3 else None)


def start_failure(instance: dict[str, Any], request: LaunchRequest) -> ProvisionerError:
    """The typed error for an instance of the gang that ended before running."""
    reason = instance.get("StateReason", {})
    code = str(reason.get("Code", "")).removeprefix("Server.").removeprefix("Client.")
    message = (
        f"{instance['InstanceId']} ({request.instance_type} in {request.infra}) ended before "
        f"running: {reason.get('Message') or instance['State']['Name']}"
    )
    if code == "SpotInstanceTermination":  # spot capacity left while we were starting
        code = "InsufficientInstanceCapacity"
    return error_for(code or "InstanceEnded", message, call="ec2.describe_instances")
