"""JoinedProvisioner: boot scripts with join tokens, waiting for nodes to join, notices from
drains, all-or-nothing launches; against a small fake adapter and a fake controller."""

from __future__ import annotations

import threading
import time

import pytest

from provisioners.base import (
    CapacityError,
    CloudCallError,
    Feature,
    LaunchRequest,
    Node,
    NodeLost,
    NodeState,
    PreemptionNotice,
    Provisioner,
)
from provisioners.bootstrap.joined import NOTICE_LOOK_S, ControllerLink, JoinedProvisioner
from provisioners.bootstrap.script import Install, NodeBoot


class FakeCloud(Provisioner):
    """Starts nodes at once; each node "boots" by handing its script to ``on_boot``."""

    cloud = "fake"
    unsupported = {Feature.PREEMPTION_NOTICE: "only on the node", Feature.AVAILABLE_COUNT: "no"}

    def __init__(self, on_boot, *, refuse: bool = False) -> None:
        self.on_boot, self.refuse = on_boot, refuse
        self.launched: list[LaunchRequest] = []
        self.firewalls: list = []  # each open_overlay's
        self.relabelled: list = []  # each relabel's (node ids, labels)
        self.alive: dict[str, Node] = {}
        self.events: list = []
        self._n = 0

    def check_credentials(self) -> None:
        return None

    def offers(self, *, gpus=None, regions=None):
        return []

    def launch(self, request: LaunchRequest) -> list[Node]:
        self.launched.append(request)
        if self.refuse:
            raise CapacityError("full", cloud="fake", call="launch", fix="elsewhere")
        nodes = []
        for script in request.boot_scripts:
            self._n += 1
            node = Node(node_id=f"i-{self._n}", gang=request.gang, infra=request.infra,
                        instance_type=request.instance_type, gpu=request.gpu, gpus=1,
                        spot=request.spot, state=NodeState.RUNNING)  # fmt: skip
            self.alive[node.node_id] = node
            nodes.append(node)
            self.on_boot(script)
        return nodes

    def nodes(self, *, gang=None):
        return list(self.alive.values())

    def terminate(self, node_ids):
        for node_id in node_ids:
            node = self.alive.pop(node_id, None)
            if node is not None:
                self.events.append(NodeLost(node_id=node_id, infra=node.infra, reason="terminated"))

    def poll_events(self, *, timeout_s: float = 0.0):
        events, self.events = self.events, []
        return events

    def open_overlay(self, firewall) -> None:
        self.firewalls.append(firewall)

    def relabel(self, node_ids, labels) -> None:
        self.relabelled.append((sorted(node_ids), dict(labels)))


class FakeController:
    def __init__(self) -> None:
        self.members: set[str] = set()
        self.ray: dict[str, str] = {}  # ray node id -> name
        self.draining: dict[str, float] = {}
        self.addresses: dict[str, str] = {}
        self.join_on_boot = True

    def link(self) -> ControllerLink:
        return ControllerLink(
            mint=self.mint,
            forget=self.members.discard,
            joined=lambda: dict(self.ray),
            preempted=lambda: {self.ray[r]: d for r, d in self.draining.items()},
            # where the overlay saw each member that joined: a public address per node
            endpoints=lambda: [self.address(n) for n in self.ray.values() if n in self.members],
            public_ip="192.0.2.1",
            overlay_port=51820,
        )

    def address(self, name: str) -> str:
        """Each node's own public address, in the order they booted."""
        return self.addresses.setdefault(name, f"198.51.100.{len(self.addresses) + 2}")

    def mint(self, name: str, ttl_s: float) -> str:
        self.members.add(name)
        return f"gj1.token-of-{name}"

    def boot(self, script: str) -> None:
        name = script.split("NODE=", 1)[1].split("\n", 1)[0].strip("'")
        assert f"gj1.token-of-{name}" in script  # each node its own token
        if self.join_on_boot:
            self.ray[f"ray-{name}"] = name


def boot_for(name: str, token: str, request: LaunchRequest) -> NodeBoot:
    install = Install(mode="pip", wheel="w.whl", package_version="1", ray_version="2",
                      torch_version="3")  # fmt: skip
    return NodeBoot(job="job", node=name, install=install, join_token=token,
                    ray_address="100.64.0.1:6379", node_dir="/n", labels={}, resources={},
                    num_cpus=1, num_gpus=0, object_store_bytes=10**8, grace_s=60.0)  # fmt: skip


REQUEST = LaunchRequest(gang="g", infra="fake/r/z", instance_type="t", gpu="T4", count=2,
                        timeout_s=1.0)  # fmt: skip


@pytest.fixture
def controller() -> FakeController:
    return FakeController()


def joined(
    controller: FakeController, clock=time.time, **cloud
) -> tuple[JoinedProvisioner, FakeCloud]:
    inner = FakeCloud(controller.boot, **cloud)
    wrapper = JoinedProvisioner(
        inner, job="job", link=controller.link(), boot_for=boot_for, lease_s=3600.0, clock=clock
    )
    return wrapper, inner


def test_each_node_gets_its_own_script_and_the_job_and_expiry_labels(controller):
    wrapper, inner = joined(controller)
    nodes = wrapper.launch(REQUEST)
    assert [n.node_id for n in nodes] == ["i-1", "i-2"]
    (sent,) = inner.launched
    assert len(sent.boot_scripts) == 2 and sent.boot_scripts[0] != sent.boot_scripts[1]
    labels = dict(sent.labels)
    assert labels["geo-job"] == "job" and float(labels["geo-expires"]) > 0
    assert len(controller.members) == 2
    assert Feature.PREEMPTION_NOTICE not in wrapper.unsupported  # the watcher hears it
    assert Feature.AVAILABLE_COUNT in wrapper.unsupported


def test_nodes_that_never_join_fail_the_gang_which_is_terminated(controller):
    controller.join_on_boot = False
    wrapper, inner = joined(controller)
    with pytest.raises(CloudCallError) as caught:
        wrapper.launch(REQUEST)
    assert "did not join" in str(caught.value) and "boot log" in str(caught.value)
    assert inner.alive == {} and controller.members == set()


def test_a_node_that_stops_before_it_joins_fails_the_gang_at_once(controller):
    """Its bootstrap failed and powered it off: waiting out the launch budget cannot help."""
    controller.join_on_boot = False
    wrapper, inner = joined(controller)
    launch = inner.launch

    def launch_one_dying(request):
        nodes = launch(request)
        controller.ray["ray-first"] = controller.boot_names[0]  # the first joins
        stopped = inner.alive["i-2"]
        inner.alive["i-2"] = Node(**{**stopped.__dict__, "state": NodeState.LOST})
        return nodes

    controller.boot_names = []
    controller.boot = lambda script: controller.boot_names.append(
        script.split("NODE=", 1)[1].split("\n", 1)[0].strip("'")
    )
    inner.on_boot = controller.boot
    inner.launch = launch_one_dying
    slow = LaunchRequest(**{**REQUEST.__dict__, "timeout_s": 600.0})
    with pytest.raises(CloudCallError) as caught:
        wrapper.launch(slow)
    assert "stopped before they joined" in str(caught.value)
    assert controller.boot_names[1] in str(caught.value)
    assert inner.alive == {} and controller.members == set()  # the gang and its tokens gone


def test_a_refused_launch_leaves_no_token_behind(controller):
    wrapper, _ = joined(controller, refuse=True)
    with pytest.raises(CapacityError):
        wrapper.launch(REQUEST)
    assert controller.members == set()


def _drained_after_a_look(controller, index: int):
    """A launched gang, one look at it, then node ``index``'s watcher drains it; (the wrapper,
    the fake cloud, the nodes, the wall clock as a one-item list to move)."""
    now = [1000.0]
    wrapper, inner = joined(controller, clock=lambda: now[0])
    nodes = wrapper.launch(REQUEST)
    assert wrapper.poll_events() == []
    (ray_node,) = [r for r, name in controller.ray.items() if name.endswith(f"-{index}")]
    controller.draining[ray_node] = 1234.0
    return wrapper, inner, nodes, now


def test_a_drain_by_the_watcher_is_one_preemption_notice(controller):
    wrapper, inner, nodes, now = _drained_after_a_look(controller, 1)
    # the driver polls between every two steps: Ray's node table is read once per NOTICE_LOOK_S
    assert wrapper.poll_events() == []
    now[0] += NOTICE_LOOK_S
    (notice,) = wrapper.poll_events()
    assert isinstance(notice, PreemptionNotice)
    assert (notice.node_id, notice.deadline_s, notice.infra) == (
        nodes[1].node_id,
        1234.0,
        "fake/r/z",
    )
    inner.events.append(PreemptionNotice(node_id=nodes[1].node_id, infra="fake/r/z", deadline_s=1))
    assert wrapper.poll_events() == []  # the cloud's own notice of it is not said twice
    wrapper.terminate([nodes[1].node_id])
    (lost,) = wrapper.poll_events()
    assert isinstance(lost, NodeLost) and len(controller.members) == 1


def test_a_wall_clock_set_back_does_not_hold_back_the_next_look(controller):
    wrapper, _, nodes, now = _drained_after_a_look(controller, 0)
    now[0] -= 3600.0  # set back an hour: a look at once, not an hour later
    (notice,) = wrapper.poll_events()
    assert notice.node_id == nodes[0].node_id


def test_close_gives_up_a_waiting_launch(controller):
    controller.join_on_boot = False
    stop = threading.Event()
    inner = FakeCloud(controller.boot)
    wrapper = JoinedProvisioner(inner, job="job", link=controller.link(), boot_for=boot_for,
                                lease_s=60.0, stop=stop)  # fmt: skip
    stop.set()
    with pytest.raises(CloudCallError):
        wrapper.launch(LaunchRequest(gang="g", infra="fake/r/z", instance_type="t", gpu="T4",
                                     count=1, timeout_s=600.0))  # fmt: skip


def test_the_wrapper_keeps_its_clouds_launch_budget(controller):
    wrapper, inner = joined(controller)
    inner_budget = FakeCloud.launch_timeout_s
    assert wrapper.launch_timeout_s == inner_budget


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure", "skypilot"])
def test_a_cloud_launch_waits_longer_than_a_gpu_vm_takes_to_boot_and_install(cloud):
    from provisioners.registry import provisioner_class

    # placing the VM, booting it, installing torch and Ray: minutes, not the local cloud's 120 s
    assert provisioner_class(cloud).launch_timeout_s >= 8 * 60
    assert provisioner_class("local").launch_timeout_s == 120.0


def test_nodes_go_behind_the_jobs_firewall_which_admits_only_its_own_addresses(controller):
    wrapper, inner = joined(controller)
    first = wrapper.launch(REQUEST)
    (sent,) = inner.launched
    assert sent.firewall.job == "job" and sent.firewall.port == 51820
    assert sent.firewall.sources == ("192.0.2.1",)  # the controller: nobody joined yet
    names = sorted(controller.ray.values())
    assert set(inner.firewalls[-1].sources) == {"192.0.2.1", *map(controller.address, names)}

    second = wrapper.launch(REQUEST)
    assert set(inner.launched[-1].firewall.sources) >= set(inner.firewalls[0].sources)
    wrapper.terminate([n.node_id for n in first])  # the overlay forgets them
    left = set(inner.firewalls[-1].sources)
    assert not left & set(map(controller.address, names)) and len(left) == 1 + len(second)


def test_a_cloud_without_a_firewall_per_job_gets_none(controller):
    wrapper, inner = joined(controller)
    inner.unsupported = {**inner.unsupported, Feature.FIREWALL: "not here"}
    wrapper.launch(REQUEST)
    assert inner.launched[0].firewall is None and inner.firewalls == []


def test_a_running_jobs_leases_are_renewed_past_half_of_them(controller):
    now = [1000.0]
    inner = FakeCloud(controller.boot)
    wrapper = JoinedProvisioner(
        inner, job="job", link=controller.link(), boot_for=boot_for, lease_s=3600.0,
        clock=lambda: now[0],
    )  # fmt: skip
    nodes = wrapper.launch(REQUEST)
    assert dict(inner.launched[0].labels)["geo-expires"] == "4600"
    now[0] = 2500.0  # not yet half the lease
    wrapper.poll_events()
    assert inner.relabelled == []
    now[0] = 2800.0
    wrapper.poll_events()
    assert inner.relabelled == [(["i-1", "i-2"], {"geo-expires": "6400"})]
    wrapper.terminate([nodes[0].node_id])
    now[0] = 3000.0  # renewed a moment ago: nothing until another half lease
    wrapper.poll_events()
    now[0] = 4600.0
    wrapper.poll_events()
    assert inner.relabelled[-1] == (["i-2"], {"geo-expires": "8200"})  # the live node only
