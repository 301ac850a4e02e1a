"""The GCP adapter against a local fake of the Compute and Billing Catalog REST APIs.

The real google-cloud-compute client (REST transport) is pointed at ``gcp_fake`` on 127.0.0.1 with
a fake bearer token; nothing leaves the machine. Covered: offers from zones / accelerator types /
machine types priced from Billing Catalog SKUs (or a price table), the SPOT insert body, capacity
and quota errors with all-or-nothing cleanup, NodeReady and preemption (from a zone operation)
events, missing credentials and project, scrubbing of the token, and the shared contract.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("google.cloud.compute_v1")

from google.oauth2.credentials import Credentials  # noqa: E402

from provisioners.base import (  # noqa: E402
    CapacityError,
    CloudCallError,
    CredentialsMissing,
    Feature,
    LaunchRequest,
    NodeLost,
    NodeReady,
    NodeState,
    QuotaError,
)
from provisioners.emulated.gcp_api import PROJECT, FakeGcp  # noqa: E402
from provisioners.gcp import GcpProvisioner  # noqa: E402

from .contract import Harness, run_contract  # noqa: E402

TOKEN = "ya29.fake-planted-token-Qz81pW7"  # a planted secret: must never show up anywhere


@pytest.fixture
def fake():
    server = FakeGcp(token=TOKEN, capacity={"us-central1-b": 0}).start()
    yield server
    server.stop()


def make(fake: FakeGcp, *, token: str = TOKEN, **options) -> GcpProvisioner:
    return GcpProvisioner(
        project=PROJECT,
        credentials=Credentials(token=token),
        client_options={"api_endpoint": fake.url},
        billing_endpoint=fake.url,
        poll_interval_s=0.01,
        **options,
    )


def request(zone: str = "us-central1-a", *, count: int = 2, **fields) -> LaunchRequest:
    values = dict(
        gang="train-1",
        infra=f"gcp/us-central1/{zone}",
        instance_type="n1-standard-16",
        gpu="T4",
        count=count,
    )
    values.update(fields)
    return LaunchRequest(**values)


def test_offers_come_from_zones_accelerators_and_machine_types(fake):
    offers = make(fake).offers()
    shapes = {(o.zone, o.instance_type, o.gpu, o.gpus_per_node) for o in offers}
    assert ("us-central1-a", "a2-highgpu-1g", "A100", 1) in shapes  # GPUs inside the type
    assert {
        ("us-central1-a", t, "T4", n)
        for t, n in (("n1-standard-8", 1), ("n1-standard-16", 2), ("n1-standard-32", 4))
    } <= shapes
    assert ("us-west1-b", "n1-standard-32", "V100", 4) in shapes
    assert not any(o.zone == "us-central1-f" for o in offers), "a DOWN zone has no offers"
    assert not any(o.gpu == "L4" for o in offers), "L4 has no price in the fake: left out"
    assert all(o.available_count is None and o.preemption_rate_per_hour is None for o in offers)
    t4 = next(o for o in offers if o.zone == "us-central1-a" and o.instance_type == "n1-standard-8")
    # GPU + 8 vCPUs + 30 GiB at the SKUs' prices (the Workstation and commitment SKUs ignored)
    assert t4.on_demand_usd_per_hour == pytest.approx(0.35 + 8 * 0.031611 + 30 * 0.004237)
    assert t4.spot_usd_per_hour == pytest.approx(0.14 + 8 * 0.0066 + 30 * 0.0009)
    assert (t4.vcpus, t4.memory_gib, t4.region) == (8, 30, "us-central1")
    a100 = next(o for o in offers if o.gpu == "A100")
    assert a100.spot_usd_per_hour is None and a100.on_demand_usd_per_hour is not None
    only = make(fake).offers(gpus=["V100"], regions=["us-west1"])
    assert only and all(o.gpu == "V100" and o.region == "us-west1" for o in only)


def test_a_price_table_replaces_the_billing_catalog(fake):
    table = {("T4", "us-central1"): (0.35, 0.11)}
    offers = make(fake, price_table=table, zones=["us-central1-a"]).offers()
    assert {o.gpu for o in offers} == {"T4"}, "GPUs without a price in the table are left out"
    two = next(o for o in offers if o.gpus_per_node == 2)
    assert (two.on_demand_usd_per_hour, two.spot_usd_per_hour) == (0.7, 0.22)
    assert not any(r.startswith("GET /v1/services") for r in fake.requests)


def test_spot_insert_body_and_running_nodes(fake):
    p = make(fake)
    labels = (("Team Name", "ML/Research"), ("9lives", "x" * 80))
    nodes = p.launch(request(labels=labels))
    assert [n.state for n in nodes] == [NodeState.RUNNING] * 2
    assert all(
        n.gpus == 2 and n.address and n.infra == "gcp/us-central1/us-central1-a" for n in nodes
    )
    body = fake.inserted[0]
    assert body["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert body["guestAccelerators"] == [
        {
            "acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4",
            "acceleratorCount": 2,
        }
    ]
    assert body["machineType"] == "zones/us-central1-a/machineTypes/n1-standard-16"
    assert body["labels"] == {
        "team-name": "ml-research",
        "k9lives": "x" * 63,
        "geo_gang": "train-1",
        "geo_orchestrator": "true",
    }
    assert body["disks"][0]["boot"] and "sourceImage" in body["disks"][0]["initializeParams"]
    ready = p.poll_events()
    assert {e.node.node_id for e in ready if isinstance(e, NodeReady)} == {n.node_id for n in nodes}


def test_each_node_boots_its_own_startup_script(fake):
    scripts = ("#!/bin/bash\necho zero\n", "#!/bin/bash\necho one\n")
    make(fake).launch(request(boot_scripts=scripts))
    booted = []
    for body in fake.inserted:
        items = {i["key"]: i["value"] for i in body["metadata"]["items"]}
        assert items["install-nvidia-driver"] == "True"
        booted.append(items["startup-script"])
    assert tuple(booted) == scripts


def test_a_startup_script_over_the_metadata_limit_inserts_nothing(fake):
    huge = "#!/bin/bash\n" + "#" * (256 * 1024)
    with pytest.raises(CloudCallError) as caught:
        make(fake).launch(request(boot_scripts=("true", huge)))
    assert "262144" in str(caught.value) and fake.inserted == []


def test_nodes_are_tagged_for_the_jobs_firewall_rule_which_admits_only_the_overlay(fake):
    from provisioners.base import Firewall

    provisioner = make(fake)
    admit = Firewall(job="Job.1", port=51820, sources=("192.0.2.1", "198.51.100.7"))
    provisioner.launch(request(firewall=admit))
    (rule,) = fake.firewalls.values()
    assert rule["name"] == "geo-job-1" and rule["direction"] == "INGRESS"
    assert rule["targetTags"] == ["geo-job-1"] and rule["network"].endswith("networks/default")
    assert rule["allowed"] == [{"IPProtocol": "udp", "ports": ["51820"]}]
    assert sorted(rule["sourceRanges"]) == ["192.0.2.1/32", "198.51.100.7/32"]
    for body in fake.inserted:
        assert body["tags"]["items"] == ["geo-job-1"]
    instance = next(iter(fake.instances.values()))
    assert fake.ingress(instance) == (
        ("udp", 51820, 51820, "192.0.2.1/32"),
        ("udp", 51820, 51820, "198.51.100.7/32"),
    )
    # a node joined, another left: the rule admits exactly the job's addresses now
    provisioner.open_overlay(
        Firewall(job="Job.1", port=51820, sources=("192.0.2.1", "203.0.113.9"))
    )
    assert sorted(fake.firewalls["geo-job-1"]["sourceRanges"]) == ["192.0.2.1/32", "203.0.113.9/32"]
    assert len(fake.firewalls) == 1


def test_relabel_moves_a_live_nodes_lease_label_and_keeps_the_others(fake):
    provisioner = make(fake)
    nodes = provisioner.launch(request(labels=(("geo-expires", "100"),)))
    provisioner.relabel([n.node_id for n in nodes], {"geo-expires": "200"})
    provisioner.relabel([n.node_id for n in nodes], {"geo-expires": "300"})  # a new fingerprint
    for instance in fake.instances.values():
        assert instance["labels"]["geo-expires"] == "300"
        assert instance["labels"]["geo_gang"] == "train-1"


def test_accelerator_optimized_type_on_demand_and_zone_picked(fake):
    p = make(fake)
    [node] = p.launch(
        LaunchRequest(
            gang="a",
            infra="gcp/us-central1",
            instance_type="a2-highgpu-1g",
            gpu="A100",
            count=1,
            spot=False,
        )
    )
    assert node.infra == "gcp/us-central1/us-central1-a" and node.gpus == 1
    body = fake.inserted[-1]
    assert "guestAccelerators" not in body, "an A2 type carries its GPUs"
    assert body["scheduling"]["provisioningModel"] == "STANDARD"


def test_capacity_error_cleans_up_the_gang(fake):
    fake.capacity["us-central1-a"] = 2  # two nodes fit, the third does not
    p = make(fake)
    with pytest.raises(CapacityError) as caught:
        p.launch(request(count=3))
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in str(caught.value) and "To fix" in str(caught.value)
    assert len(fake.deleted) == 2 and not fake.instances, "the two that started are deleted"
    assert {n.state for n in p.nodes(gang="train-1")} == {NodeState.TERMINATED}


def test_quota_and_permission_errors_are_typed(fake):
    fake.quota_zones.add("us-central1-a")
    with pytest.raises(QuotaError, match="NVIDIA_T4_GPUS"):
        make(fake).launch(request())
    fake.denied = True
    with pytest.raises(CloudCallError, match="roles/compute.instanceAdmin.v1") as caught:
        make(fake).launch(request())
    assert "403" in str(caught.value)


def test_preemption_from_a_zone_operation_and_a_vanished_node(fake):
    p = make(fake)
    first, second = p.launch(request())
    p.poll_events()  # the NodeReady events
    fake.preempt(first.node_id)
    fake.vanish(second.node_id)
    lost = {e.node_id: e.reason for e in p.poll_events(timeout_s=2) if isinstance(e, NodeLost)}
    assert lost == {first.node_id: "preempted", second.node_id: "failed"}
    assert {n.state for n in p.nodes()} == {NodeState.LOST}
    assert not p.supports(Feature.PREEMPTION_NOTICE)
    p.terminate([first.node_id, second.node_id, "never-heard-of"])  # nothing left: no error


def test_terminate_is_idempotent(fake):
    p = make(fake)
    nodes = p.launch(request())
    ids = [n.node_id for n in nodes]
    fake.vanish(ids[0])  # already gone at GCP: the 404 is ignored
    p.terminate(ids)
    p.terminate(ids)
    assert fake.deleted == [ids[1]] and not fake.instances
    assert {n.state for n in p.nodes()} == {NodeState.TERMINATED}


def test_a_sweep_lists_and_ends_the_labelled_instances_whoever_launched_them(fake):
    """status --all / down: a fresh adapter (another process) finds the job's instances by label
    through instances.aggregatedList, and deletes them."""
    launcher = make(fake)
    job = (("geo-job", "Job.A"), ("geo-expires", "1800000000"))
    mine = launcher.launch(request(count=2, labels=job))
    other = launcher.launch(request(count=1, gang="other", labels=(("geo-job", "job-b"),)))
    unlabelled = launcher.launch(request(count=1, gang="plain"))
    sweep = make(fake)  # knows nothing of them
    found = {vm.node_id: vm for vm in sweep.labelled("geo-job")}
    assert set(found) == {n.node_id for n in [*mine, *other]}  # not the unlabelled one
    vm = found[mine[0].node_id]
    assert vm.labels["geo-job"] == "job-a"  # as GCP stores it: lowercase, no dots
    assert vm.infra == "gcp/us-central1/us-central1-a" and vm.instance_type
    assert any(r.endswith("/aggregated/instances") for r in fake.requests)
    sweep.terminate_labelled([found[n.node_id] for n in mine])
    assert set(fake.deleted) == {n.node_id for n in mine}
    left = {name for (_, name) in fake.instances}
    assert left == {other[0].node_id, unlabelled[0].node_id}


def test_a_rejected_token_is_a_credentials_error_without_the_token(fake):
    wrong = "ya29.another-planted-token-Lm42"
    with pytest.raises(CredentialsMissing) as caught:
        make(fake, token=wrong).offers()
    # the 401 makes google-auth try to refresh the token, which a bare token cannot: RefreshError
    assert "application-default login" in str(caught.value)
    assert wrong not in str(caught.value) and wrong not in repr(caught.value)


@pytest.fixture
def no_adc(monkeypatch, tmp_path):
    """An environment where google.auth.default() finds nothing, quickly: no key file, an empty
    gcloud config folder, and a metadata server that refuses connections at once."""
    for name in (
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GOOGLE_CLOUD_PROJECT",
        "GCLOUD_PROJECT",
        "CLOUDSDK_CORE_PROJECT",
        "GOOGLE_CLOUD_QUOTA_PROJECT",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:1")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:1")
    monkeypatch.setenv("GCE_METADATA_DETECT_RETRIES", "1")
    # google-auth reads NO_GCE_CHECK once at import; set its value as if the variable were set,
    # so a test machine that happens to be a GCE VM does not find its own metadata server.
    from google.auth.compute_engine import _metadata

    monkeypatch.setattr(_metadata, "_NO_GCE_CHECK", True)
    return tmp_path


def test_missing_credentials_say_where_the_chain_looked(no_adc):
    with pytest.raises(CredentialsMissing) as caught:
        GcpProvisioner(project="p").check_credentials()
    text = str(caught.value)
    for hint in (
        "GOOGLE_APPLICATION_CREDENTIALS",
        "gcloud auth application-default login",
        "metadata server",
    ):
        assert hint in text


def test_missing_project_says_how_to_set_one(no_adc, monkeypatch):
    secret = "planted-refresh-secret-Uy7q"
    key = no_adc / "adc.json"
    key.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "id",
                "client_secret": secret,
                "refresh_token": secret,
            }
        )
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    with pytest.raises(CredentialsMissing) as caught:
        GcpProvisioner().check_credentials()
    text = str(caught.value)
    assert "gcloud config set project" in text and "GOOGLE_CLOUD_PROJECT" in text
    assert secret not in text


def test_the_contract(fake, caplog):
    harness = Harness(
        provisioner=make(fake),
        launchable=request(instance_type="n1-standard-8", count=2, gang="contract"),
        no_capacity=request("us-central1-b", instance_type="n1-standard-8", gang="no-room"),
        preempt=fake.preempt,
        secrets=(TOKEN,),
        event_timeout_s=10.0,
    )
    run_contract(harness, caplog)
    assert any(r.startswith("GET /compute/v1") for r in fake.requests)
