"""bench/planner_vs_sailor.py: SAILOR's problems are ours, and it asks for SAILOR's build.

SAILOR's planner is built outside this repository (BENCHMARKS.md), so its searches are not run
here; what is checked is that the bench compares the same problems as bench/planner_speed.py,
with the same batch sizes as SAILOR's training configs in ../shared/data.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data" / "sailor" / "models"


def _load(name: str):
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_same_problems_as_planner_speed(tmp_path):
    ours = {name for name, _, _ in _load("planner_speed").problems(tmp_path)}
    bench = _load("planner_vs_sailor")
    assert set(bench.SAILOR_PROBLEMS) == ours
    for config, batch in bench.BATCH.items():
        published = json.loads((SHARED / f"training_config_{config}.json").read_text())
        assert published["global_batch_size"] == batch


def test_without_a_sailor_build_it_says_what_it_needs():
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "planner_vs_sailor.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--sailor DIR is needed" in done.stderr
    assert "Traceback" not in done.stderr
