"""What hosting a job's controller needs of Azure, through the REAL azure-mgmt-compute client over
the fake's transport (offline): the job's storage account and container, the managed identities
and their roles, and Blob Storage reached by tokens only (the fake served on 127.0.0.1)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from provisioners.azure import AzureProvisioner, VmSettings
from provisioners.azure.hosting import BLOB_DATA_CONTRIBUTOR, CONTRIBUTOR, principal_of
from provisioners.base import LaunchRequest, NodeState, ProvisionerError
from provisioners.emulated.azure_api import FakeAzure, FakeAzureTransport, FakeCredential
from provisioners.emulated.azure_wire import serve
from runtime.storage import StoreError, open_store

SUBNET = "/subscriptions/s/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/v/subnets/default"


@pytest.fixture
def cloud() -> FakeAzure:
    return FakeAzure()


@pytest.fixture
def user(cloud: FakeAzure) -> str:
    """The caller's principal; its token is the only one the fake's ARM accepts at first."""
    return str(uuid.uuid4())


@pytest.fixture
def azure(cloud: FakeAzure, user: str) -> Iterator[AzureProvisioner]:
    provisioner = AzureProvisioner(
        subscription_id=cloud.subscription_id,
        resource_group="jobs-rg",
        locations=["eastus"],
        credential=FakeCredential(cloud.hosting.mint(user)),
        client_kwargs={"transport": FakeAzureTransport(cloud)},
        poll_interval_s=0.001,
        vm=VmSettings(ssh_public_key="ssh-ed25519 AAAAC3Nzfake test@example"),
        subnet_id=SUBNET,
    )
    yield provisioner
    provisioner.close()


def roles_of(cloud: FakeAzure, principal: str) -> set[tuple[str, str]]:
    return {
        (a["roleDefinitionId"].rsplit("/", 1)[-1], a["scope"].rsplit("/", 1)[-1])
        for a in cloud.hosting.assignments.values()
        if a["principalId"] == principal
    }


def test_job_bucket_is_a_private_account_the_caller_may_use(azure, cloud, user):
    url = azure.job_bucket("EastUS")
    (account,) = cloud.hosting.accounts.values()
    name = account["name"]
    assert url == f"https://{name}.blob.core.windows.net/geo"
    assert len(name) <= 24 and name.isalnum() and name.islower()
    assert account["location"] == "eastus" and account["kind"] == "StorageV2"
    assert account["properties"]["allowBlobPublicAccess"] is False
    assert account["properties"]["minimumTlsVersion"] == "TLS1_2"
    assert (name, "geo") in cloud.hosting.containers
    assert roles_of(cloud, user) == {(BLOB_DATA_CONTRIBUTOR, name)}
    # again: the same account, no second assignment refused as an error
    assert azure.job_bucket("eastus") == url
    assert azure.job_buckets() == {"eastus": url}


def test_identities_get_only_their_roles(azure, cloud):
    url = azure.job_bucket("eastus")
    ids = azure.identities(url)
    assert ids.controller.endswith("/userAssignedIdentities/geo-orchestrator-controller")
    assert ids.node.endswith("/userAssignedIdentities/geo-orchestrator-node")
    account = url.split("//")[1].split(".")[0]
    controller = cloud.hosting.identity_of(ids.controller)["properties"]["principalId"]
    node = cloud.hosting.identity_of(ids.node)["properties"]["principalId"]
    assert roles_of(cloud, controller) == {
        (BLOB_DATA_CONTRIBUTOR, account),
        (CONTRIBUTOR, "jobs-rg"),
    }
    assert roles_of(cloud, node) == {(BLOB_DATA_CONTRIBUTOR, account)}
    assert azure.identities(url) == ids  # made once


def test_blobs_answer_only_tokens_with_the_role(azure, cloud, user):
    url = azure.job_bucket("eastus")
    ids = azure.identities(url)
    node = cloud.hosting.identity_of(ids.node)["properties"]["principalId"]
    server = serve(cloud, host="127.0.0.1", port=0)
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        mine = open_store(
            f"{url}/jobs/j1",
            endpoint_url=endpoint,
            credential=FakeCredential(cloud.hosting.mint(user)),
        )
        mine.put("state.json", b"{}")
        as_node = open_store(
            f"{url}/jobs/j1",
            endpoint_url=endpoint,
            credential=FakeCredential(cloud.hosting.mint(node)),
        )
        assert as_node.get("state.json") == b"{}"
        assert list(as_node.keys()) == ["state.json"] and as_node.size("state.json") == 2
        stranger = cloud.hosting.mint(str(uuid.uuid4()))
        other = open_store(
            f"{url}/jobs/j1", endpoint_url=endpoint, credential=FakeCredential(stranger)
        )
        with pytest.raises(StoreError, match="403") as refused:
            other.get("state.json")
        assert stranger not in str(refused.value)
    finally:
        server.shutdown()
        server.server_close()


def test_a_controller_is_a_cpu_vm_with_its_identity(azure, cloud):
    ids = azure.identities(azure.job_bucket("eastus"))
    request = LaunchRequest(
        gang="ctl-j1",
        infra="azure/eastus",
        instance_type="Standard_D2s_v5",
        gpu="",
        count=1,
        spot=False,
        gpus_per_node=0,
        timeout_s=10.0,
        labels=(("geo-job", "j1"),),
        identity=ids.controller,
    )
    (node,) = azure.launch(request)
    body = cloud.create_bodies[-1]
    assert body["identity"] == {
        "type": "UserAssigned",
        "userAssignedIdentities": {ids.controller: {}},
    }
    assert "priority" not in body["properties"] and node.gpus == 0
    (found,) = azure.labelled("geo-job")
    azure.relabel_labelled([found], {"geo-expires": "123"})
    tags = cloud.vms[node.node_id].body["tags"]
    assert tags["geo-expires"] == "123" and tags["geo-job"] == "j1"
    # powered off from inside: stopped (still billed), listed as not running
    cloud.vms[node.node_id].power = "stopped"
    (found,) = azure.labelled("geo-job")
    assert found.state == NodeState.TERMINATED
    unknown = ids.controller.replace("controller", "nobody")
    with pytest.raises(ProvisionerError, match="does not exist"):
        azure.launch(LaunchRequest(**{**request.__dict__, "gang": "ctl-j2", "identity": unknown}))


def test_a_role_for_an_unknown_principal_is_refused(azure, cloud):
    url = azure.job_bucket("eastus")
    host = azure._hosting()
    with pytest.raises(ProvisionerError, match="PrincipalNotFound"):
        host.assign(str(uuid.uuid4()), CONTRIBUTOR, scope=host.group_id, principal_type=None)
    assert url


def test_principal_of_reads_only_jwt_shaped_tokens(cloud):
    oid = str(uuid.uuid4())
    assert principal_of(cloud.hosting.mint(oid)) == oid
    assert principal_of("not-a-jwt") is None and principal_of("a.b.c") is None
