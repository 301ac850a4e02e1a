"""The cost/throughput frontier of a search as a picture (matplotlib, imported when asked for).

Every plan the planner simulated is a point: samples/s across, $ per 1M samples up; the plans no
other plan beats on both (the frontier) are joined by a line, and the ranked plans are numbered, as
in Figure 1 of Erben et al. Infeasible plans (over a limit, out of memory) are drawn faintly.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator.errors import UserError

FORMATS = (".png", ".svg", ".pdf")


def frontier(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both throughput (higher) and cost (lower), by throughput."""
    best_cost, out = float("inf"), []
    for samples, cost in sorted(points, key=lambda p: (-p[0], p[1])):
        if cost < best_cost:
            out.append((samples, cost))
            best_cost = cost
    return sorted(out)


def draw_frontier(
    path: Path,
    points: Sequence[tuple[float, float, bool]],
    ranked: Sequence[tuple[float, float]],
    title: str,
) -> None:
    """Write the picture to ``path`` (.png, .svg or .pdf)."""
    if path.suffix.lower() not in FORMATS:
        raise UserError(
            f"cannot draw {path.name}: unknown picture format",
            field="--plot",
            fix=f"name the file with one of {', '.join(FORMATS)}",
        )
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on servers
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError(
            "drawing the frontier needs matplotlib, which is not installed",
            field="--plot",
            fix="pip install matplotlib (a dependency of this project: reinstall with pip install -e .)",
        ) from None
    feasible = [(s, c) for s, c, ok in points if ok]
    infeasible = [(s, c) for s, c, ok in points if not ok]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    if infeasible:
        axes.scatter(
            *zip(*infeasible, strict=True),
            s=8,
            c="#d62728",
            alpha=0.25,
            marker="x",
            label="over a limit",
        )
    if feasible:
        axes.scatter(
            *zip(*feasible, strict=True), s=10, c="#7f7f7f", alpha=0.5, label="simulated plans"
        )
        line = frontier(feasible)
        axes.plot(*zip(*line, strict=True), c="#1f77b4", lw=1.5, label="frontier")
    for rank, (samples, cost) in enumerate(ranked, start=1):
        axes.scatter([samples], [cost], s=40, c="#ff7f0e", zorder=3)
        axes.annotate(str(rank), (samples, cost), textcoords="offset points", xytext=(4, 4))
    costs = [c for _, c, _ in points if c > 0]
    if costs and max(costs) > 20 * min(
        costs
    ):  # a wide spread hides the cheap plans on a linear axis
        axes.set_yscale("log")
    axes.set_xlabel("samples/s")
    axes.set_ylabel("$ per 1M samples")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    try:
        figure.savefig(path)
    except OSError as exc:
        raise UserError(
            f"cannot write {path}: {exc.strerror}", field="--plot", fix="give a writable path"
        ) from None
    finally:
        plt.close(figure)
