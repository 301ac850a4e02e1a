"""``status --all`` and ``down JOB`` over AWS (moto): every VM with a ``geo-job`` label is listed,
whoever launched it, with its lease and whether it has passed; ``down`` terminates the job's VMs
in every region and no other job's; clouds without credentials are named and skipped."""

from __future__ import annotations

import json
import time

import pytest

from orchestrator.cli import main

REGIONS = ("us-east-1", "eu-west-1")
AMI = "ami-12c6146b"  # one of moto's images


@pytest.fixture
def ec2(monkeypatch, tmp_path):
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AZURE_SUBSCRIPTION_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFLEETFLEETFLEET0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fleet-test-secret")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-key.json"))
    from provisioners import registry
    from provisioners.aws import AwsProvisioner

    real = registry.create

    def create(name, **options):  # the sweep's adapters, AWS limited to two regions
        if name == "aws":
            return AwsProvisioner(regions=REGIONS)
        return real(name, **options)

    monkeypatch.setattr(registry, "create", create)
    with moto.mock_aws():
        yield lambda region: boto3.client("ec2", region_name=region)


def _launch(client, job: str | None, expires_s: float, count: int = 1) -> list[str]:
    tags = [{"Key": "Name", "Value": "x"}]
    if job is not None:
        tags += [
            {"Key": "geo-job", "Value": job},
            {"Key": "geo-expires", "Value": f"{expires_s:.0f}"},
        ]
    reply = client.run_instances(
        ImageId=AMI,
        InstanceType="g4dn.xlarge",
        MinCount=count,
        MaxCount=count,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    return [i["InstanceId"] for i in reply["Instances"]]


def test_status_all_lists_every_labelled_vm_and_flags_expired_leases(ec2, capsys):
    now = time.time()
    alive = _launch(ec2("us-east-1"), "job-a", now + 3600, count=2)
    leaked = _launch(ec2("eu-west-1"), "job-b", now - 60)
    _launch(ec2("us-east-1"), None, 0)  # not ours: no geo-job label
    gone = _launch(ec2("us-east-1"), "job-a", now + 3600)
    ec2("us-east-1").terminate_instances(InstanceIds=gone)

    assert main(["status", "--all", "--json"]) == 0
    out, err = capsys.readouterr()
    document = json.loads(out)
    rows = {r["vm"]: r for r in document["vms"]}
    assert set(rows) == {*alive, *leaked}
    assert rows[leaked[0]]["expired"] and rows[leaked[0]]["job"] == "job-b"
    assert rows[leaked[0]]["place"].startswith("aws/eu-west-1/eu-west-1")
    assert not rows[alive[0]]["expired"] and rows[alive[0]]["type"] == "g4dn.xlarge"
    assert set(document["clouds_not_asked"]) == {"gcp", "azure"}  # no credentials there

    assert main(["status", "--all"]) == 0
    out, err = capsys.readouterr()
    assert "1 VM(s) past their lease" in out and "down JOB" in out
    assert "gcp: not asked" in err and "fleet-test-secret" not in out + err


def test_down_terminates_the_jobs_vms_in_every_region_and_nothing_else(ec2, capsys, tmp_path):
    now = time.time()
    mine = _launch(ec2("us-east-1"), "job-a", now + 3600) + _launch(ec2("eu-west-1"), "job-a", now)
    other = _launch(ec2("us-east-1"), "job-b", now + 3600)
    tag = [{"ResourceType": "security-group", "Tags": [{"Key": "geo-job", "Value": "job-a"}]}]
    ec2("us-east-1").create_security_group(
        GroupName="geo-job-a", Description="the job's", TagSpecifications=tag
    )
    assert main(["down", "job-a", "--jobs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert all(f"terminated {i}" in out for i in mine)
    assert "deleted firewall aws us-east-1/geo-job-a" in out  # the job's group goes too
    groups = ec2("us-east-1").describe_security_groups()["SecurityGroups"]
    assert "geo-job-a" not in {g["GroupName"] for g in groups}

    def state(region, ids):
        reply = ec2(region).describe_instances(InstanceIds=ids)
        return {
            i["InstanceId"]: i["State"]["Name"]
            for r in reply["Reservations"]
            for i in r["Instances"]
        }

    assert set(state("us-east-1", mine[:1]).values()) == {"terminated"}
    assert set(state("eu-west-1", mine[1:]).values()) == {"terminated"}
    assert set(state("us-east-1", other).values()) == {"running"}
    assert main(["down", "job-a", "--jobs-dir", str(tmp_path)]) == 0
    assert "no VM or firewall of job job-a" in capsys.readouterr().out
    assert main(["down", "../etc", "--jobs-dir", str(tmp_path)]) == 2


def test_a_jobs_label_matches_as_each_cloud_stores_it():
    from provisioners.bootstrap.joined import of_job

    def _same_job(label: str, job: str) -> bool:
        return of_job({"geo-job": label} if label else {}, job)

    assert _same_job("Job.A", "Job.A")  # AWS and Azure keep the tag as written
    assert _same_job("job-a", "Job.A")  # GCP lowercases, and '.' becomes '-'
    assert not _same_job("job-b", "Job.A") and not _same_job("", "job")
