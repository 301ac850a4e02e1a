"""The driver's guards against failures a retry cannot fix, and against retrying for ever.

- A retry budget: recoveries in a row without new progress (a committed step beyond any before)
  are counted, with the seconds since the first of them; past the recipe's ``recovery`` budget
  the job stops (``gave_up``), and from the second attempt on each waits a doubling backoff.
- ``JobBroken`` (a corrupt store, a full disk, a bad value, a bug, a diverged loss; failures.py)
  stops the job at once: workers stopped without a checkpoint, every node released, the cause in
  the state (``failure``) and the event log, the last good checkpoint kept for a resubmit.
- A NaN or infinite loss or gradient is never committed.
- After an unexpected error (a bug, an unwritable job folder) the workers and nodes are let go
  before the error is reported.
- The recipe's ``budget_usd``: the job stops (checkpointed, nodes released) before another step
  and its final checkpoint would pass it.

A mixin of ``Driver`` (machine.py): its methods use the driver's state, session, collaborators and
bookkeeping (``_finish``, ``_lost``, ``_log``, ``_save``, ``_checkpoint``, ``_release``).
"""

from __future__ import annotations

import logging
import math

from orchestrator.driver.contract import JobBroken, StepResult
from orchestrator.driver.failures import classify, one_line

log = logging.getLogger(__name__)


class Guards:
    def _another_attempt(self) -> bool:
        """Count this recovery against the budget of attempts in a row without progress; wait
        the backoff before it (on the provider's events, not a sleep). False: the budget is spent
        and the job stopped."""
        state, config, now = self.state, self.config, self.wall()
        since = state.attempts_since_s if state.attempts else now
        attempts = state.attempts + 1
        self._save(attempts=attempts, attempts_since_s=since)
        spent_s = now - since
        if attempts > config.max_attempts or spent_s > config.max_attempts_s:
            last = self.session.last_failure or "the last failure"
            self._stop_failed(
                JobBroken(
                    "gave_up",
                    f"{attempts - 1} recoveries in a row in {spent_s:.0f} s without getting past "
                    f"step {state.high_water_step}; the last: {last}",
                    fix="see the job's events (python -m orchestrator logs JOB) and driver.log for "
                    "what keeps failing; fix it, or raise recovery.max_attempts / "
                    "recovery.max_seconds, then submit the recipe again to resume",
                    step=state.step,
                )
            )
            return False
        wait_s = 0.0
        if attempts >= 2:
            wait_s = min(config.backoff_s * 2 ** (attempts - 2), config.max_backoff_s)
        if wait_s > 0:
            self._log(
                "backing_off",
                f"wait {wait_s:g} s before attempt {attempts} of {config.max_attempts}",
                f"{attempts - 1} recoveries in a row without progress",
                details={"attempt": attempts, "wait_s": wait_s},
            )
            self._wait(wait_s)
        return True

    def _wait(self, seconds: float) -> None:
        """Wait ``seconds`` on the provider's events (the cloud's own wait, not a sleep); events
        about held nodes are looked at again by the next plan (``alive``)."""
        deadline = self.clock() + seconds
        while (left := deadline - self.clock()) > 0:
            self.cloud.poll_events(timeout_s=left)

    def _stop_failed(self, broken: JobBroken) -> None:
        """Stop the workers (no checkpoint: the state may be what is broken), release every node,
        and record why in the state and the event log."""
        step = self.state.step if broken.step is None else broken.step
        kept = self.state.checkpoint_step
        failure = {
            "cause": broken.cause,
            "message": one_line(broken.message, limit=600),
            "fix": one_line(broken.fix, limit=600),
            "step": step,
            "checkpoint_step": kept,
        }
        keeping = f"kept the checkpoint of step {kept}" if kept else "no checkpoint to keep"
        self._release()
        self._save(failure=failure)
        self._log(
            "failed",
            f"stop; released every node; {keeping}; to fix: {broken.fix}",
            f"{broken.cause}: {broken.message}",
            details={"cause": broken.cause, "step": step, "checkpoint_step": kept},
        )

    def _release_after(self) -> None:
        """Best effort after an unexpected error: each release on its own, so that one failing
        does not keep the others (nodes cost money); the error itself is reported by the caller."""
        for release in (self.trainer.stop, lambda: self.cloud.terminate(list(self.session.nodes))):
            try:
                release()
            except Exception:  # noqa: BLE001 - logged; the error being reported is the first one
                log.exception("releasing the job's workers or nodes after an error failed")
        self.session.nodes = {}

    def _record_crash(self, error: Exception) -> None:
        """Best effort: the job's state and event log say it failed, and why, in one line (the
        traceback goes to the log: the job's driver.log)."""
        log.error("the driver stopped on an unexpected error", exc_info=error)
        verdict = classify(error, doing=f"the driver, in phase {self.state.phase}")
        cause = "code_error" if verdict.retry else verdict.cause
        fix = verdict.fix or "this is a bug: the traceback is in the job's driver.log"
        try:
            self._save(
                phase="failed",
                failure={"cause": cause, "message": verdict.message, "fix": fix},
            )
            self._log("failed", f"stop; to fix: {fix}", f"{cause}: {verdict.message}")
        except OSError:  # the job's folder itself may be what failed (a full disk)
            log.exception("recording the failure in the job's folder failed")

    def _check_finite(self, result: StepResult) -> None:
        """A NaN or infinite loss or gradient: the step is not committed and the job stops; its
        workers' weights are not checkpointed (they may hold the bad update)."""
        if math.isfinite(result.loss) and result.grads_finite:
            return
        step, kept = self.state.step + 1, self.state.checkpoint_step
        what = f"the loss is {result.loss}" if not math.isfinite(result.loss) else "the loss"
        if not result.grads_finite:
            what += (" and " if not math.isfinite(result.loss) else " is finite but ") + (
                "the gradients are not finite"
            )
        raise JobBroken(
            "diverged",
            f"training diverged at step {step}: {what}; it was not committed"
            + (f"; the last good checkpoint is step {kept}" if kept else "; no checkpoint yet"),
            fix="lower training.optimizer.lr or clip gradients (training.optimizer."
            "grad_clip_norm), then submit the recipe again"
            + (f": it resumes from step {kept}" if kept else ""),
            step=self.state.step,
        )

    def _spent(self) -> float:
        return self.state.compute_usd + self.state.egress_usd

    def _over_budget(self, step_usd: float) -> bool:
        """Stop before the recipe's ``budget_usd`` is exceeded: when another step like the one
        just committed (``step_usd``) and then the checkpoint that ends the job (its time as last
        measured, else a step's cost) would pass it, checkpoint now, let every node go, stop."""
        budget, spent = self.config.budget_usd, self._spent()
        if budget is None:
            return False
        hourly = sum(r.usd_per_node_hour for r in self.session.nodes.values())
        wrap_up = self.session.checkpoint_s * hourly / 3600 or max(step_usd, 0.0)
        if spent + max(step_usd, 0.0) + wrap_up <= budget:
            return False
        self._checkpoint("the budget")
        self._release()
        spent = self._spent()  # and the nodes' seconds until they were let go
        self._log(
            "budget_reached",
            "stopped: released every node",
            f"${spent:.4g} spent of the budget's ${budget:.4g}; the next step would cost about "
            f"${step_usd:.2g} more",
            details={"step": self.state.step, "usd_spent": spent, "budget_usd": budget},
        )
        return True
