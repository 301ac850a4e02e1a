"""Submitting a recipe text as a job on the local simulated cloud, for integration tests."""

from __future__ import annotations

import json
import re
import threading
import time

from orchestrator.cli import main


def submit_job(recipe_text: str, folder, name: str, *options: str) -> dict:
    """Write ``recipe_text`` as job ``name`` (its ``name:`` line replaced, ``CHECKPOINTS`` made a
    folder under ``folder``), submit it quietly (with the command line's ``options``) and return
    its final state."""
    recipe = folder / f"{name}.yaml"
    text = re.sub(r"(?m)^name: .*$", f"name: {name}", recipe_text, count=1)
    recipe.write_text(text.replace("CHECKPOINTS", str(folder / "checkpoints")))
    if "--vms" not in options:  # the namespace VMs have tests of their own (test_netns_cloud.py)
        options = ("--vms", "processes", *options)
    # Ray's dashboard is tested where it is the point (test_terminal.py, test_netns_cloud.py,
    # test_orphans.py); the other jobs start their heads without it, a few CPU seconds sooner
    args = ["submit", str(recipe), "--jobs-dir", str(folder / "jobs"), "--quiet", "--no-dashboard"]
    args += options
    assert main(args) == 0
    return json.loads((folder / "jobs" / name / "state.json").read_text())["state"]


def fault_free_losses(plan: dict, recipe_text: str, folder) -> list[float]:
    """The losses of ``plan`` trained straight through by the driver's trainer on a Ray cluster
    of its own (no cloud, no driver, nothing lost): what a fault-free run of the job gives, step
    for step, at a fraction of a submit's start-up."""
    from orchestrator.catalog import default_catalog
    from orchestrator.driver.world import RuntimeTrainer
    from orchestrator.plan import plan_from_dict
    from orchestrator.recipe import parse_recipe
    from tests.integration.conftest import local_ray

    text = recipe_text.replace("CHECKPOINTS", str(folder / "fault-free-checkpoints"))
    recipe = parse_recipe(text, file="fault-free.yaml", folder=folder)
    places = {r["infra"] for stage in plan["stages"] for r in stage["replicas"]}
    workers = sum(len(stage["replicas"]) for stage in plan["stages"])
    resources = {f"infra:{place}": float(workers) for place in places}
    with local_ray(num_cpus=workers, resources=resources):
        trainer = RuntimeTrainer(
            recipe=recipe,
            catalog=default_catalog(),
            job="fault-free",
            checkpoint_url=str(folder / "fault-free-checkpoints"),
        )
        trainer.start(plan_from_dict(plan), restore_step=None)
        try:
            return [trainer.step(step).loss for step in range(recipe.training.steps)]
        finally:
            trainer.stop()


# How far a job's loss may sit from the straight-through run's at the same step. Both runs add
# the same numbers in the same order, and bit for bit they agree in almost every run; once, on a
# loaded CI host, one replica's fp32 loss came out one ulp apart at step 12 (before any fault) and
# the two runs then stayed ~1e-7 relative apart. A step trained twice, skipped, or resumed with
# the wrong weights or optimizer state moves the loss by 1e-3 relative or more.
LOSS_REL_TOLERANCE = 1e-5


def assert_same_losses(losses: list[float], reference: list[float]) -> None:
    """``losses`` are ``reference``'s, step for step, within ``LOSS_REL_TOLERANCE``."""
    assert len(losses) == len(reference), (len(losses), len(reference))
    pairs = enumerate(zip(losses, reference, strict=True))
    apart = [(step, abs(a - b) / abs(b)) for step, (a, b) in pairs if a != b]
    worst = max(apart, key=lambda item: item[1], default=(None, 0.0))
    assert worst[1] <= LOSS_REL_TOLERANCE, (
        f"{len(apart)} steps differ, the first at step {apart[0][0]}; the most at step "
        f"{worst[0]}: {worst[1]:.2e} relative"
    )


def until(what: str, predicate, *, timeout_s: float):
    """``predicate()``'s first truthy value, looked at every half second: what it reads is
    another process's (a job's files, its dashboard), which offers nothing to wait on."""
    pause, deadline = threading.Event(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        pause.wait(0.5)
    raise AssertionError(f"no {what} within {timeout_s:g} s")
