"""A job's firewall rule: the overlay's UDP port from the job's own addresses, to its VMs only.

GCP's VPC denies all ingress that no rule allows, so a node on another cloud could not even reach
the WireGuard port without one. Each job has one ingress rule, ``geo-<job>``, in the adapter's
network: it targets the VMs carrying the network tag of the same name (the adapter tags every
node of the job with it) and allows UDP on the overlay's port from each source address as a /32,
nothing else. ``open_overlay`` makes it say exactly that, inserting it the first time and
patching its source ranges after (a node that left is not admitted any more). Replies to what a
VM opened pass (GCP firewalls are stateful).
"""

from __future__ import annotations

import re
from typing import Any

from provisioners.base import Firewall
from provisioners.gcp import sdk


def rule_name(name: str) -> str:
    """The rule's name from the firewall's (``Firewall.name``), also the network tag (lowercase
    letters, digits, '-'; a letter first)."""
    return re.sub(r"[^a-z0-9-]", "-", name.lower())[:63].rstrip("-")


def open_overlay(api: Any, *, network: str, firewall: Firewall) -> None:
    compute = sdk.compute_module()
    name = rule_name(firewall.name)
    rule = compute.Firewall(
        name=name,
        network=network,
        direction="INGRESS",
        priority=1000,
        description=f"geo-orchestrator job {firewall.job} ({firewall.role}): its overlay "
        "(WireGuard) only",
        target_tags=[name],
        source_ranges=list(firewall.cidrs()),
        allowed=[compute.Allowed(I_p_protocol="udp", ports=[str(firewall.port)])],
    )
    client = api.client("FirewallsClient")
    wanted = compute.ListFirewallsRequest(project=api.project, filter=f'name = "{name}"')
    found = api.call("firewalls.list", "global", lambda: list(client.list(request=wanted)))
    if found:
        api.call(
            "firewalls.patch",
            "global",
            lambda: client.patch_unary(project=api.project, firewall=name, firewall_resource=rule),
        )
    else:
        api.call(
            "firewalls.insert",
            "global",
            lambda: client.insert_unary(project=api.project, firewall_resource=rule),
        )


def drop(api: Any, *, job: str) -> list[str]:
    """Delete the job's rules (its nodes' and its controller's); the names deleted. A GCP rule is
    not attached to VMs: it goes at once."""
    compute = sdk.compute_module()
    client = api.client("FirewallsClient")
    dropped = []
    for role in ("nodes", "controller"):
        name = rule_name(Firewall(job=job, port=0, sources=(), role=role).name)
        wanted = compute.ListFirewallsRequest(project=api.project, filter=f'name = "{name}"')
        if not api.call("firewalls.list", "global", lambda w=wanted: list(client.list(request=w))):
            continue
        api.call(
            "firewalls.delete",
            "global",
            lambda n=name: client.delete_unary(project=api.project, firewall=n),
        )
        dropped.append(name)
    return dropped
