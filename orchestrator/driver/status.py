"""A job's state as people and tables read it (``status``, the notebook handle)."""

from __future__ import annotations

import datetime as dt

from orchestrator.driver.state import JobState


def status_row(state: JobState) -> dict:
    """A job's state as people and tables read it (``status``, the notebook handle)."""
    rate = state.trained_steps * state.global_batch_size / state.train_s if state.train_s else None
    return {
        "job": state.job,
        "phase": state.phase,
        "step": f"{state.step}/{state.steps_total}" if state.steps_total else str(state.step),
        "loss": round(state.losses[-1], 4) if state.losses else None,
        "samples_per_s": round(rate, 2) if rate else None,
        "usd_spent": round(state.compute_usd + state.egress_usd, 6),
        "compute_usd": state.compute_usd,
        "egress_usd": state.egress_usd,
        "egress_bytes": state.egress_bytes,
        "recoveries": state.recoveries,
        "nodes": len(state.nodes),
        "checkpoint_step": state.checkpoint_step,
        "updated_at": iso_time(state.updated_at_s),
        # why a failed job stopped, and what to do (None otherwise)
        "failure": (
            f"{state.failure.get('cause')}: {state.failure.get('message')}"
            if state.failure
            else None
        ),
        "fix": state.failure.get("fix") if state.failure else None,
    }


def iso_time(seconds: float) -> str:
    """Unix seconds as ``2026-11-22T12:00:00Z``."""
    stamp = dt.datetime.fromtimestamp(seconds, dt.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
