"""Data-parallel degrees between two divisors of the batch's microbatches, where the search tries
them (``candidates.between_divisors``: the run's cost capped, or minimised under a floor).

Such a degree's pipelines run unequal shares. On a market of many places each (shape, D) of them
takes thousands of placements, so a search simulates at most a number of them, the best bounds
first (the bound covers the rest), and for the cheapest plan skips those a smaller degree of the
same shape already beats (``BetweenDegrees.dominated``).
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.planner.candidates import Shape, between_divisors


def idle_slots(microbatches: int, dp: int) -> int:
    """``D * ceil(M / D) - M``: the microbatch slots D pipelines leave empty (0 at a divisor)."""
    return dp * -(-microbatches // dp) - microbatches


def between(microbatches: int, degrees: Iterable[int]) -> set[int]:
    """Of ``degrees``, those that do not divide M and lie below the largest that does (the one
    above the largest divisor is in the search's space for every objective)."""
    degrees = list(degrees)
    top = max((d for d in degrees if microbatches % d == 0), default=0)
    return {d for d in degrees if microbatches % d and d < top}


class BetweenDegrees:
    """One search's account of those degrees: whether it tries them, how many more it may
    simulate, and per shape the degrees whose plans met the limits."""

    def __init__(self, objective, *, limit: int) -> None:
        self.tried = between_divisors(objective)
        self.cheapest = objective.goal == "min_cost"
        self.left = limit  # (shape, D) between divisors still to simulate
        self._met: dict[Shape, list[int]] = {}

    def take(self) -> bool:
        """One more to simulate, if the limit allows."""
        if self.left <= 0:
            return False
        self.left -= 1
        return True

    def met(self, shape: Shape, dp: int) -> None:
        """Some plan of (shape, D) met the limits."""
        self._met.setdefault(shape, []).append(dp)

    def dominated(self, shape: Shape, dp: int, microbatches: int) -> bool:
        """For the cheapest plan: the shape already met the limits at a smaller degree that
        leaves no more idle slots. That degree's plans cost no more per sample (its fullest
        pipeline runs no more of the batch's slots, its all-reduce spans fewer replicas, and any
        placement of the D pipelines holds one of its fewer), so D is worth it only where every
        such smaller degree misses the floor. Under a total budget the larger degree is the
        faster one: never dominated. A rule of the time model; the exhaustive tests check it
        on their markets."""
        if not self.cheapest:
            return False
        idle = idle_slots(microbatches, dp)
        return idle > 0 and any(
            d < dp and idle_slots(microbatches, d) <= idle for d in self._met.get(shape, ())
        )
