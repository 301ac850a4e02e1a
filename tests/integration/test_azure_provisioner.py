"""The Azure adapter with the REAL azure-mgmt-compute client over a fake HTTP transport (offline).

``azure_fake`` answers ARM and the Retail Prices API from memory; a fake TokenCredential hands out a
planted token and AZURE_CLIENT_SECRET holds a planted value: neither may appear in anything the
adapter returns, raises or logs. The on-node Scheduled Events watcher is tested against a local
HTTP server.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from provisioners.azure import AzureProvisioner, VmSettings
from provisioners.azure.metadata import Notice, notice, parse_events, preemption_notice
from provisioners.azure.offers import gpu_of
from provisioners.base import (
    CapacityError,
    CloudCallError,
    CredentialsMissing,
    LaunchRequest,
    NodeLost,
    NodeReady,
    NodeState,
    QuotaError,
    SdkMissing,
)
from provisioners.emulated.azure_api import (
    FAKE_TOKEN,
    PRICES,
    FakeAzure,
    FakeAzureTransport,
    FakeCredential,
    price,
    sku,
)
from tests.integration.contract import Harness, run_contract

A100 = "Standard_NC24ads_A100_v4"
PLANTED_SECRET = "planted-client-secret-Zq81xw"  # noqa: S105 - a planted fake, must never leak
SUBNET = "/subscriptions/s/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/v/subnets/default"


@pytest.fixture
def cloud() -> FakeAzure:
    fake = FakeAzure()
    fake.skus = [
        sku(A100, "eastus", gpus=1, vcpus=24, memory_gb=220, restricted_zones=("3",)),
        sku(
            "Standard_NC4as_T4_v3",
            "eastus",
            gpus=1,
            vcpus=4,
            memory_gb=28,
            location_restricted=True,
        ),
        sku("Standard_ND96asr_v4", "westus2", gpus=8, vcpus=96, memory_gb=900),
        sku("Standard_NC6s_v3", "westus2", gpus=1, vcpus=6, memory_gb=112, zones=()),
        sku("Standard_D4s_v5", "eastus", gpus=0, vcpus=4, memory_gb=16),
    ]
    fake.prices = [
        price("eastus", A100, 3.673, "NC24ads A100 v4"),
        price("eastus", A100, 0.9, "NC24ads A100 v4 Spot"),
        price("eastus", A100, 0.05, "NC24ads A100 v4 Low Priority"),
        price(
            "eastus",
            A100,
            0.5,
            "NC24ads A100 v4 Spot",
            product="Virtual Machines NC Series Windows",
        ),
        price("westus2", "Standard_ND96asr_v4", 27.2, "ND96asr v4"),
        price("westus2", "Standard_ND96asr_v4", 8.1, "ND96asr v4 Spot"),
        price("westus2", "Standard_NC6s_v3", 3.06, "NC6s v3"),
    ]
    fake.capacity[(A100, "2")] = 1  # zone 2 starts one more A100 VM, then ZonalAllocationFailed
    return fake


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    monkeypatch.setenv("AZURE_CLIENT_SECRET", PLANTED_SECRET)
    return FAKE_TOKEN, PLANTED_SECRET


def make(cloud: FakeAzure, **overrides) -> AzureProvisioner:
    options = {
        "subscription_id": cloud.subscription_id,
        "resource_group": "rg",
        "locations": ["eastus", "westus2"],
        "credential": FakeCredential(),
        "client_kwargs": {"transport": FakeAzureTransport(cloud)},
        "poll_interval_s": 0.001,
        "vm": VmSettings(ssh_public_key="ssh-ed25519 AAAAC3Nzfake test@example"),
        "subnet_id": SUBNET,
    }
    return AzureProvisioner(**(options | overrides))


@pytest.fixture
def azure(cloud: FakeAzure, planted) -> Iterator[AzureProvisioner]:
    provisioner = make(cloud)
    yield provisioner
    provisioner.close()


def request(zone: str = "1", count: int = 2, **overrides) -> LaunchRequest:
    options = {
        "gang": "g1",
        "infra": f"azure/eastus/{zone}",
        "instance_type": A100,
        "gpu": "A100-80GB",
        "count": count,
        "timeout_s": 10.0,
    }
    return LaunchRequest(**(options | overrides))


# ---- offers ---------------------------------------------------------------------------------------


def test_offers_honor_zone_and_location_restrictions(azure: AzureProvisioner, cloud: FakeAzure):
    offers = azure.offers()
    assert sorted(o.infra for o in offers if o.instance_type == A100) == [
        "azure/eastus/1",
        "azure/eastus/2",  # zone 3 is restricted for this subscription
    ]
    assert not any(o.instance_type == "Standard_NC4as_T4_v3" for o in offers)  # location restricted
    assert not any(o.instance_type == "Standard_D4s_v5" for o in offers)  # no GPU
    nd = [o for o in offers if o.instance_type == "Standard_ND96asr_v4"]
    assert {o.zone for o in nd} == {"1", "2", "3"}
    assert all(o.gpu == "A100" and o.gpus_per_node == 8 and o.vcpus == 96 for o in nd)
    regional = [o for o in offers if o.instance_type == "Standard_NC6s_v3"]
    assert [(o.infra, o.gpu, o.spot_usd_per_hour) for o in regional] == [
        ("azure/westus2", "V100", None)
    ]
    assert all(o.available_count is None and o.preemption_rate_per_hour is None for o in offers)


def test_prices_come_from_the_retail_api_linux_only(azure: AzureProvisioner, cloud: FakeAzure):
    a100 = next(o for o in azure.offers(regions=["eastus"]) if o.instance_type == A100)
    # Low Priority (0.05) and Windows (0.5) items are not the Linux Spot price
    assert (a100.on_demand_usd_per_hour, a100.spot_usd_per_hour) == (3.673, 0.9)
    asked = [url for _, url in cloud.requests if PRICES in url]
    assert len(asked) >= 2, "several price pages: NextPageLink must be followed"
    assert "serviceName" in asked[0] and "armRegionName" in asked[0]


def test_offers_filter_by_gpu_and_region(azure: AzureProvisioner):
    assert {o.gpu for o in azure.offers(gpus=["A100"])} == {"A100"}
    assert {o.region for o in azure.offers(regions=["westus2"])} == {"westus2"}
    assert azure.offers(gpus=["H100"]) == []


@pytest.mark.parametrize(
    ("size", "gpu"),
    [
        ("Standard_NC24ads_A100_v4", "A100-80GB"),
        ("Standard_ND96amsr_A100_v4", "A100-80GB"),
        ("Standard_ND96asr_v4", "A100"),
        ("Standard_NC6s_v3", "V100"),
        ("Standard_NC24rs_v3", "V100"),
        ("Standard_ND40rs_v2", "V100-32GB"),
        ("Standard_NC4as_T4_v3", "T4"),
        ("Standard_ND96isr_H100_v5", "H100"),
        ("Standard_NC40ads_H100_v5", "H100"),
        ("Standard_NV36ads_A10_v5", "A10"),
        ("Standard_NV6ads_A10_v5", None),  # a sixth of a GPU
        ("Standard_D4s_v5", None),
    ],
)
def test_vm_sizes_map_to_accelerator_names(size: str, gpu: str | None):
    assert gpu_of(size) == gpu


# ---- launch ---------------------------------------------------------------------------------------


def test_spot_create_body_and_running_nodes(azure: AzureProvisioner, cloud: FakeAzure):
    nodes = azure.launch(request(count=2, labels=(("team", "ml"),)))
    assert [n.state for n in nodes] == [NodeState.RUNNING] * 2
    assert all(n.infra == "azure/eastus/1" and n.gpus == 1 and n.spot for n in nodes)
    assert all(n.address and n.address.startswith("10.0.0.") for n in nodes)
    body = cloud.create_bodies[0]
    props = body["properties"]
    assert (props["priority"], props["evictionPolicy"]) == ("Spot", "Delete")
    assert props["billingProfile"] == {"maxPrice": -1}
    assert body["zones"] == ["1"] and body["location"] == "eastus"
    assert body["tags"] == {"geo-orchestrator-gang": "g1", "team": "ml"}
    assert props["hardwareProfile"]["vmSize"] == A100
    nic = props["networkProfile"]["networkInterfaces"][0]
    assert nic["properties"]["deleteOption"] == "Delete"
    assert all(h == f"Bearer {FAKE_TOKEN}" for h in cloud.auth_headers)  # the credential was used


def test_each_node_boots_its_own_custom_data(azure: AzureProvisioner, cloud: FakeAzure):
    scripts = ("#!/bin/bash\necho zero\n", "#!/bin/bash\necho one\n")
    azure.launch(request(count=2, boot_scripts=scripts))
    booted = [
        base64.b64decode(b["properties"]["osProfile"]["customData"]).decode()
        for b in cloud.create_bodies
    ]
    assert tuple(booted) == scripts


def test_custom_data_over_arms_limit_creates_nothing(azure: AzureProvisioner, cloud: FakeAzure):
    huge = "#!/bin/bash\n" + "#" * (64 * 1024)
    with pytest.raises(CloudCallError) as caught:
        azure.launch(request(count=1, boot_scripts=(huge,)))
    assert "87380" in str(caught.value) and cloud.create_bodies == []


def test_on_demand_create_has_no_spot_fields(azure: AzureProvisioner, cloud: FakeAzure):
    azure.launch(request(count=1, spot=False))
    props = cloud.create_bodies[0]["properties"]
    assert not {"priority", "evictionPolicy", "billingProfile"} & set(props)


def test_without_a_key_a_throwaway_one_is_sent_and_arm_accepts_it(cloud: FakeAzure, planted):
    """ARM refuses a Linux VM with passwords off and no SSH key; nobody logs in to a node, so an
    RSA key whose private half is never kept is made once and used for every VM."""
    azure = make(cloud, vm=VmSettings())
    try:
        azure.launch(request(count=1))
        azure.launch(request(count=1, gang="g2"))
    finally:
        azure.close()
    keys = [
        b["properties"]["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"]
        for b in cloud.create_bodies
    ]
    assert len(keys) == 2 and keys[0] == keys[1]
    (key,) = keys[0]
    assert key["keyData"].startswith("ssh-rsa AAAA")
    assert key["path"] == "/home/azureuser/.ssh/authorized_keys"
    assert "PRIVATE" not in repr(azure.vm)


def test_a_key_arm_would_refuse_is_refused_by_the_fake_too(cloud: FakeAzure, planted):
    azure = make(cloud, vm=VmSettings(ssh_public_key="not a key"))
    try:
        with pytest.raises(CloudCallError, match="not a valid SSH public key"):
            azure.launch(request(count=1))
    finally:
        azure.close()


def test_regional_launch_lets_azure_pick_the_zone(azure: AzureProvisioner, cloud: FakeAzure):
    req = request(count=1, infra="azure/westus2", instance_type="Standard_NC6s_v3", gpu="V100")
    (node,) = azure.launch(req)
    assert node.infra == "azure/westus2" and node.gpus == 1
    assert "zones" not in cloud.create_bodies[0]


def test_zonal_allocation_failure_is_capacity_error_and_gang_is_deleted(
    azure: AzureProvisioner, cloud: FakeAzure
):
    with pytest.raises(CapacityError) as caught:
        azure.launch(request(zone="2", count=2))
    assert "ZonalAllocationFailed" in str(caught.value) and "To fix" in str(caught.value)
    assert cloud.vms == {} and cloud.nics == {}, "the VM that did start must be deleted"
    assert len(cloud.deleted) == 2
    assert {n.state for n in azure.nodes(gang="g1")} == {NodeState.TERMINATED}


@pytest.mark.parametrize(
    ("status", "code", "message", "error", "fix"),
    [
        (
            409,
            "SkuNotAvailable",
            "The requested size is not available.",
            CapacityError,
            "another zone",
        ),
        (
            409,
            "OperationNotAllowed",
            "Operation results in exceeding approved standardNCADSA100v4Family Cores quota.",
            QuotaError,
            "Usage + quotas",
        ),
        (
            403,
            "AuthorizationFailed",
            "The client does not have authorization.",
            CloudCallError,
            "Virtual Machine Contributor",
        ),
        (
            401,
            "InvalidAuthenticationToken",
            "The access token is invalid.",
            CredentialsMissing,
            "az login",
        ),
    ],
)
def test_create_errors_are_typed(azure, cloud, status, code, message, error, fix):
    cloud.create_errors[A100] = (status, code, message)
    with pytest.raises(error) as caught:
        azure.launch(request(count=2))
    assert code in str(caught.value) and fix in caught.value.fix
    assert type(caught.value) is error
    assert cloud.vms == {} and cloud.nics == {}


def test_launch_without_subnet_makes_the_locations_network(cloud: FakeAzure, planted):
    azure = make(cloud, subnet_id=None)
    azure.launch(request(count=1))
    (network,) = cloud.hosting.networks.values()
    assert network["name"] == "geo-orchestrator-eastus" and network["location"] == "eastus"
    (nic,) = cloud.nics.values()
    subnet = nic["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"]
    assert subnet == f"{network['id']}/subnets/default"
    assert "rg" in cloud.hosting.groups  # the group is made with it


def test_missing_sdk_is_reported_with_the_extra(cloud: FakeAzure, monkeypatch, planted):
    monkeypatch.setitem(__import__("sys").modules, "azure.mgmt.compute", None)
    with pytest.raises(SdkMissing, match=r"geo-orchestrator\[azure\]"):
        make(cloud).offers()


# ---- events and terminate -------------------------------------------------------------------------


def drain(azure: AzureProvisioner) -> list:
    return azure.poll_events(timeout_s=0.0)


def test_eviction_with_delete_policy_is_preemption(azure: AzureProvisioner, cloud: FakeAzure):
    nodes = azure.launch(request(count=2))
    assert {e.node.node_id for e in drain(azure) if isinstance(e, NodeReady)} == {
        n.node_id for n in nodes
    }
    cloud.evict(nodes[0].node_id)
    events = azure.poll_events(timeout_s=1.0)
    assert events == [
        NodeLost(
            node_id=nodes[0].node_id,
            infra="azure/eastus/1",
            reason="preempted",
            at_s=events[0].at_s,
        )
    ]
    states = {n.node_id: n.state for n in azure.nodes()}
    assert states == {nodes[0].node_id: NodeState.LOST, nodes[1].node_id: NodeState.RUNNING}
    assert drain(azure) == []  # reported once


def test_eviction_with_deallocate_policy_is_preemption(cloud: FakeAzure, planted):
    azure = make(
        cloud, vm=VmSettings(ssh_public_key="ssh-ed25519 AAAA x", eviction_policy="Deallocate")
    )
    node = azure.launch(request(count=1))[0]
    assert cloud.create_bodies[0]["properties"]["evictionPolicy"] == "Deallocate"
    drain(azure)
    cloud.evict(node.node_id)
    assert cloud.vms[node.node_id].power == "deallocated"
    (lost,) = azure.poll_events(timeout_s=1.0)
    assert isinstance(lost, NodeLost) and lost.reason == "preempted"
    azure.terminate([node.node_id])  # a deallocated VM still holds its disk: delete it
    assert cloud.vms == {}


def test_a_sweep_lists_and_ends_the_tagged_vms_whoever_created_them(
    azure: AzureProvisioner, cloud: FakeAzure
):
    """status --all / down: a fresh adapter (another process) finds the job's VMs by their tag
    (virtual_machines.list of the resource group) and deletes them, NICs too."""
    mine = azure.launch(request(zone="1", count=1, labels=(("geo-job", "job-a"),)))
    other = azure.launch(request(zone="3", count=1, gang="g2", labels=(("geo-job", "job-b"),)))
    plain = azure.launch(request(zone="3", count=1, gang="g3"))
    sweep = make(cloud)  # knows nothing of them
    found = {vm.node_id: vm for vm in sweep.labelled("geo-job")}
    assert set(found) == {mine[0].node_id, other[0].node_id}  # not the untagged one
    vm = found[mine[0].node_id]
    assert vm.labels["geo-job"] == "job-a" and vm.infra == "azure/eastus/1"
    assert vm.instance_type == A100
    sweep.terminate_labelled([vm])
    assert set(cloud.alive()) == {other[0].node_id, plain[0].node_id}
    assert not any(name.startswith(mine[0].node_id) for name in cloud.nics)
    sweep.close()


def test_terminate_is_idempotent_and_ignores_vanished_vms(
    azure: AzureProvisioner, cloud: FakeAzure
):
    nodes = azure.launch(request(count=2))
    del cloud.vms[nodes[1].node_id]  # gone behind our back
    ids = [n.node_id for n in nodes] + ["not-ours"]
    azure.terminate(ids)
    azure.terminate(ids)
    assert cloud.vms == {}
    assert {n.state for n in azure.nodes()} == {NodeState.TERMINATED}
    assert sorted(cloud.deleted) == sorted(n.node_id for n in nodes)  # once each


# ---- credentials ----------------------------------------------------------------------------------


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No Azure variables, an empty HOME and a PATH without `az`."""
    import os

    for name in list(os.environ):
        if name.startswith(("AZURE_", "IDENTITY_", "MSI_")):
            monkeypatch.delenv(name)
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    bin_dir.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", str(bin_dir))
    return tmp_path


def test_credentials_missing_names_every_source(bare_env: Path):
    with pytest.raises(CredentialsMissing) as caught:
        AzureProvisioner(subscription_id="sub").check_credentials()
    text = str(caught.value)
    for needed in (
        "AZURE_TENANT_ID",
        "AZURE_CLIENT_SECRET or AZURE_CLIENT_CERTIFICATE_PATH",
        "AZURE_FEDERATED_TOKEN_FILE",
        "managed identity: cannot be checked offline",
        "`az` is not on PATH",
        "az login",
    ):
        assert needed in text


def test_subscription_missing_is_named(bare_env: Path):
    with pytest.raises(CredentialsMissing, match="AZURE_SUBSCRIPTION_ID"):
        AzureProvisioner().check_credentials()


def test_partial_service_principal_names_the_missing_secret(bare_env: Path, monkeypatch):
    monkeypatch.setenv("AZURE_TENANT_ID", "t")
    monkeypatch.setenv("AZURE_CLIENT_ID", "c")
    with pytest.raises(CredentialsMissing) as caught:
        AzureProvisioner(subscription_id="sub").check_credentials()
    assert "service principal: AZURE_CLIENT_SECRET or AZURE_CLIENT_CERTIFICATE_PATH not set" in str(
        caught.value
    )


def test_azure_cli_login_is_found(bare_env: Path, monkeypatch):
    az = bare_env / "bin" / "az"
    az.write_text("#!/bin/sh\n")
    az.chmod(0o755)
    (bare_env / "home" / ".azure").mkdir()
    (bare_env / "home" / ".azure" / "azureProfile.json").write_text("{}")
    monkeypatch.setenv("AZURE_SUBSCRIPTION_ID", "sub")
    AzureProvisioner().check_credentials()  # builds DefaultAzureCredential; fetches no token


def test_secrets_in_cloud_errors_never_leak(azure, cloud, planted, caplog):
    caplog.set_level(logging.DEBUG)
    echo = f"bad request from Bearer {FAKE_TOKEN} with secret {PLANTED_SECRET}"
    cloud.create_errors[A100] = (400, "InvalidParameter", echo)
    with pytest.raises(CloudCallError) as caught:
        azure.launch(request(count=1))
    said = [str(caught.value), repr(caught.value), caplog.text]
    assert not [t for t in said if FAKE_TOKEN in t or PLANTED_SECRET in t]


# ---- the contract ---------------------------------------------------------------------------------


def test_contract(cloud: FakeAzure, planted, caplog):
    azure = make(cloud)
    harness = Harness(
        provisioner=azure,
        launchable=request(zone="1", count=2, gang="contract"),
        no_capacity=request(zone="2", count=2, gang="full"),
        preempt=cloud.evict,
        secrets=planted,
        event_timeout_s=10.0,
    )
    try:
        run_contract(harness, caplog)
    finally:
        azure.close()


# ---- on-node Scheduled Events ---------------------------------------------------------------------


class _Metadata(BaseHTTPRequestHandler):
    document: dict = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        ok = self.headers.get("Metadata") == "true" and "api-version=2020-07-01" in self.path
        body = json.dumps(self.document if ok else {"error": "Bad request"}).encode()
        self.send_response(200 if ok else 400)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        return None


@pytest.fixture
def metadata_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/metadata/scheduledevents?api-version=2020-07-01"
    server.shutdown()
    server.server_close()


def preempt_event(vm: str, not_before: str = "Thu, 19 Sep 2030 18:29:47 GMT") -> dict:
    return {
        "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
        "EventType": "Preempt",
        "ResourceType": "VirtualMachine",
        "Resources": [vm],
        "EventStatus": "Scheduled",
        "NotBefore": not_before,
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def test_scheduled_preempt_event_is_a_notice(metadata_url: str, monkeypatch):
    other = dict(preempt_event("vm-9"), EventType="Reboot")
    monkeypatch.setattr(
        _Metadata, "document", {"DocumentIncarnation": 2, "Events": [other, preempt_event("vm-1")]}
    )
    notice = preemption_notice(vm_name="vm-1", infra="azure/eastus/1", url=metadata_url)
    assert notice is not None and notice.node_id == "vm-1" and notice.infra == "azure/eastus/1"
    assert notice.deadline_s == datetime(2030, 9, 19, 18, 29, 47, tzinfo=timezone.utc).timestamp()
    assert preemption_notice(vm_name="vm-2", infra="azure/eastus/1", url=metadata_url) is None


def test_no_event_or_no_metadata_service_is_no_notice(metadata_url: str, monkeypatch):
    monkeypatch.setattr(_Metadata, "document", {"DocumentIncarnation": 1, "Events": []})
    assert preemption_notice(vm_name="vm-1", infra="azure/eastus/1", url=metadata_url) is None
    closed = "http://127.0.0.1:9/metadata/scheduledevents?api-version=2020-07-01"
    assert preemption_notice(vm_name="vm-1", infra="x", url=closed, timeout_s=0.5) is None


def test_started_event_without_not_before_is_due_now():
    notice = parse_events(
        {"Events": [preempt_event("vm-1", "")]}, vm_name="vm-1", infra="i", now_s=100.0
    )
    assert notice is not None and notice.deadline_s == 100.0


def test_the_watchers_notice_is_the_preempt_event_for_this_vm(metadata_url: str, monkeypatch):
    monkeypatch.setattr(_Metadata, "document", {"Events": [preempt_event("vm-1")]})
    endpoint = metadata_url.split("/metadata/")[0]
    deadline_s = datetime(2030, 9, 19, 18, 29, 47, tzinfo=timezone.utc).timestamp()
    assert notice(endpoint=endpoint) == Notice(deadline_s=deadline_s, text="Azure spot eviction")
    assert notice(endpoint=endpoint, vm_name="VM-1") is not None
    assert notice(endpoint=endpoint, vm_name="vm-2") is None  # another VM's eviction
    assert notice(endpoint="http://127.0.0.1:9", timeout_s=0.5) is None  # no metadata service
