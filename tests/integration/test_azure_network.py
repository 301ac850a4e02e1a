"""The Azure adapter's network for a job's nodes (provisioners/azure/network.py, firewall.py), on
the ARM fake: a public IP per node and the job's network security group, rewritten as nodes come
and go and deleted once no NIC uses it."""

from __future__ import annotations

from provisioners.azure import AzureProvisioner
from provisioners.base import Firewall
from provisioners.emulated.azure_api import FakeAzure
from tests.integration.test_azure_provisioner import request

# the adapter on the ARM fake, as the adapter's own tests make it (fixtures: azure, cloud, planted)
pytest_plugins = ["tests.integration.test_azure_provisioner"]


def test_behind_a_job_firewall_a_node_gets_a_public_ip_and_the_jobs_security_group(
    azure: AzureProvisioner, cloud: FakeAzure
):
    firewall = Firewall(job="j", port=51820, sources=("198.51.100.9",))
    (node, _) = azure.launch(request(firewall=firewall))
    (group,) = cloud.security_groups.values()
    assert group["name"] == "geo-j-eastus"
    (rule,) = group["properties"]["securityRules"]
    assert rule["properties"]["sourceAddressPrefixes"] == ["198.51.100.9/32"]
    assert (rule["properties"]["protocol"], rule["properties"]["destinationPortRange"]) == (
        "Udp",
        "51820",
    )
    assert node.address in {ip["properties"]["ipAddress"] for ip in cloud.public_ips.values()}
    vm = next(iter(cloud.vms.values()))
    assert cloud.ingress(vm.body) == (("udp", 51820, 51820, "198.51.100.9/32"),)

    # a node joined: the rule admits it too; one that left is no longer admitted
    azure.open_overlay(Firewall(job="j", port=51820, sources=("198.51.100.9", "203.0.113.5")))
    assert cloud.ingress(vm.body) == (
        ("udp", 51820, 51820, "198.51.100.9/32"),
        ("udp", 51820, 51820, "203.0.113.5/32"),
    )
    azure.terminate([n.node_id for n in azure.nodes()])
    assert cloud.public_ips == {}  # gone with their NICs


def test_the_fake_refuses_a_nic_behind_a_group_that_does_not_exist(cloud: FakeAzure):
    assert "does not exist" in cloud._invalid_nic(
        {"networkSecurityGroup": {"id": "/x/networkSecurityGroups/none"}}
    )


def test_the_jobs_security_group_goes_once_its_nics_are_gone(
    azure: AzureProvisioner, cloud: FakeAzure
):
    azure.launch(request(count=1, firewall=Firewall(job="j", port=51820, sources=())))
    assert azure.drop_firewalls("j") == ([], ["geo-j-eastus"])  # a NIC still uses it
    azure.terminate([n.node_id for n in azure.nodes()])
    assert azure.drop_firewalls("j") == (["geo-j-eastus"], [])
    assert cloud.security_groups == {}
