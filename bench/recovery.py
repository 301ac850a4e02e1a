"""Recovery time on the local simulated cloud: from a node's loss to the first resumed step.

Usage: python bench/recovery.py [--path replica|checkpoint|driver] [--preemptions 10] [--every 15]
                                [--notice-s 0.5] [--vms processes|namespaces]

Submits a gpt-tiny job (2 data-parallel workers on 2 nodes, checkpoint every 5 steps) on the local
cloud and has the market take a node every ``--every`` steps, one of three ways:

- ``replica`` (target (a) <= 5 s): a worker's node is taken *without notice* in the middle of a
  checkpoint period; the other replica of its stage survives. The driver has that replica write
  its state (the last committed step's: the dead one's step never reached the optimizer) and
  restarts from it on the node left, without waiting for a replacement to boot (one is weighed at
  the next periodic re-plan); nothing is trained again. Timed from the market's kill (its
  ``chaos`` event) to the first step committed after it. One job per loss.
- ``checkpoint`` (target (b) <= 15 s): a notice first, then the node's death ``--notice-s`` market
  seconds later; the driver checkpoints the step just committed, lets the node go and restarts
  from that checkpoint. Timed from the notice.
- ``driver``: the node the driver itself runs on is taken (with notice); Ray restarts the driver
  on another node and it takes the running workers over. Timed from the dead driver's last write
  of the job's state (it lived until then) to its first committed step.

Each recovery's seconds come from the job's event log; the state gives the steps trained twice.
``--vms namespaces`` runs it on namespace VMs (root; docs/bootstrap.md): a replacement node then
boots by the node bootstrap and joins over WireGuard, and the job's traffic is encrypted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.cli import main as cli  # noqa: E402

RECIPE = """\
name: recovery-bench
provider: local
model: {{name: gpt-tiny, profile: auto}}
training:
  global_batch_size: 8
  microbatch_sizes: [2]
  steps: {steps}
  optimizer: {{name: adamw, lr: 1.0e-3, grad_clip_norm: null}}
objective: {{goal: max_throughput}}
constraints:
  locations: [local/sim-us/sim-us-a, local/sim-us/sim-us-b]
  gpu_types: [T4]
  max_gpus: 2
  pricing: spot
checkpointing: {{every_steps: 5, path: {checkpoints}, keep_last: 2}}
runtime: {{allreduce: flat, link_emulation: false}}
"""


def recovery_times(events: list[dict], path: str) -> list[float]:
    """Seconds to the first step after each loss: ``recovered`` events (timed from the notice,
    or the dead driver's last write); for ``replica``, from each no-notice kill's ``chaos`` event
    to the next ``recovered`` one."""
    if path != "replica":
        return [e["details"]["recovery_s"] for e in events if e["event"] == "recovered"]
    times, killed_at = [], None
    for event in events:
        if event["event"] == "chaos" and event["details"]["kind"] == "lose":
            killed_at = event["time_s"]
        elif event["event"] == "recovered" and killed_at is not None:
            times.append(event["time_s"] - killed_at)
            killed_at = None
    return times


def _run(args, steps: int, at: list[int]) -> tuple[int, list[dict], dict]:
    """One job on the local cloud with the market taking nodes after the steps ``at``."""
    option = {"replica": "--lose-at", "checkpoint": "--preempt-at", "driver": "--preempt-driver-at"}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        recipe = root / "bench.yaml"
        recipe.write_text(RECIPE.format(steps=steps, checkpoints=root / "checkpoints"))
        command = ["submit", str(recipe), "--jobs-dir", str(root / "jobs"), "--quiet"]
        command += ["--notice-s", str(args.notice_s), "--vms", args.vms]
        for step in at:
            command += [option[args.path], str(step)]
        code = cli(command)
        folder_ = root / "jobs" / "recovery-bench"
        events = [json.loads(line) for line in (folder_ / "events.jsonl").open()]
        state = json.loads((folder_ / "state.json").read_text())["state"]
    return code, events, state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=("replica", "checkpoint", "driver"), default="replica")
    parser.add_argument("--preemptions", type=int, default=10)
    parser.add_argument("--every", type=int, default=15, help="steps between preemptions")
    parser.add_argument("--notice-s", type=float, default=0.5)
    parser.add_argument("--vms", choices=("processes", "namespaces"), default="processes")
    args = parser.parse_args()
    steps = args.every * (args.preemptions + 1)
    # mid-period (checkpoints every 5 steps): a rollback would cost 2 steps
    at = [k * args.every + 2 for k in range(1, args.preemptions + 1)]
    if args.path in ("driver", "replica"):
        # one job per loss: a restarted driver runs on the head, which the market cannot take;
        # after a rescue the job trains on its one node left (a second loss would leave no
        # replica)
        runs = [_run(args, 3 * args.every, [args.every + 2]) for _ in at]
        code = max(r[0] for r in runs)
        events = [e for r in runs for e in r[1]]
        state = {
            "trained_steps": sum(r[2]["trained_steps"] for r in runs),
            "step": sum(r[2]["step"] for r in runs),
        }
    else:
        code, events, state = _run(args, steps, at)
    times = recovery_times(events, args.path)
    kinds = [e["event"] for e in events]
    print(
        f"\nexit {code}; path {args.path} on {args.vms}: {kinds.count('chaos')} taken by the market, "
        f"{kinds.count('preemption_notice')} notices, {kinds.count('node_lost')} lost without "
        f"notice, {kinds.count('rescued')} rescued from a surviving replica, "
        f"{kinds.count('driver_restarted')} driver restarts; "
        f"{state['trained_steps'] - state['step']} steps trained twice; {len(times)} recoveries "
        "(seconds to the first step after the loss):"
    )
    print("  " + ", ".join(f"{t:.1f}" for t in times))
    target = {"replica": " (target <= 5 s)", "checkpoint": " (target <= 15 s)"}.get(args.path, "")
    if times:
        print(
            f"median {statistics.median(times):.1f} s{target}, "
            f"min {min(times):.1f} s, max {max(times):.1f} s"
        )


if __name__ == "__main__":
    main()
