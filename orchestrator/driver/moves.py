"""The driver's moves while training goes well: a better plan on the market (capacity back,
prices moved, a deadline to keep) and a straggling pipeline to re-balance (straggler.py). Both
weigh what the move gains over the rest of the job against what it costs (a restart's pause,
measured, times ``switch_margin``), and move by checkpointing the step just committed, stopping
the workers and launching the new plan (nothing committed is lost).

A mixin of ``Driver`` (machine.py): its methods use the driver's state, session, collaborators and
bookkeeping (``_checkpoint``, ``_log``, ``_save``).
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.driver.contract import Choice, deadline_rate
from orchestrator.errors import UserError


class Moves:
    def _reconsider(self) -> bool:
        """Every ``replan_every_steps``: is there a better plan on the market now (capacity back,
        prices moved)? Move to it only when what it gains over the rest of the job beats the move's
        cost (a pause as long as this job's recoveries, times ``switch_margin``); the move
        checkpoints the step just committed, so it loses nothing. True: moving (launch next)."""
        every, current = self.config.replan_every_steps, self.session.choice
        if not every or self.state.step % every or self.state.step >= self.config.steps:
            return False
        assert current is not None
        try:
            best = self.plans.choose(excluded=frozenset(), held=self._held_by_place())
        except UserError:
            return False  # nothing feasible now: keep what runs
        if best.summary == current.summary:
            return False
        gain, cost, unit = self._switch_gain(current, best)
        why = f"gains {gain:.3g} {unit} over the rest of the job, moving costs ~{cost:.3g} {unit}"
        needed = self._deadline_floor()
        misses = needed is not None and current.samples_per_s < needed <= best.samples_per_s
        if misses:
            why = f"the current plan misses the deadline (needs {needed:.3g} samples/s); " + why
        if not misses and gain <= self.config.switch_margin * cost:
            if best.summary not in self.session.declined:  # said once per plan
                self.session.declined.add(best.summary)
                self._log(
                    "plan_kept",
                    "keep the current plan",
                    f"the better plan {why} (x{self.config.switch_margin:g} margin)",
                    plan_before=current.summary,
                    plan_after=best.summary,
                )
            return False
        self._checkpoint("a plan switch")
        self.trainer.stop(restart=True)
        self.session.lost_at_s, self.session.pause_event = self.clock(), "switched"
        self.session.choice = best
        self.session.declined.clear()
        self._log(
            "switching",
            "checkpoint, stop the workers, launch the new plan and resume",
            why,
            plan_before=current.summary,
            plan_after=best.summary,
            details={"step": self.state.step},
        )
        self._save(plan=best.plan.to_dict())
        return True

    def _deadline_floor(self) -> float | None:
        """Samples/s the rest of the job needs to finish by the deadline (None: no deadline)."""
        if self.config.deadline_s is None:
            return None
        return deadline_rate(
            samples_left=(self.config.steps - self.state.step) * self.config.samples_per_step,
            seconds_left=self.config.deadline_s - (self.wall() - self.state.started_at_s),
        )

    def _rebalance(self) -> bool:
        """A pipeline measured slower than the others (straggler.py): give the faster ones more
        of each step's microbatches, on the same nodes, when the time it saves over the rest of
        the job beats ``switch_margin`` times a restart's pause (the same time on the same nodes
        with either goal, so dollars would decide alike). Moves as a plan switch does; True:
        moving (launch next)."""
        watch, current = self.session.stragglers, self.session.choice
        last = self.session.last_result
        if watch is None or current is None or last is None or not last.pipeline_microbatches:
            return False
        watch.add(last.pipeline_s)
        proposal = watch.proposal(last.pipeline_microbatches)
        if proposal is None or self.state.step >= self.config.steps:
            return False
        watch.reset()  # one decision per window of measurements
        worth, why = proposal.weigh(
            steps_left=self.config.steps - self.state.step,
            pause_s=self._pause_s(),
            margin=self.config.switch_margin,
        )
        if not worth:
            said = f"shares {proposal.shares_after}"
            if said not in self.session.declined:  # said once per proposal
                self.session.declined.add(said)
                self._log("straggler", "keep the shares", why)
            return False
        self._checkpoint("re-balancing")
        self.trainer.stop(restart=True)
        self.session.lost_at_s, self.session.pause_event = self.clock(), "rebalanced"
        self.session.same_nodes = True  # each share stays with the node it was measured on
        plan = replace(current.plan, pipeline_microbatches=tuple(proposal.shares_after))
        self.session.choice = replace(current, plan=plan)
        self._log(
            "rebalancing",
            "checkpoint, restart the workers with the new shares on the same nodes, resume",
            why,
            details={"step": self.state.step, "shares": list(proposal.shares_after)},
        )
        self._save(plan=plan.to_dict(), choice=self.session.choice.to_dict())
        return True

    def _pause_s(self) -> float:
        """What a move costs: the median measured pause (recoveries, switches), else the
        configured guess."""
        pauses = sorted(self.session.pauses_s)
        return pauses[len(pauses) // 2] if pauses else self.config.migration_s

    def _switch_gain(self, current: Choice, best: Choice) -> tuple[float, float, str]:
        """(gain, cost, unit) of moving to ``best``: seconds to finish with goal max_throughput,
        else dollars to finish (compute at the plans' $/h)."""
        left = (self.config.steps - self.state.step) * self.config.samples_per_step
        pause_s = self._pause_s()
        finish_now, finish_best = left / current.samples_per_s, left / best.samples_per_s
        if self.config.goal == "min_cost":
            usd_now = finish_now * current.usd_per_hour / 3600
            usd_best = finish_best * best.usd_per_hour / 3600
            return usd_now - usd_best, pause_s * current.usd_per_hour / 3600, "$"
        return finish_now - finish_best, pause_s, "s"
