"""Bounds on how a data-parallel iteration ends, cached for one search: the all-reduce of the
stage that holds the most gradients, and the first stage's tail (the all-reduce its last backward
cannot hide, then its optimizer step). ``search.py`` asks them per configuration and degree."""

from __future__ import annotations

from orchestrator.errors import UserError
from orchestrator.planner.candidates import Evaluator


class SyncBounds:
    def __init__(self, evaluator: Evaluator, *, num_layers: int, least_tp: int) -> None:
        self.e, self.num_layers = evaluator, num_layers
        profile = evaluator.profile
        self._model_gradient_bytes = (
            profile.stage_gradient_elements(0, profile.num_layers, least_tp) * profile.element_bytes
        )
        self._allreduce: dict[tuple, float] = {}
        self._tails: dict[tuple, list[float]] = {}

    def allreduce(self, stages: int, dp: int, pairs: frozenset) -> float:
        """The least all-reduce of a stage holding 1/P of the gradients (some stage holds at
        least that; its all-reduce ends the iteration at best) over ``dp`` replicas of one of
        ``pairs`` (every config of P stages on these pairs asks it per degree)."""
        key = (stages, dp, pairs)
        bound = self._allreduce.get(key)
        if bound is None:
            share = self._model_gradient_bytes / stages
            bound = self._allreduce[key] = self.e.allreduce_lower_bound(share, dp, pairs)
        return bound

    def first_stage_tail(self, mbs: int, first: tuple[str, int], dp: int, stages: int) -> float:
        """The least time from the first stage's last backward to the end of its step: the
        all-reduce its last backward cannot hide, then its optimizer step, over every number of
        layers it may hold (at least layer 0, at most all but one per other stage)."""
        key = (mbs, first, dp)
        tails = self._tails.get(key)
        if tails is None:
            tails = self._tails[key] = self._tails_by_end(mbs, first, dp)
        # tails[k]: the least over holding 1..k layers; one stage holds all of them
        if stages == 1:
            return tails[0]
        return tails[self.num_layers - stages + 1]

    def _tails_by_end(self, mbs: int, first: tuple[str, int], dp: int) -> list[float]:
        """[the tail holding every layer, then for k = 1..L the least tail holding 1..k]."""
        gpu, tp = first
        profile, layers = self.e.profile, self.num_layers
        exact, least = [], float("inf")
        for end in range(1, layers + 1):
            try:
                _, backward, update = profile.stage_times(gpu, mbs, tp, 0, end)
            except UserError:  # no times at this TP degree: no bound from this stage
                return [0.0] * (layers + 1)
            message = profile.stage_gradient_elements(0, end, tp) * profile.element_bytes
            exact.append(self.e.exposed_sync(message, dp, gpu, tp, backward) + update)
        out = [exact[-1]]
        for value in exact:
            least = min(least, value)
            out.append(least)
        return out
