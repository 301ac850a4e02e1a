"""A job's security group: the overlay's UDP port from the job's own addresses, nothing else.

Each region the job launches in gets one group, ``geo-<job>`` (its controller another,
``geo-<job>-controller``), in its default VPC, tagged with the
job (so ``down`` and a look at the console find it). Its inbound rules are exactly the overlay's
port from each source address as a /32 (the controller's and every node's public address); AWS
keeps replies to what an instance opened (security groups are stateful) and all outbound traffic.
``sync`` makes the rules what the firewall says: it authorizes what is missing and revokes what
is no longer there, so that a node that left is not admitted any more. ``drop`` deletes a job's
groups once its instances are gone (``down``).
"""

from __future__ import annotations

from typing import Any

from provisioners.aws.sdk import call, error_code
from provisioners.base import Firewall, ProvisionerError

JOB_TAG = "geo-job"


def ensure_group(ec2: Any, firewall: Firewall) -> str:
    """The job's group in this client's region (made when missing); its id."""
    name = firewall.name
    found = call(
        ec2, "describe_security_groups", Filters=[{"Name": "group-name", "Values": [name]}]
    )["SecurityGroups"]
    if found:
        return found[0]["GroupId"]
    made = call(
        ec2,
        "create_security_group",
        GroupName=name,
        Description=f"geo-orchestrator job {firewall.job} ({firewall.role}): its overlay only",
        TagSpecifications=[
            {"ResourceType": "security-group", "Tags": [{"Key": JOB_TAG, "Value": firewall.job}]}
        ],
    )
    return made["GroupId"]


def sync(ec2: Any, group_id: str, firewall: Firewall) -> None:
    """Make the group's inbound rules exactly the overlay's port from ``firewall.sources``."""
    group = call(ec2, "describe_security_groups", GroupIds=[group_id])["SecurityGroups"][0]
    have = {
        (rule.get("IpProtocol"), rule.get("FromPort"), rule.get("ToPort"), r["CidrIp"])
        for rule in group.get("IpPermissions", [])
        for r in rule.get("IpRanges", [])
    }
    want = {("udp", firewall.port, firewall.port, cidr) for cidr in firewall.cidrs()}
    extra = have - want
    if want - have:
        call(ec2, "authorize_security_group_ingress", GroupId=group_id,
             IpPermissions=_permissions(want - have))  # fmt: skip
    if extra:
        call(ec2, "revoke_security_group_ingress", GroupId=group_id,
             IpPermissions=_permissions(extra))  # fmt: skip


def _permissions(rules: set[tuple]) -> list[dict]:
    return [
        {
            "IpProtocol": protocol,
            "FromPort": low,
            "ToPort": high,
            "IpRanges": [{"CidrIp": cidr, "Description": "a node of the job"}],
        }
        for protocol, low, high, cidr in sorted(rules, key=str)
    ]


def drop(ec2: Any, job: str) -> tuple[list[str], list[str]]:
    """Delete the job's groups in this client's region (found by their tag); (deleted, still
    used by instances that are shutting down)."""
    found = call(
        ec2, "describe_security_groups", Filters=[{"Name": f"tag:{JOB_TAG}", "Values": [job]}]
    )["SecurityGroups"]
    dropped, in_use = [], []
    for group in found:
        try:
            call(ec2, "delete_security_group", GroupId=group["GroupId"])
            dropped.append(group["GroupName"])
        except ProvisionerError as error:
            if error_code(error) != "DependencyViolation":
                raise
            in_use.append(group["GroupName"])
    return dropped, in_use
