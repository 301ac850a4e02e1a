"""A job's controller VM renews its own lease label (orchestrator/driver/hosts.py)."""

from __future__ import annotations

from orchestrator.driver.hosts import LEASE_S, renew_controller_lease
from provisioners.base import LabelledVm, NodeState


class _Cloud:
    """What the renewal uses of an adapter: the labelled VMs, and relabelling them."""

    def __init__(self, vms: list[LabelledVm]) -> None:
        self.vms, self.relabelled = vms, []

    def labelled(self, key: str) -> list[LabelledVm]:
        return [vm for vm in self.vms if key in vm.labels]

    def relabel_labelled(self, vms, labels) -> None:
        self.relabelled.append(([vm.node_id for vm in vms], dict(labels)))


def _vm(node_id: str, job: str, *, role: str | None = None, state=NodeState.RUNNING):
    labels = {"geo-job": job, "geo-expires": "1"} | ({"geo-role": role} if role else {})
    return LabelledVm(
        node_id=node_id, infra="aws/us-east-1/us-east-1a", instance_type="m6i.large",
        state=state, labels=labels,
    )  # fmt: skip


def test_only_the_jobs_running_controller_is_renewed_a_lease_ahead():
    cloud = _Cloud(
        [
            _vm("ctl", "j", role="controller"),
            _vm("node", "j"),  # the driver's JoinedProvisioner renews its nodes
            _vm("other-ctl", "k", role="controller"),
            _vm("gone-ctl", "j", role="controller", state=NodeState.TERMINATED),
        ]
    )
    assert renew_controller_lease(cloud, "j", now_s=1000.0) == 1
    assert cloud.relabelled == [(["ctl"], {"geo-expires": f"{1000.0 + LEASE_S:.0f}"})]


def test_no_controller_no_call():
    cloud = _Cloud([_vm("node", "j")])
    assert renew_controller_lease(cloud, "j", now_s=0.0) == 0 and cloud.relabelled == []
