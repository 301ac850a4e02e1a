"""Submitting a recipe text as a job on the local simulated cloud, for integration tests."""

from __future__ import annotations

import json
import re

from orchestrator.cli import main


def submit_job(recipe_text: str, folder, name: str) -> dict:
    """Write ``recipe_text`` as job ``name`` (its ``name:`` line replaced, ``CHECKPOINTS`` made a
    folder under ``folder``), submit it quietly and return its final state."""
    recipe = folder / f"{name}.yaml"
    text = re.sub(r"(?m)^name: .*$", f"name: {name}", recipe_text, count=1)
    recipe.write_text(text.replace("CHECKPOINTS", str(folder / "checkpoints")))
    assert main(["submit", str(recipe), "--jobs-dir", str(folder / "jobs"), "--quiet"]) == 0
    return json.loads((folder / "jobs" / name / "state.json").read_text())["state"]
