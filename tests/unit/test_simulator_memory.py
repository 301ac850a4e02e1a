"""Memory as the runtime holds it: gradients reduced in place, a compressing region leader's residual
and sync working copy, and the planner's fast path (``memory_shape``) equal to the breakdown."""

from __future__ import annotations

import pytest

from orchestrator.simulator import simulate

from .fakes import FakeNetwork, FakePrices, plan, settings, uniform_profile

EAST, WEST, EU = "c/east/a", "c/west/a", "c/eu/a"
PARAMS, LAYERS = 1_000_000, 8


def run(profile, a_plan, sim_settings=None):
    return simulate(
        profile,
        a_plan,
        network=FakeNetwork(),
        prices=FakePrices(),
        settings=sim_settings or settings(),
    )


def test_gradients_are_reduced_in_place():
    """A flat ring or a hierarchy without compression needs no buffer beyond the gradient."""
    profile = uniform_profile()
    for allreduce in ("flat", "hierarchical"):
        e = run(profile, plan([(0, 8)], [[EAST, WEST]], batch=8, allreduce=allreduce))
        assert all(m.parts.buffers == 0 for m in e.memory)


@pytest.mark.parametrize(
    ("compression", "payload_per_param"), [("fp16", 2), ("int8", 1 * (1 + 4 / 1024))]
)
def test_a_compressing_leader_keeps_a_residual_and_syncs_in_a_working_copy(
    compression, payload_per_param
):
    """fp32 residual (4 bytes per parameter) kept; while syncing, one fp32 copy and every region
    leader's payload plus its own, in place of the activations, which are gone by then."""
    profile = uniform_profile(kept=1.0)  # next to no activations: the sync sets the peak
    params = LAYERS * PARAMS
    for places, regions in (([EAST, WEST], 2), ([EAST, WEST, EU], 3)):
        e = run(
            profile,
            plan([(0, 8)], [places], batch=12, allreduce="hierarchical", compression=compression),
        )
        parts = e.memory[0].parts
        working = 4 * params + (regions + 1) * payload_per_param * params
        assert parts.buffers + parts.activations == pytest.approx(4 * params + working, rel=1e-3)
    one_region = run(
        profile,
        plan([(0, 8)], [[EAST, "c/east/b"]], batch=8, allreduce="hierarchical", compression="fp16"),
    )
    assert one_region.memory[0].parts.buffers == 0  # no cross-region hop, nothing compressed


def test_activations_outweigh_the_sync_when_larger():
    profile = uniform_profile(kept=1e8)
    e = run(profile, plan([(0, 8)], [[EAST, WEST]], allreduce="hierarchical", compression="fp16"))
    assert e.memory[0].parts.buffers == pytest.approx(4 * LAYERS * PARAMS)  # the residual alone


@pytest.mark.parametrize(
    "a_plan",
    [
        plan([(0, 8)], [[EAST, WEST]], batch=8, allreduce="hierarchical", compression="int8"),
        plan([(0, 4), (4, 8)], [[EAST, WEST], [EU, EU]], batch=16, mbs=2),
        plan(
            [(0, 3), (3, 8)],
            [[EAST, WEST], [EAST, WEST]],
            batch=16,
            allreduce="hierarchical",
            compression="fp16",
        ),
    ],
)
@pytest.mark.parametrize("kept", [1.0, 1e6, 1e8])
def test_the_fast_path_gives_the_breakdown_s_peak(a_plan, kept):
    profile = uniform_profile(kept=kept, tied=500_000)
    sim_settings = settings(overhead=1e9, fragmentation=0.1)
    e = run(profile, a_plan, sim_settings)
    assert e.peak_memory_bytes == pytest.approx(max(m.peak_memory_bytes for m in e.memory))
