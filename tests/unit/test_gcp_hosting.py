"""What a job's controller needs of GCP (provisioners/gcp/hosting.py) and what the emulated GCE
metadata hands a VM with a service account (provisioners/emulated/imds.py), on the GCP fake."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("google.cloud.compute_v1")

from provisioners.emulated.gcp_api import FakeGcp  # noqa: E402
from provisioners.emulated.imds import GceMetadata  # noqa: E402
from provisioners.gcp import GcpProvisioner, hosting  # noqa: E402


@pytest.fixture
def fake():
    api = FakeGcp(token="tok").start()
    yield api
    api.stop()


def test_the_jobs_bucket_is_made_once_private_and_in_the_region(fake):
    adapter = GcpProvisioner.at_endpoint(fake.url, token="tok", project="test-project")
    url = adapter.job_bucket("us-west1")
    assert url == "gs://geo-test-project-us-west1" == adapter.job_bucket("us-west1")
    (made,) = fake.storage.buckets.values()
    assert made["location"] == "us-west1"
    assert made["iamConfiguration"]["publicAccessPrevention"] == "enforced"
    assert made["iamConfiguration"]["uniformBucketLevelAccess"] == {"enabled": True}
    assert adapter.identities(url) == hosting.IDENTITIES


def test_the_jobs_buckets_are_found_by_region_and_no_other_projects(fake):
    adapter = GcpProvisioner.at_endpoint(fake.url, token="tok", project="test-project")
    adapter.job_bucket("us-west1"), adapter.job_bucket("us-central1")
    fake.storage.buckets["geo-test-project2-us-west1"] = {"name": "geo-test-project2-us-west1"}
    assert adapter.job_buckets() == {
        "us-central1": "gs://geo-test-project-us-central1",
        "us-west1": "gs://geo-test-project-us-west1",
    }


def test_bucket_names_follow_gcs_rules():
    assert hosting.bucket_name("example.com:My_Proj", "europe-west4") == (
        "geo-example-com-my-proj-europe-west4"
    )
    assert len(hosting.bucket_name("p" * 30, "northamerica-northeast1")) <= 63


def _launch_controller(fake, **changes) -> None:
    """One CPU VM (a job's controller) in us-central1, as hosts.py launches it."""
    from provisioners.base import LaunchRequest

    adapter = GcpProvisioner.at_endpoint(
        fake.url, token="tok", project="test-project", regions=("us-central1",)
    )
    fake.stagings_before_running = 0
    fields = dict(
        gang="ctl-j", infra="gcp/us-central1", instance_type="e2-standard-2", gpu="", count=1,
        spot=False, gpus_per_node=0, timeout_s=30,
    )  # fmt: skip
    adapter.launch(LaunchRequest(**(fields | changes)))


def test_a_cpu_controller_launches_with_the_asked_service_account(fake):
    _launch_controller(fake, identity="default")
    (sent,) = fake.inserted
    assert sent["zone"].startswith("us-central1-")
    assert sent["serviceAccounts"][0]["email"] == "default"
    assert "guestAccelerators" not in sent
    assert not any(i["key"] == "install-nvidia-driver" for i in sent["metadata"].get("items", []))


def test_the_fake_refuses_a_malformed_service_account(fake):
    from provisioners.emulated.gcp_api import _invalid_accounts

    assert _invalid_accounts({"serviceAccounts": [{"email": "me", "scopes": ["x"]}]})
    assert _invalid_accounts({"serviceAccounts": [{"email": "default"}]})
    assert _invalid_accounts({"serviceAccounts": [{"email": "default", "scopes": ["x"]}]}) is None


def test_gce_metadata_hands_its_accounts_token_only_to_a_vm_with_one():
    with_account = GceMetadata(
        instance_id="i", name="i", zone="us-central1-a", project_id="test-project",
        external_ip="198.51.100.7", service_account="sa@p.iam.gserviceaccount.com", token="tok",
    )  # fmt: skip
    base = "/computeMetadata/v1/instance/"
    token = json.loads(with_account.answer(base + "service-accounts/default/token"))
    assert token["access_token"] == "tok" and token["token_type"] == "Bearer"
    described = json.loads(with_account.answer(base + "service-accounts/default/?recursive=true"))
    assert described["email"] == "sa@p.iam.gserviceaccount.com"
    assert with_account.answer(base + "network-interfaces/0/access-configs/0/external-ip") == (
        "198.51.100.7"
    )
    assert with_account.answer("/computeMetadata/v1/project/project-id") == "test-project"
    without = GceMetadata(instance_id="i", name="i", zone="us-central1-a")
    assert without.answer(base + "service-accounts/default/token") is None


def test_a_vm_found_by_label_is_relabelled_keeping_its_other_labels(fake):
    _launch_controller(fake, labels=(("geo-job", "j"), ("geo-expires", "1")))
    other = GcpProvisioner.at_endpoint(fake.url, token="tok", project="test-project")
    (vm,) = other.labelled("geo-job")  # an adapter that did not launch it
    other.relabel_labelled([vm], {"geo-expires": "99"})
    (_, instance), *_ = fake.snapshot()
    assert instance["labels"]["geo-expires"] == "99" and instance["labels"]["geo-job"] == "j"


def test_the_jobs_firewall_rules_are_deleted_and_no_others(fake):
    from provisioners.base import Firewall

    adapter = GcpProvisioner.at_endpoint(fake.url, token="tok", project="test-project")
    for job, role in (("j", "nodes"), ("j", "controller"), ("k", "nodes")):
        adapter.open_overlay(Firewall(job=job, port=51820, sources=("1.2.3.4",), role=role))
    assert adapter.drop_firewalls("j") == (["geo-j", "geo-j-controller"], [])
    assert set(fake.firewalls) == {"geo-k"}
    assert adapter.drop_firewalls("j") == ([], [])
