"""1F1B pipeline timing: closed cases, and the fast model against an independent event simulation."""

from __future__ import annotations

import random
import statistics

import pytest

from orchestrator.simulator.pipeline import latency_aware_warmup, period, pipeline_time, simulate


def reference(f, b, m, latency=None, occupy_fwd=None, occupy_bwd=None, warmup=None):
    """A plain event-driven 1F1B simulation written independently of orchestrator.simulator."""
    stages = len(f)
    latency = latency or [0.0] * (stages - 1)
    occupy_fwd = occupy_fwd or [0.0] * (stages - 1)
    occupy_bwd = occupy_bwd or [0.0] * (stages - 1)
    warmup = warmup or [stages - s - 1 for s in range(stages)]
    orders = []
    for s in range(stages):
        warm = min(warmup[s], m)
        order = [("F", j) for j in range(warm)]
        for j in range(m - warm):
            order += [("F", warm + j), ("B", j)]
        orders.append(order + [("B", j) for j in range(m - warm, m)])
    act = {(0, j): 0.0 for j in range(m)}
    grad, done_f, done_b = {}, {}, {}
    chan_f, chan_b = [0.0] * stages, [0.0] * stages
    pos, free = [0] * stages, [0.0] * stages
    while any(pos[s] < len(orders[s]) for s in range(stages)):
        moved = False
        for s in range(stages):
            while pos[s] < len(orders[s]):
                kind, j = orders[s][pos[s]]
                if kind == "F":
                    if (s, j) not in act:
                        break
                    end = max(free[s], act[(s, j)]) + f[s]
                    done_f[(s, j)] = end
                    if s < stages - 1:
                        chan_f[s] = max(end, chan_f[s]) + occupy_fwd[s]
                        act[(s + 1, j)] = chan_f[s] + latency[s]
                    else:
                        grad[(s, j)] = end
                else:
                    if (s, j) not in grad:
                        break
                    end = max(free[s], grad[(s, j)]) + b[s]
                    done_b[(s, j)] = end
                    if s > 0:
                        chan_b[s - 1] = max(end, chan_b[s - 1]) + occupy_bwd[s - 1]
                        grad[(s - 1, j)] = chan_b[s - 1] + latency[s - 1]
                free[s] = end
                pos[s] += 1
                moved = True
        assert moved
    return done_b[(0, m - 1)], [done_b[(s, m - 1)] for s in range(stages)]


def random_pipeline(rng, latencies=(0, 0.005, 0.05), occupancies=(0, 0.01, 0.1)):
    stages = rng.randint(1, 6)
    f = [rng.uniform(0.1, 2) for _ in range(stages)]
    b = [x * rng.uniform(1, 3) for x in f]
    latency = [rng.choice(latencies) for _ in range(stages - 1)]
    fwd = [rng.choice(occupancies) for _ in range(stages - 1)]
    bwd = [x * rng.uniform(0.5, 1.5) for x in fwd]
    return f, b, latency, fwd, bwd


def random_warmup(rng, stages):
    """Non-increasing warm-ups of at least the standard P - s - 1."""
    warmup, extra = [], 0
    for s in range(stages - 1, -1, -1):
        extra += rng.choice([0, 0, 1, 2])
        warmup.insert(0, stages - s - 1 + extra)
    return tuple(warmup)


def test_full_simulation_matches_the_reference():
    rng = random.Random(3)
    for _ in range(500):
        f, b, latency, fwd, bwd = random_pipeline(rng, (0, 0.05, 1), (0, 0.5, 3))
        m = rng.randint(1, 30)
        warmup = random_warmup(rng, len(f)) if rng.random() < 0.5 else None
        makespan, ends = simulate(f, b, m, latency, fwd, bwd, warmup)
        ref_makespan, ref_ends = reference(f, b, m, latency, fwd, bwd, warmup)
        assert makespan == pytest.approx(ref_makespan, abs=1e-9)
        assert ends == pytest.approx(ref_ends, abs=1e-9)


@pytest.mark.parametrize(("stages", "m"), [(1, 1), (1, 7), (2, 4), (4, 8), (4, 2), (6, 40)])
def test_balanced_pipeline_closed_form(stages, m):
    f, b = 0.3, 0.7
    result = pipeline_time([f] * stages, [b] * stages, m)
    assert result.makespan_s == pytest.approx((m + stages - 1) * (f + b))


def test_heterogeneous_pipeline_is_paced_by_its_slowest_stage():
    f, b = [1.0, 3.0, 1.0, 1.0], [2.0, 6.0, 2.0, 2.0]
    m = 64
    result = pipeline_time(f, b, m)
    assert result.critical == "stage 1" and result.period_s == pytest.approx(9.0)
    # the slow stage works m * 9 s; the first microbatch reaches it after stage 0's forward and the
    # last gradient leaves it through stage 0's backward; the stages after it add nothing
    assert result.makespan_s == pytest.approx(1.0 + m * 9.0 + 2.0)
    assert result.makespan_s == pytest.approx(reference(f, b, m)[0])


def test_long_round_trip_sets_the_pace():
    """With a long link, stage 0 can keep only P - 0 microbatches in flight: the loop paces."""
    f, b, latency = [0.05, 0.05], [0.1, 0.1], [0.2]
    per, critical = period(f, b, latency, [0.0], [0.0])
    assert critical == "loop 0-1"
    assert per == pytest.approx((0.3 + 2 * 0.2) / 2)
    result = pipeline_time(f, b, 100, latency)
    assert result.makespan_s == pytest.approx(reference(f, b, 100, latency)[0], rel=0.005)


def test_slow_link_channel_paces():
    per, critical = period([0.05, 0.05], [0.1, 0.1], [0.0], [0.5], [0.1])
    assert (per, critical) == (0.5, "link 0->1 (forward)")
    # the loop through both stages and both channels carries two microbatches: (0.3 + 0.6) / 2 < 0.5
    per, critical = period([0.1, 0.1], [0.2, 0.2], [0.0], [0.5], [0.1])
    assert (per, critical) == (pytest.approx(0.6), "loop 0-1")


def test_fast_model_against_full_simulation():
    rng = random.Random(7)
    errors = []
    for _ in range(1500):
        f, b, latency, fwd, bwd = random_pipeline(rng)
        m = rng.randint(1, 64)
        warmup = random_warmup(rng, len(f)) if rng.random() < 0.3 else None
        fast = pipeline_time(f, b, m, latency, fwd, bwd, warmup)
        full, ends = reference(f, b, m, latency, fwd, bwd, warmup)
        errors.append((fast.makespan_s - full) / full)
        assert fast.stage_end_s[0] == pytest.approx(fast.makespan_s)
    assert statistics.mean(abs(e) for e in errors) < 0.002
    assert max(abs(e) for e in errors) < 0.05


def test_latency_aware_warmup_hides_a_long_round_trip():
    """A 2-stage pipeline over a 31 ms round trip: standard 1F1B lets stage 0 run one microbatch
    ahead, so the loop paces; two more warm-up microbatches hide it."""
    f, b, latency, occupy = [0.07, 0.07], [0.15, 0.15], [0.0155], [0.013]
    standard = pipeline_time(f, b, 128, latency, occupy, occupy)
    assert standard.critical == "loop 0-1" and standard.period_s > 0.22 * 1.1
    warmup = latency_aware_warmup(f, b, latency, occupy, occupy)
    assert warmup == (2, 0)
    aware = pipeline_time(f, b, 128, latency, occupy, occupy, warmup)
    assert aware.period_s == pytest.approx(0.22) and aware.critical == "stage 0"
    assert aware.makespan_s == pytest.approx(
        reference(f, b, 128, latency, occupy, occupy, warmup)[0], rel=0.005
    )
    assert aware.makespan_s < 0.91 * standard.makespan_s


def test_latency_aware_warmup_is_standard_without_slow_links():
    f, b = [1.0, 2.0, 1.5, 1.0], [2.0, 4.0, 3.0, 2.0]
    assert latency_aware_warmup(f, b) == (3, 2, 1, 0)
    rng = random.Random(11)
    for _ in range(200):
        f, b, latency, fwd, bwd = random_pipeline(rng, (0, 0.05, 1), (0, 0.1, 0.5))
        warmup = latency_aware_warmup(f, b, latency, fwd, bwd)
        assert all(w >= len(f) - s - 1 for s, w in enumerate(warmup))
        assert all(x >= y for x, y in zip(warmup, warmup[1:], strict=False))
        per, critical = period(f, b, latency, fwd, bwd, warmup)
        assert not critical.startswith("loop") or per == pytest.approx(
            max(max(x + y for x, y in zip(f, b, strict=True)), *fwd, *bwd, 0), rel=1e-9
        )


def test_interpreted_and_compiled_pipelines_agree():
    """pipeline_time interprets a shape until it recurs, then compiles it: both must give the same."""
    from orchestrator.simulator.schedule import (
        compiled_pipeline,
        interpreted_pipeline,
        standard_warmup,
    )

    rng = random.Random(11)
    for trial in range(120):
        stages, m = rng.randint(1, 10), rng.randint(1, 20)
        f = [rng.uniform(0.1, 2) for _ in range(stages)]
        b = [rng.uniform(0.1, 3) for _ in range(stages)]
        links = [[rng.uniform(0, 1.5) for _ in range(stages - 1)] for _ in range(3)]
        warmup = standard_warmup(stages) if trial % 2 else latency_aware_warmup(f, b, *links)
        exact = min(m, warmup[0] + 3)
        ends_i, period_i, at_i = interpreted_pipeline(stages, exact, warmup)(f, b, *links, m)
        ends_c, period_c, at_c = compiled_pipeline(stages, exact, warmup)(f, b, *links, m)
        assert (period_i, at_i) == (period_c, at_c)
        assert ends_i == pytest.approx(ends_c, rel=1e-12)
