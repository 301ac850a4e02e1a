"""A node's watcher: peer sync, the dead-man switch and preemption notices, with fakes."""

from __future__ import annotations

import json

import pytest

from provisioners.bootstrap import watcher
from provisioners.bootstrap.watcher import Notice, Watcher
from provisioners.overlay import node as overlay_node

JOINED = overlay_node.Joined("job", "n1", "100.64.0.2", "100.64.0.1", 51821, "gwtest", "CTRLKEY")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world(monkeypatch):
    state = {"answer": [], "applied": [], "down": []}

    def peers(joined, **_):
        if state["answer"] is None:
            raise OSError("no route to the controller")
        return state["answer"]

    monkeypatch.setattr(overlay_node, "peers", peers)
    monkeypatch.setattr(
        overlay_node,
        "apply_peers",
        lambda iface, listed, keep: state["applied"].append((listed, keep)),
    )
    return state


def test_peers_follow_the_controller_and_it_keeps_its_own_key(world):
    clock = Clock()
    w = Watcher(JOINED, grace_s=10, shutdown=world["down"].append, clock=clock)
    world["answer"] = [{"public_key": "K2", "ip": "100.64.0.3", "endpoint": "198.51.100.4:51820"}]
    assert w.tick()
    assert world["applied"] == [(world["answer"], {"CTRLKEY"})]


def test_the_node_shuts_down_only_after_the_grace_period(world):
    clock = Clock()
    w = Watcher(JOINED, grace_s=10, shutdown=world["down"].append, clock=clock)
    world["answer"] = None
    clock.now += 9.5
    assert w.tick() and world["down"] == []
    world["answer"] = []  # back in time: the grace starts again
    clock.now += 1
    assert w.tick()
    world["answer"] = None
    clock.now += 10.5
    assert not w.tick()
    assert len(world["down"]) == 1 and "controller unreachable for 10 s" in world["down"][0]


def test_a_notice_drains_the_node_once(world):
    drained, found = [], [None, Notice(deadline_s=200.0, text="EC2 spot terminate")]
    w = Watcher(
        JOINED,
        grace_s=10,
        shutdown=world["down"].append,
        notice=lambda: found[0] if len(found) == 1 else found.pop(0),
        drain=drained.append,
        clock=Clock(),
    )
    for _ in range(4):
        w.tick()
    assert [n.text for n in drained] == ["EC2 spot terminate"]


def test_every_cloud_named_in_a_recipe_has_a_notice_source():
    assert set(watcher.NOTICE_SOURCES) == {"none", "aws", "gcp", "azure"}


def _metadata(monkeypatch, answers: dict[str, tuple[int, bytes]]):
    """The metadata service as the providers document it: ``answers`` by URL ending."""
    asked = []

    def get(url, headers, *, method="GET"):
        asked.append((url, headers, method))
        for ending, answer in answers.items():
            if url.endswith(ending):
                return answer
        return 404, b""

    monkeypatch.setattr(watcher, "_get", get)
    return asked


def test_aws_notice_reads_the_spot_instance_action_with_an_imdsv2_token(monkeypatch):
    asked = _metadata(
        monkeypatch,
        {
            "/api/token": (200, b"TOKEN"),
            "/spot/instance-action": (
                200,
                b'{"action": "terminate", "time": "2026-11-25T17:00:00Z"}',
            ),
        },
    )
    notice = watcher.aws_notice()
    assert notice.deadline_s == 1795626000.0 and "terminate" in notice.text
    assert asked[0][2] == "PUT" and asked[1][1] == {"X-aws-ec2-metadata-token": "TOKEN"}
    _metadata(monkeypatch, {"/api/token": (200, b"TOKEN")})  # 404 until a notice comes
    assert watcher.aws_notice() is None


def test_gcp_and_azure_notices(monkeypatch):
    asked = _metadata(monkeypatch, {"/instance/preempted": (200, b"FALSE")})
    assert watcher.gcp_notice() is None and asked[0][1] == {"Metadata-Flavor": "Google"}
    _metadata(monkeypatch, {"/instance/preempted": (200, b"TRUE")})
    assert watcher.gcp_notice() is not None
    events = {
        "Events": [
            {"EventType": "Reboot", "NotBefore": "Wed, 25 Nov 2026 16:00:00 GMT"},
            {"EventType": "Preempt", "NotBefore": "Wed, 25 Nov 2026 17:00:00 GMT"},
        ]
    }
    _metadata(monkeypatch, {"api-version=2020-07-01": (200, json.dumps(events).encode())})
    assert watcher.azure_notice().deadline_s == 1795626000.0
    _metadata(monkeypatch, {"api-version=2020-07-01": (200, b'{"Events": []}')})
    assert watcher.azure_notice() is None
