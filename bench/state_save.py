"""The driver's cost per committed step for its job state, as the job grows: ``StateStore.save``
(orchestrator/driver/state.py) as a step's commit calls it, beside the way it was saved before
(the whole state, its loss per step included, encoded twice and fsynced), in one run.

Usage: python bench/state_save.py [--steps 1000,10000,100000] [--saves 30]

For each job length it saves ``--saves`` consecutive commits (one loss more each) both ways into
a temporary folder and prints the CPU and wall milliseconds per save and the ratio. The state of
a job of N steps holds N losses; a GPU step takes ~0.1-2 s, so a save of 100 ms would slow the end
of a long job by 5-100%.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.driver.state import FORMAT, JobState, StateStore, _digest  # noqa: E402


def save_as_before(folder: Path, state: JobState) -> JobState:
    """The save before bench/state_save.py's commit: the whole document encoded, decoded and
    encoded again, the file and the folder fsynced at every step."""
    state = state.evolve(version=state.version + 1, updated_at_s=time.time())
    body = json.dumps(state.to_dict(), sort_keys=True)
    document = {"format": FORMAT, "sha256": _digest(body), "state": json.loads(body)}
    temporary = folder / ".state.tmp"
    with temporary.open("w", encoding="utf-8") as handle:
        json.dump(document, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    path = folder / "state.json"
    if path.exists():
        os.replace(path, folder / "state.prev.json")
    os.replace(temporary, path)
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return state


def per_save(save, state: JobState, saves: int) -> tuple[float, float, JobState]:
    """(CPU ms, wall ms) per save over ``saves`` commits of one more loss each."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(saves):
        state = save(state.evolve(step=state.step + 1, losses=(*state.losses, random.random())))
    count = max(saves, 1)
    return (
        (time.process_time() - cpu) / count * 1e3,
        (time.perf_counter() - wall) / count * 1e3,
        state,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="1000,10000,100000")
    parser.add_argument("--saves", type=int, default=30)
    args = parser.parse_args(argv)
    random.seed(0)
    print(
        f"{'steps':>8} {'now CPU ms':>11} {'wall ms':>8} {'before CPU ms':>14} {'wall ms':>8}"
        f" {'CPU ratio':>10}"
    )
    for steps in (int(s) for s in args.steps.split(",")):
        start = JobState(
            job="bench", recipe_path="bench.yaml", phase="train", step=steps,
            losses=tuple(random.random() for _ in range(steps)),
        )  # fmt: skip
        with tempfile.TemporaryDirectory() as now_dir, tempfile.TemporaryDirectory() as old_dir:
            store = StateStore(Path(now_dir))
            state = store.save(start)  # a phase's durable save first, as a job's start does
            now_cpu, now_wall, state = per_save(
                lambda s, store=store: store.save(s, durable=False), state, args.saves
            )
            assert store.load().state == state  # what was written reads back whole
            old_cpu, old_wall, _ = per_save(
                lambda s, old_dir=old_dir: save_as_before(Path(old_dir), s), start, args.saves
            )
        print(
            f"{steps:>8} {now_cpu:>11.2f} {now_wall:>8.2f} {old_cpu:>14.2f} {old_wall:>8.2f}"
            f" {old_cpu / now_cpu:>9.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
