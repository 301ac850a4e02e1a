"""orchestrator/driver/straggler.py: measured speeds -> shares of the global batch."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from orchestrator.driver.straggler import (
    StragglerWatch,
    balanced_shares,
    compute_step_s,
    pipeline_seconds,
)


@dataclass(frozen=True)
class Worker:
    stage: int
    replica: int
    microbatches: int


def test_pipeline_seconds_take_each_pipelines_slowest_stage_per_microbatch():
    # 2 stages x 2 pipelines, rank = stage * 2 + replica; pipeline 1 has 4 microbatches
    workers = [Worker(0, 0, 4), Worker(0, 1, 4), Worker(1, 0, 4), Worker(1, 1, 4)]
    counters = [
        {"rank": 0, "last_step_phases_s": {"compute": 0.4}},
        {"rank": 1, "last_step_phases_s": {"compute": 0.8}},
        {"rank": 2, "last_step_phases_s": {"compute": 0.6}},
        {"rank": 3, "last_step_phases_s": {"compute": 0.2}},
    ]
    assert pipeline_seconds(counters, workers) == pytest.approx((0.15, 0.2))


def test_no_reading_before_every_worker_has_stepped():
    workers = [Worker(0, 0, 2), Worker(0, 1, 2)]
    counters = [{"rank": 0, "last_step_phases_s": {"compute": 0.4}}, {"rank": 1}]
    assert pipeline_seconds(counters, workers) is None


@pytest.mark.parametrize(
    "total, seconds",
    [
        (8, (1.0, 1.0)),
        (8, (1.0, 3.0)),
        (16, (0.1, 0.25, 0.1)),
        (7, (2.0, 1.0, 1.5, 1.0)),
        (3, (5.0, 1.0, 1.0)),
    ],
)
def test_balanced_shares_are_the_best_split(total, seconds):
    shares = balanced_shares(total, seconds)
    assert sum(shares) == total and min(shares) >= 1
    every = [
        s for s in itertools.product(range(1, total + 1), repeat=len(seconds)) if sum(s) == total
    ]
    best = min(compute_step_s(s, seconds) for s in every)
    assert compute_step_s(shares, seconds) == pytest.approx(best)


def test_equal_speeds_keep_equal_shares():
    assert balanced_shares(8, (0.1, 0.1)) == (4, 4)


def _watch(readings, *, window=3, min_gain=0.1):
    watch = StragglerWatch(window=window, min_gain=min_gain)
    for r in readings:
        watch.add(r)
    return watch


def test_a_pipeline_twice_as_slow_gets_a_third_of_the_batch():
    proposal = _watch([(0.1, 0.2)] * 3).proposal((6, 6))
    assert proposal is not None
    assert proposal.shares_after == (8, 4)
    assert proposal.step_s_before == pytest.approx(1.2)
    assert proposal.step_s_after == pytest.approx(0.8)
    assert proposal.saved_s_per_step == pytest.approx(0.4)
    assert proposal.slowest == 1
    assert "pipeline 1 computes 2.00x slower" in proposal.describe()


def test_no_proposal_until_the_window_is_full():
    assert _watch([(0.1, 0.2)] * 2).proposal((6, 6)) is None


def test_one_slow_step_is_not_a_straggler():
    # the median over the window: a single hiccup does not move the shares
    assert _watch([(0.1, 0.1), (0.1, 0.3), (0.1, 0.1)]).proposal((6, 6)) is None


def test_a_gap_under_the_threshold_is_left_alone():
    # 7 + 5 would take 0.70 s against 0.72 s: under 10% shorter
    assert _watch([(0.1, 0.12)] * 3).proposal((6, 6)) is None


def test_a_pipeline_that_recovered_gets_its_share_back():
    proposal = _watch([(0.1, 0.1)] * 3).proposal((9, 3))
    assert proposal is not None and proposal.shares_after == (6, 6)


def test_shares_already_balanced_give_no_proposal():
    assert _watch([(0.1, 0.2)] * 3).proposal((8, 4)) is None


def test_one_pipeline_has_nothing_to_balance_against():
    assert _watch([(0.1,)] * 3).proposal((12,)) is None


def test_a_new_layout_starts_the_window_afresh():
    watch = _watch([(0.1, 0.2)] * 3)
    watch.add((0.1, 0.2, 0.1))  # three pipelines now
    assert watch.proposal((4, 4, 4)) is None
    watch.reset()
    assert watch.proposal((6, 6)) is None
