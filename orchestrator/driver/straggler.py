"""Stragglers: share the global batch over the pipelines by their measured speed.

The plan splits each step's microbatches over the data-parallel pipelines by the speed the
simulator predicts for their GPUs. A node can run slower than its type (a noisy neighbour, a
throttled or failing GPU, a busy host), and the whole step then waits for that pipeline at the
gradient sync. The driver reads each pipeline's compute seconds per microbatch after every step
(its slowest stage's, from the workers' counters). From the median over the last ``window`` steps,
``StragglerWatch.proposal`` works out the shares that minimise the step's compute time
(``balanced_shares``) and proposes them when the current shares' compute is ``min_gain`` (a
fraction) longer: a pipeline that turned slow gets less, one that recovered gets its share back.
The driver switches to them only when the time saved over the rest of the job beats the cost of
restarting the workers (machine.py, as for any plan switch).
"""

from __future__ import annotations

import heapq
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


def pipeline_seconds(counters: Sequence[dict], workers: Sequence) -> tuple[float, ...] | None:
    """Per pipeline, the last step's compute seconds per microbatch of its slowest stage.
    ``workers``: the layout's WorkerSpecs in rank order. None when a worker reported no compute
    time (its first step is still to come)."""
    replicas = 1 + max(w.replica for w in workers)
    per = [0.0] * replicas
    for worker in counters:
        spec = workers[worker["rank"]]
        compute = worker.get("last_step_phases_s", {}).get("compute")
        if compute is None or spec.microbatches < 1:
            return None
        per[spec.replica] = max(per[spec.replica], compute / spec.microbatches)
    return tuple(per)


def balanced_shares(total: int, seconds: Sequence[float]) -> tuple[int, ...]:
    """``total`` microbatches over pipelines that take ``seconds`` per microbatch each, so that
    the slowest pipeline finishes as early as it can: one each, then one at a time to the pipeline
    that would finish its share soonest (greedy; optimal for equal jobs on machines of different
    speeds). Ties go to the lower pipeline index."""
    assert total >= len(seconds) > 0 and all(s > 0 for s in seconds)
    shares = [1] * len(seconds)
    heap = [(2 * s, i) for i, s in enumerate(seconds)]
    heapq.heapify(heap)
    for _ in range(total - len(seconds)):
        _, i = heapq.heappop(heap)
        shares[i] += 1
        heapq.heappush(heap, ((shares[i] + 1) * seconds[i], i))
    return tuple(shares)


def compute_step_s(shares: Sequence[int], seconds: Sequence[float]) -> float:
    """Seconds of the step's compute: the slowest pipeline's share times its time per microbatch."""
    return max(m * s for m, s in zip(shares, seconds, strict=True))


@dataclass(frozen=True)
class Rebalance:
    """New shares for the pipelines and what they change, from measured speeds."""

    shares_before: tuple[int, ...]
    shares_after: tuple[int, ...]
    seconds_per_microbatch: tuple[float, ...]  # per pipeline, median over the window
    step_s_before: float  # compute seconds per step with the current shares
    step_s_after: float

    @property
    def saved_s_per_step(self) -> float:
        return self.step_s_before - self.step_s_after

    @property
    def slowest(self) -> int:
        """The straggling pipeline."""
        return max(
            range(len(self.seconds_per_microbatch)), key=self.seconds_per_microbatch.__getitem__
        )

    def weigh(self, *, steps_left: int, pause_s: float, margin: float) -> tuple[bool, str]:
        """Whether moving to the new shares pays: the seconds saved over ``steps_left`` against
        ``margin`` times a restart's pause; and why, in words."""
        gain = self.saved_s_per_step * steps_left
        why = (
            f"{self.describe()}: saves ~{gain:.3g} s over the {steps_left} steps left, "
            f"moving costs ~{pause_s:.3g} s"
        )
        if gain > margin * pause_s:
            return True, why
        return False, f"{why} (x{margin:g} margin)"

    def describe(self) -> str:
        ratio = max(self.seconds_per_microbatch) / min(self.seconds_per_microbatch)
        per = ", ".join(f"{s * 1e3:.1f}" for s in self.seconds_per_microbatch)
        return (
            f"pipeline {self.slowest} computes {ratio:.2f}x slower than the fastest (ms per "
            f"microbatch: {per}); shares {list(self.shares_before)} -> {list(self.shares_after)} "
            f"cut the step's compute from {self.step_s_before:.3f} to {self.step_s_after:.3f} s"
        )


class StragglerWatch:
    """The last ``window`` steps' seconds per microbatch of each pipeline, for one layout."""

    def __init__(self, *, window: int, min_gain: float) -> None:
        assert window >= 1 and min_gain > 0
        self.window, self.min_gain = window, min_gain
        self._seen: deque[tuple[float, ...]] = deque(maxlen=window)

    def add(self, seconds: tuple[float, ...] | None) -> None:
        if seconds is None:
            return
        if self._seen and len(self._seen[-1]) != len(seconds):
            self._seen.clear()  # another layout: its measurements start afresh
        self._seen.append(seconds)

    def reset(self) -> None:
        self._seen.clear()

    def proposal(self, shares: Sequence[int]) -> Rebalance | None:
        """New shares when, over the whole window, the best split's compute is shorter than the
        current one's by more than ``min_gain``; else None."""
        if len(self._seen) < self.window or len(shares) < 2:
            return None
        medians = tuple(statistics.median(column) for column in zip(*self._seen, strict=True))
        if min(medians) <= 0:
            return None
        after = balanced_shares(sum(shares), medians)
        before_s, after_s = compute_step_s(shares, medians), compute_step_s(after, medians)
        if before_s <= (1.0 + self.min_gain) * after_s:
            return None
        return Rebalance(tuple(shares), after, medians, before_s, after_s)
