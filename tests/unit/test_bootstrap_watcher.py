"""A node's watcher: peer sync, the dead-man switch and preemption notices, with fakes."""

from __future__ import annotations

import importlib

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


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_each_clouds_notice_is_read_by_that_adapters_metadata_module(monkeypatch, cloud):
    """One reader per cloud (provisioners/<cloud>/metadata.py, tested against each metadata
    service's fake there): the watcher only calls it, with its own timeout."""
    module = importlib.import_module(f"provisioners.{cloud}.metadata")
    asked = []

    def notice(**options):
        asked.append(options)
        return watcher.Notice(deadline_s=1.0, text=cloud)

    monkeypatch.setattr(module, "notice", notice)
    assert watcher.NOTICE_SOURCES[cloud]().text == cloud
    assert asked == [{"timeout_s": watcher.METADATA_TIMEOUT_S}]
