"""Hivemind's butterfly all-reduce and peers on public addresses (the ``hivemind`` runtime of
configs/simulator.yaml): closed forms for its time and bytes, and the same-zone egress it pays."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.catalog import default_catalog
from orchestrator.simulator import simulate
from orchestrator.simulator.collectives import butterfly_allreduce, ring_allreduce
from orchestrator.simulator.settings import load_settings

from .fakes import FakeNetwork, FakePrices, plan, settings, uniform_profile

MESSAGE = 8e8


def _link(table: dict):
    def link(src: str, dst: str) -> tuple[float, float]:
        return table.get((src, dst)) or table.get((dst, src)) or table["default"]

    return link


@pytest.mark.parametrize("n", [2, 4, 8])
def test_butterfly_time_and_bytes_between_distinct_places(n):
    places = [f"p/r{i}" for i in range(n)]
    latency, bandwidth = 0.05, 1e8
    cost = butterfly_allreduce(places, MESSAGE, _link({"default": (latency, bandwidth)}))
    share = MESSAGE / n
    # a phase: the slowest pair, or every share through the member's one card
    phase = max(latency + share / bandwidth, (n - 1) * share / bandwidth)
    assert cost.time_s == pytest.approx(2 * phase)
    pairs = {(a, b): size for a, b, size in cost.crossing}
    assert len(pairs) == n * (n - 1) and all(v == pytest.approx(2 * share) for v in pairs.values())
    # each member sends what a ring member sends: 2 (n - 1) / n of the message
    assert sum(pairs.values()) == pytest.approx(n * 2 * (n - 1) / n * MESSAGE)


def test_the_slowest_pair_paces_the_butterfly_and_pays_only_two_latencies():
    """Four members over two places: the long link's share and latency set each phase, which a
    ring pays 2 (n - 1) times."""
    places = ["p/us", "p/us", "p/eu", "p/eu"]
    table = {"default": (0.0005, 1e9), ("p/us", "p/eu"): (0.05, 2.5e7)}
    cost = butterfly_allreduce(places, MESSAGE, _link(table))
    assert cost.time_s == pytest.approx(2 * (0.05 + MESSAGE / 4 / 2.5e7))
    ring = ring_allreduce(places, MESSAGE, _link(table))
    assert ring.time_s == pytest.approx(2 * 3 * (0.05 + MESSAGE / 4 / 2.5e7))


def test_bytes_inside_a_place_count_only_for_public_peers():
    places = ["p/us", "p/us", "p/eu", "p/eu"]
    link = _link({"default": (0.0, 1e9)})
    private = {(a, b): s for a, b, s in butterfly_allreduce(places, MESSAGE, link).crossing}
    public = {
        (a, b): s
        for a, b, s in butterfly_allreduce(places, MESSAGE, link, same_place=True).crossing
    }
    assert ("p/us", "p/us") not in private and set(private) < set(public)
    # each of the two members in us sends its partner 2 M / n: 1/3 of what it sends (Erben, D-2)
    assert public[("p/us", "p/us")] == pytest.approx(2 * 2 * MESSAGE / 4)
    assert public[("p/us", "p/eu")] == pytest.approx(2 * public[("p/us", "p/us")])
    ring = ring_allreduce(places, MESSAGE, link, same_place=True)
    assert ("p/us", "p/us") in {(a, b) for a, b, _ in ring.crossing}


def test_the_hivemind_runtime_is_data_and_changes_only_the_averaging():
    catalog = default_catalog()
    ours, hivemind = load_settings(catalog), load_settings(catalog, "hivemind")
    assert (ours.averaging, ours.public_peers) == ("plan", False)
    assert (hivemind.averaging, hivemind.public_peers) == ("butterfly", True)
    assert not hivemind.overlap_grad_sync
    assert dataclasses.replace(hivemind, averaging="plan", public_peers=False) == (
        dataclasses.replace(ours, overlap_grad_sync=False)
    )


class _SameZonePrices(FakePrices):
    """$0.01/GB inside one place, $0.08/GB between places."""

    def egress_usd_per_byte(self, src: str, dst: str) -> float:
        return (0.01 if src == dst else 0.08) / 1e9


def test_a_simulated_butterfly_prices_the_bytes_it_sends_inside_a_zone():
    profile = uniform_profile()
    places = [["gcp/us/a", "gcp/us/a", "gcp/eu/b", "gcp/eu/b"]]
    dp = plan([(0, 8)], places, batch=32)
    network = FakeNetwork(default=(0.001, 1e9))
    hivemind = dataclasses.replace(settings(), averaging="butterfly", public_peers=True)
    butterfly = simulate(profile, dp, network=network, prices=_SameZonePrices(), settings=hivemind)
    gradient = 8 * 1_000_000 * 4  # fp32 gradients of the whole model
    inside = {(x.src, x.dst): x.bytes_per_iteration for x in butterfly.egress if x.src == x.dst}
    assert inside == {
        ("gcp/us/a", "gcp/us/a"): pytest.approx(gradient),
        ("gcp/eu/b", "gcp/eu/b"): pytest.approx(gradient),
    }
    share = gradient / 4
    assert butterfly.stages[0].dp_sync_s == pytest.approx(
        2 * max(0.001 + share / 1e9, 3 * share / 1e9)
    )
    ring = simulate(profile, dp, network=network, prices=_SameZonePrices(), settings=settings())
    assert all(x.src != x.dst for x in ring.egress)
    assert butterfly.egress_usd_per_iteration > ring.egress_usd_per_iteration
