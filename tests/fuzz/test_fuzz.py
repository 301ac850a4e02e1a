"""The fuzz campaign as a test: 2,000 hostile inputs through the CLI, in a child process, checked.

The campaign (tests/fuzz/campaign.py) runs in its own process so that its peak RSS measures the
fuzzing alone, with a fixed seed and no Hypothesis database, so CI runs the same inputs every time
and writes nothing. Its report is printed (``pytest -s`` shows it) and asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.campaign import RUN_LIMIT_S, summary

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = 2000
SEED = 16
# the campaign's own CPU time (~21 s here): what other processes take of the cores does not count,
# as it would for a wall-clock deadline
MAX_CPU_S = 120.0
MAX_PEAK_RSS_MIB = 1024.0


@pytest.mark.slow  # a 2,000-input sweep (20-40 s): the unit tiers run it first
def test_no_input_gives_a_traceback_a_hang_or_a_bad_exit_code(tmp_path):
    # Hypothesis keeps caches beside its database: in a temporary folder, not the working tree
    env = {**os.environ, "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp_path / "hypothesis")}
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.fuzz.campaign",
            "--examples",
            str(EXAMPLES),
            "--seed",
            str(SEED),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    report = json.loads(finished.stdout)
    print(summary(report))
    assert report["violation_count"] == 0, json.dumps(report["violations"][:5], indent=2)
    assert report["inputs"] >= EXAMPLES
    assert set(report["runs"]) == {
        "validate",
        "plan",
        "plan --market",
        "simulate --plan",
        "status",
        "status JOB",
        "logs JOB",
    }
    assert report["slowest"]["cpu_seconds"] < RUN_LIMIT_S
    assert report["peak_rss_mib"] < MAX_PEAK_RSS_MIB
    assert report["cpu_s"] < MAX_CPU_S
    assert not report["torch_imported"]
    # both outcomes are reached for the recipe targets: the inputs are not all rejected early
    for target in ("validate", "plan", "plan --market", "simulate --plan", "logs JOB"):
        assert report["exits"][target].get("0", 0) > 0 and report["exits"][target].get("2", 0) > 0
