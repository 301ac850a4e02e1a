"""The pieces every cloud adapter shares (provisioners/tracker.py, sdk_loader.py, error_map.py)
and the one file set each cloud adapter has."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

import pytest

from provisioners.base import (
    CapacityError,
    CloudCallError,
    CredentialsMissing,
    Node,
    NodeLost,
    NodeReady,
    NodeState,
    QuotaError,
    SdkMissing,
)
from provisioners.error_map import ErrorMap, Match
from provisioners.sdk_loader import load_sdk
from provisioners.tracker import NodeTracker

ROOT = Path(__file__).resolve().parents[2]


def _node(node_id: str, gang: str = "g", state: NodeState = NodeState.PENDING) -> Node:
    return Node(
        node_id=node_id,
        gang=gang,
        infra="c/r/z",
        instance_type="t",
        gpu="T4",
        gpus=1,
        spot=True,
        state=state,
    )


def test_the_tracker_keeps_nodes_by_gang_and_hands_each_event_out_once():
    tracker = NodeTracker()
    a = tracker.add(_node("a"), where="r1")
    tracker.add(_node("b", gang="h"), where="r2", event=NodeReady(node=_node("b", gang="h")))
    assert [n.node_id for n in tracker.nodes(gang="g")] == ["a"]
    ready = tracker.update(a, state=NodeState.RUNNING, address="10.0.0.1")
    assert ready.address == "10.0.0.1" and tracker.get("a").node.state is NodeState.RUNNING
    tracker.update(a, lambda t: [NodeReady(node=t.node)])
    assert {w: [t.node.node_id for t in ts] for w, ts in tracker.by_where().items()} == {
        "r1": ["a"],
        "r2": ["b"],
    }
    tracker.ended(a, state=NodeState.LOST, reason="preempted")
    events = tracker.drain()
    assert [type(e) for e in events] == [NodeReady, NodeReady, NodeLost]
    assert events[2].reason == "preempted" and tracker.drain() == []
    assert [t.node.node_id for t in tracker.known(["a", "b", "b", "x"])] == ["b"]  # a is gone
    assert len(tracker.known(["a"], alive_only=False)) == 1


def test_the_tracker_is_one_record_under_threads():
    tracker = NodeTracker()
    records = [tracker.add(_node(str(i))) for i in range(50)]

    def churn():
        for tracked in records:
            tracker.update(tracked, lambda t: [NodeReady(node=t.node)], state=NodeState.RUNNING)

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(tracker.drain()) == 200
    assert all(n.state is NodeState.RUNNING for n in tracker.nodes())


def test_a_missing_sdk_names_its_package_and_the_extra_that_installs_it():
    with pytest.raises(SdkMissing) as raised:
        load_sdk("json", "no_such_module_here", cloud="aws", package="boto3", extra="aws")
    assert "boto3" in str(raised.value)
    assert "pip install 'geo-orchestrator[aws]'" in raised.value.fix
    assert "pip install -e '.[aws]'" in raised.value.fix
    assert load_sdk("json", cloud="aws", package="x", extra="aws").__name__ == "json"


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure", "skypilot"])
def test_a_missing_sdk_is_named_before_missing_credentials(provider, monkeypatch):
    """With neither the SDK nor credentials, the first fix is the package to install."""
    from provisioners.registry import create

    for name in ("AZURE_SUBSCRIPTION_ID", "AWS_ACCESS_KEY_ID", "GOOGLE_CLOUD_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    for module in ("boto3", "google.cloud.compute_v1", "azure.mgmt.compute", "sky"):
        monkeypatch.setitem(sys.modules, module, None)  # stands for a package not installed
    with pytest.raises(SdkMissing) as raised:
        create(provider).check_credentials()
    assert f"pip install 'geo-orchestrator[{provider}]'" in raised.value.fix


ERRORS = ErrorMap(
    cloud="demo",
    capacity=Match(codes={"NoRoom"}, message=re.compile(r"stockout", re.I)),
    quota=Match(codes={"QuotaExceeded"}, code_suffixes=("LimitExceeded",)),
    credentials=Match(codes={"BadToken"}, statuses={401}),
    permission=Match(statuses={403}),
    throttle=Match(codes={"RequestLimitExceeded"}),
    fixes={
        "capacity": "go elsewhere",
        "quota": "ask for more",
        "credentials": "log in",
        "permission": lambda call: f"grant {call}",
        "throttle": "wait",
        "other": "read it",
    },
)


@pytest.mark.parametrize(
    ("code", "message", "status", "kind", "fix"),
    [
        ("NoRoom", "", None, CapacityError, "go elsewhere"),
        ("", "a STOCKOUT in the zone", None, CapacityError, "go elsewhere"),
        ("VcpuLimitExceeded", "", None, QuotaError, "ask for more"),
        ("RequestLimitExceeded", "", None, CloudCallError, "wait"),  # a throttle, not a quota
        ("", "who are you", 401, CredentialsMissing, "log in"),
        ("", "no", 403, CloudCallError, "grant ec2.run"),
        ("Weird", "something", 500, CloudCallError, "read it"),
    ],
)
def test_failures_map_to_one_kind_in_one_order(code, message, status, kind, fix):
    error = ERRORS.error(code, message, call="ec2.run", where="r1", status=status)
    assert type(error) is kind and error.fix == fix
    assert error.cloud == "demo" and error.call == "ec2.run" and "in r1" in str(error)


def test_a_secret_in_a_message_is_scrubbed():
    error = ERRORS.error("Weird", "token=abcdefsecret123", call="x")
    assert "abcdefsecret123" not in str(error)


CANONICAL = ("__init__", "provisioner", "sdk", "offers", "instances")
VM_CLOUDS = ("aws", "gcp", "azure")  # clouds whose VMs we boot ourselves and host a controller on


@pytest.mark.parametrize("cloud", [*VM_CLOUDS, "skypilot"])
def test_every_cloud_adapter_has_the_one_file_set(cloud):
    """provisioners/README.md's file set; SkyPilot launches whole clusters through SkyPilot, so it
    has no firewall, controller hosting or metadata reader of its own (declared unsupported)."""
    folder = ROOT / "provisioners" / cloud
    wanted = CANONICAL + (("firewall", "hosting", "metadata") if cloud in VM_CLOUDS else ())
    have = {p.stem for p in folder.glob("*.py")}
    assert not set(wanted) - have, f"{cloud} lacks {sorted(set(wanted) - have)}"
    for name in ("errors", "market", "skus", "vm", "task"):
        assert name not in have, f"{cloud}/{name}.py: its role has a canonical name"


@pytest.mark.parametrize("cloud", VM_CLOUDS)
def test_every_cloud_adapter_uses_the_one_tracker_loader_and_error_map(cloud):
    folder = ROOT / "provisioners" / cloud
    provisioner = (folder / "provisioner.py").read_text(encoding="utf-8")
    sdk = (folder / "sdk.py").read_text(encoding="utf-8")
    assert "NodeTracker()" in provisioner
    assert "load_sdk(" in sdk and "ErrorMap(" in sdk


def test_an_error_keeps_the_clouds_code_also_across_processes():
    import pickle

    error = ERRORS.error("NoRoom", "full", call="ec2.run", where="r1")
    again = pickle.loads(pickle.dumps(error))
    assert error.code == again.code == "NoRoom" and type(again) is CapacityError
