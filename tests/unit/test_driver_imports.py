"""The driver names its workers' config, model and data and reaches the worker group and the
checkpoints without importing torch (~1 s of CPU in every driver process, a restarted driver's
recovery included): they are plain data (runtime/config.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROGRAM = """
import sys
import orchestrator.driver.actor, orchestrator.driver.world
from orchestrator.driver.world import data_source
from orchestrator.recipe import load_recipe
from orchestrator.recipe.models import model_source
from runtime import checkpoint
from runtime.config import TrainConfig
from runtime.group import WorkerGroup

recipe = load_recipe("recipes/quickstart.yaml")
source = model_source(recipe.model)
data = data_source(recipe.data)
config = TrainConfig(steps=2, global_batch_size=8, microbatch_size=2)
settings = config.optimizer_settings()
print(source.label, data, settings.kind, "torch" in sys.modules)
"""


def test_the_driver_starts_workers_of_a_built_in_model_without_torch():
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["gpt-tiny", "None", "adamw", "False"], out.stdout
