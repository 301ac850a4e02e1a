"""What a job's controller needs of AWS besides VMs: a private bucket and two instance profiles.

- **The bucket** ``geo-orchestrator-<account>-<region>``: the job's state lives under
  ``jobs/<job>/`` (the laptop writes the job's launch there, the controller its state, its nodes
  their checkpoints), so that a new controller finds it and ``status`` reads it from anywhere with
  the account's credentials. It is made private (every public access blocked) the first time.
- **The identities**: the instance profiles ``geo-orchestrator-controller`` (EC2 launches and
  tags, security groups, the AMI parameter, prices, the bucket, and passing the node role on) and
  ``geo-orchestrator-node`` (the bucket's ``jobs/`` only: checkpoints). A VM gets short-lived keys
  for its role from its instance metadata; no key of the user's ever leaves the laptop.
- **Presigned URLs**: the controller VM installs our package from the bucket before it has any
  SDK, through a URL that needs no credentials and expires.

Roles, profiles and the bucket are made when missing and left in place (they cost nothing); the
policies are rewritten each time so that a newer version's needs reach an older account.
"""

from __future__ import annotations

import json
from typing import Any

from provisioners.aws.sdk import CLOUD, call, error_code
from provisioners.base import CloudCallError, Identities, ProvisionerError

BUCKET = "geo-orchestrator-{account}-{region}"
CONTROLLER_ROLE = "geo-orchestrator-controller"
NODE_ROLE = "geo-orchestrator-node"
JOBS_PREFIX = "jobs/"

_TRUST = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Service": "ec2.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
    ],
}
# what the controller's driver calls (provisioners/aws/provisioner.py, firewall.py)
_CONTROLLER_ACTIONS = [
    "ec2:RunInstances",
    "ec2:TerminateInstances",
    "ec2:CreateTags",
    "ec2:Describe*",
    "ec2:GetSpotPlacementScores",
    "ec2:CreateSecurityGroup",
    "ec2:AuthorizeSecurityGroupIngress",
    "ec2:RevokeSecurityGroupIngress",
    "ec2:DeleteSecurityGroup",
    "ssm:GetParameter",
    "pricing:GetProducts",
]


def bucket_name(account: str, region: str) -> str:
    return BUCKET.format(account=account, region=region)


def account_of(sts: Any) -> str:
    return call(sts, "get_caller_identity")["Account"]


def job_buckets(s3: Any, account: str) -> dict[str, str]:
    """The account's job buckets: region -> ``s3://`` URL."""
    stem = BUCKET.format(account=account, region="")
    listed = call(s3, "list_buckets").get("Buckets", [])
    return {
        b["Name"][len(stem) :]: f"s3://{b['Name']}" for b in listed if b["Name"].startswith(stem)
    }


def ensure_bucket(s3: Any, name: str, region: str) -> str:
    """The bucket ``name`` in ``region``, private; made when missing. Its ``s3://`` URL."""
    try:
        call(s3, "head_bucket", Bucket=name)
        return f"s3://{name}"
    except ProvisionerError as error:
        if error_code(error) not in ("404", "NoSuchBucket"):
            raise
    params: dict[str, Any] = {"Bucket": name}
    if region != "us-east-1":  # us-east-1 takes no location constraint
        params["CreateBucketConfiguration"] = {"LocationConstraint": region}
    call(s3, "create_bucket", **params)
    call(
        s3,
        "put_public_access_block",
        Bucket=name,
        PublicAccessBlockConfiguration={
            "BlockPublicAcls": True,
            "IgnorePublicAcls": True,
            "BlockPublicPolicy": True,
            "RestrictPublicBuckets": True,
        },
    )
    return f"s3://{name}"


def ensure_identities(iam: Any, bucket_url: str) -> Identities:
    """The controller's and the nodes' instance profiles, their policies as this version needs."""
    bucket = _bucket_of(bucket_url)
    objects = f"arn:aws:s3:::{bucket}/{JOBS_PREFIX}*"
    listing = {
        "Effect": "Allow",
        "Action": "s3:ListBucket",
        "Resource": f"arn:aws:s3:::{bucket}",
    }
    node_arn = _ensure_role(
        iam,
        NODE_ROLE,
        [listing, {"Effect": "Allow", "Action": _OBJECT_ACTIONS, "Resource": objects}],
    )
    _ensure_role(
        iam,
        CONTROLLER_ROLE,
        [
            {"Effect": "Allow", "Action": _CONTROLLER_ACTIONS, "Resource": "*"},
            listing,
            {"Effect": "Allow", "Action": _OBJECT_ACTIONS, "Resource": objects},
            {"Effect": "Allow", "Action": "iam:PassRole", "Resource": node_arn},
        ],
    )
    return Identities(controller=CONTROLLER_ROLE, node=NODE_ROLE)


_OBJECT_ACTIONS = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]


def _ensure_role(iam: Any, name: str, statements: list[dict]) -> str:
    """Role ``name`` (EC2 may assume it) with ``statements`` as its policy, and an instance
    profile of the same name holding it; the role's ARN."""
    try:
        arn = call(iam, "get_role", RoleName=name)["Role"]["Arn"]
    except ProvisionerError as error:
        if error_code(error) != "NoSuchEntity":
            raise
        arn = call(
            iam,
            "create_role",
            RoleName=name,
            AssumeRolePolicyDocument=json.dumps(_TRUST),
            Description="geo-orchestrator: what a job's VMs may do",
            Tags=[{"Key": "geo-orchestrator", "Value": "identity"}],
        )["Role"]["Arn"]
    call(
        iam,
        "put_role_policy",
        RoleName=name,
        PolicyName=name,
        PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": statements}),
    )
    try:
        profile = call(iam, "get_instance_profile", InstanceProfileName=name)["InstanceProfile"]
    except ProvisionerError as error:
        if error_code(error) != "NoSuchEntity":
            raise
        profile = call(iam, "create_instance_profile", InstanceProfileName=name)["InstanceProfile"]
    if not any(r["RoleName"] == name for r in profile.get("Roles", [])):
        call(iam, "add_role_to_instance_profile", InstanceProfileName=name, RoleName=name)
    return arn


def presign(s3: Any, url: str, *, expires_s: float) -> str:
    bucket, key = _bucket_of(url), _key_of(url)
    if not key:
        raise CloudCallError(
            f"{url} names no object",
            cloud=CLOUD,
            call="s3.generate_presigned_url",
            fix="name an object: s3://bucket/key",
        )
    # at most 7 days (SigV4's limit); keys of a role expire sooner, and the URL with them
    seconds = max(1, min(int(expires_s), 7 * 24 * 3600))
    return s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=seconds
    )


def _bucket_of(url: str) -> str:
    if not url.startswith("s3://"):
        raise ValueError(f"not an s3:// URL: {url}")
    return url[len("s3://") :].split("/", 1)[0]


def _key_of(url: str) -> str:
    rest = url[len("s3://") :].split("/", 1)
    return rest[1] if len(rest) > 1 else ""
