"""A tied embedding across a pipeline's first and last stage, in closed form (runtime/stage.py's
exchange: the last stage's share goes to the first stage, the sum comes back and is applied before
the next iteration's first microbatch reaches the last stage)."""

from __future__ import annotations

import pytest

from orchestrator.simulator import simulate

from .fakes import FakeNetwork, FakePrices, plan, settings, uniform_profile

A, Z = "p/east/a", "p/west/z"
F, B, U = 0.01, 0.02, 0.001  # per layer, microbatch 1 (fakes.uniform_profile's defaults)
ACT = 100_000 * 4  # bytes of one activation (fp32)
LATENCY, BANDWIDTH = 0.05, 1e8  # one way, bytes/s


def run(profile, a_plan, *, usd_per_gb=0.0):
    return simulate(
        profile,
        a_plan,
        network=FakeNetwork({(A, Z): (LATENCY, BANDWIDTH)}, default=(0.0, 1e12)),
        prices=FakePrices(usd_per_gb=usd_per_gb),
        settings=settings(),
    )


def two_stages(places=(A, Z), m=8):
    return plan([(0, 4), (4, 8)], [[places[0]], [places[1]]], batch=m)


@pytest.mark.parametrize("tied", [1_000_000, 30_000_000])
def test_the_sum_returns_during_the_next_fill(tied):
    """The first stage waits only if the last stage's share arrives after its own backward ends;
    the iteration grows only by what the return trip outlasts the next iteration's fill."""
    untied = run(uniform_profile(), two_stages())
    e = run(uniform_profile(tied=tied), two_stages())
    size = tied * 4
    trip = LATENCY + size / BANDWIDTH
    first, last = untied.stages
    first_ready, last_ready = first.finish_s - first.update_s, last.finish_s - last.update_s
    done = max(first_ready, last_ready + trip)
    fill = 4 * F + LATENCY + ACT / BANDWIDTH  # microbatch 0 through stage 0 and over the link
    tied_update = 4 * U * tied / (4 * 1_000_000)  # stage 0's step scaled to the tied weight
    expected = max(done + first.update_s, last.finish_s, done + trip - fill + tied_update)
    assert e.stages[0].tied_wait_s == pytest.approx(done - first_ready)
    assert e.iteration_time_s == pytest.approx(expected)
    assert e.iteration_time_s >= untied.iteration_time_s
    if tied == 1_000_000:  # 40 ms each way: hidden behind the last backwards and the next fill
        assert e.stages[0].tied_wait_s == 0
        assert e.iteration_time_s == pytest.approx(untied.iteration_time_s)
    else:  # 1.2 s each way: both directions show
        assert e.stages[0].tied_wait_s > 0 and e.stages[1].tied_wait_s > 0
        assert e.iteration_time_s > untied.iteration_time_s + 1.0


def test_the_exchange_pays_egress_both_ways_and_is_free_in_one_place():
    tied = 2_000_000
    price = 0.05  # $/GB
    untied = run(uniform_profile(), two_stages(), usd_per_gb=price)
    e = run(uniform_profile(tied=tied), two_stages(), usd_per_gb=price)
    assert e.egress_usd_per_iteration - untied.egress_usd_per_iteration == pytest.approx(
        2 * tied * 4 / 1e9 * price
    )
    local = run(uniform_profile(tied=tied), two_stages(places=(A, A)), usd_per_gb=price)
    assert local.egress_usd_per_iteration == 0


def test_the_last_stage_holds_a_copy():
    """Parameters, gradient and Adam's two moments of the tied weight on the last stage only; one
    stage holds the weight once."""
    tied = 3_000_000
    untied = run(uniform_profile(), two_stages())
    e = run(uniform_profile(tied=tied), two_stages())
    extra = [
        t.peak_memory_bytes - u.peak_memory_bytes
        for t, u in zip(e.memory, untied.memory, strict=True)
    ]
    assert extra == [0, pytest.approx(tied * (4 + 4 + 8))]
    alone = plan([(0, 8)], [[A]], batch=8)
    assert run(uniform_profile(tied=tied), alone).peak_memory_bytes == pytest.approx(
        run(uniform_profile(), alone).peak_memory_bytes
    )


def test_a_profile_without_tp_1_sizes_scales_the_tied_update_by_the_degree():
    """The last stage's update of its copy is the first stage's step scaled to the tied weight:
    against the whole stage's parameters, which a profile measured only at TP 2 gives as one GPU's
    share times 2 (an analytic profile built for a plan's degrees has no TP-1 sizes)."""
    import dataclasses

    from orchestrator.plan import Replica

    tied = 30_000_000
    base = uniform_profile(tied=tied, update_s=0.05)  # the copy's update sets the end
    table, times = base.layers[1], base.gpus["A100"].times
    half = dataclasses.replace(table, params=tuple(p / 2 for p in table.params))
    at_tp2 = dataclasses.replace(
        base,
        layers={2: half},
        gpus={
            g: dataclasses.replace(p, times={(mbs, 2): t for (mbs, _), t in times.items()})
            for g, p in base.gpus.items()
        },
    )
    one, two = two_stages(), two_stages()
    two = dataclasses.replace(
        two,
        stages=tuple(
            dataclasses.replace(
                s, replicas=tuple(Replica(gpu=r.gpu, tp=2, infra=r.infra) for r in s.replicas)
            )
            for s in two.stages
        ),
    )
    e1, e2 = run(base, one), run(at_tp2, two)
    assert e1.stages[-1].tied_wait_s > 0
    assert e2.stages[-1].tied_wait_s == pytest.approx(e1.stages[-1].tied_wait_s, rel=0.05)
