"""A job over time as a picture (the notebook's ``Job.plot``): samples/s measured per step beside
the plan's predicted rate, and dollars spent; every preemption notice, lost node and recovery
marked where it happened, the time training paused for a recovery shaded, and no line drawn
across that pause (there were no steps in it)."""

from __future__ import annotations

import math

# what is marked, and how: (colour, line style, legend text)
MARKS = {
    "preemption_notice": ("tab:orange", ":", "preemption notice"),
    "node_lost": ("tab:red", "--", "node lost"),
    "recovered": ("tab:green", "-", "recovered"),
    "switched": ("tab:purple", "-.", "plan switched"),
}
PAUSE_FACTOR = 3.0  # a gap between steps longer than this many typical steps is a pause


def draw_job(axes, metrics, events, *, predicted_samples_per_s: float | None) -> None:
    """Draw on ``axes`` (rate, spend): ``metrics`` and ``events`` as the Job's DataFrames."""
    rate, spend = axes
    if metrics.empty:
        return
    start = metrics["time_s"].iloc[0]
    seconds = list(metrics["time_s"] - start)
    samples, spent = _broken_at_pauses(
        seconds, list(metrics["samples_per_s"]), list(metrics["usd_spent"])
    )
    rate.plot(samples[0], samples[1], lw=1, label="measured")
    spend.plot(spent[0], spent[1], lw=1)
    if predicted_samples_per_s:
        rate.axhline(predicted_samples_per_s, color="grey", ls="--", lw=1, label="predicted")
    shown = set()
    for _, event in events.iterrows() if not events.empty else ():
        mark = MARKS.get(event["event"])
        if mark is None:
            continue
        colour, style, text = mark
        when = event["time_s"] - start
        for axis in (rate, spend):
            axis.axvline(when, color=colour, ls=style, lw=0.8)
        rate.plot([], [], color=colour, ls=style, label=text if text not in shown else None)
        shown.add(text)
        details = event.get("details")
        pause = details.get("recovery_s") if isinstance(details, dict) else None
        if event["event"] == "recovered" and pause:
            for axis in (rate, spend):
                axis.axvspan(when - pause, when, color="tab:green", alpha=0.12, lw=0)
    rate.legend(loc="lower right", fontsize="small")


def _broken_at_pauses(seconds: list[float], *series: list[float]):
    """Each series as (x, y) with a gap (NaN) where training paused, so no line joins it."""
    steps = sorted(b - a for a, b in zip(seconds, seconds[1:], strict=False) if b > a)
    typical = steps[len(steps) // 2] if steps else 0.0
    out = [([], []) for _ in series]
    for index, when in enumerate(seconds):
        paused = index and typical and when - seconds[index - 1] > PAUSE_FACTOR * typical
        for (xs, ys), values in zip(out, series, strict=True):
            if paused:
                xs.append(math.nan)
                ys.append(math.nan)
            xs.append(when)
            ys.append(values[index])
    return out
