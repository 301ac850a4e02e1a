"""The driver against a straggling pipeline (fakes of test_driver_machine.py): it re-balances the
batch on the same nodes when the time saved beats the move, keeps the shares when it does not,
and never when told not to watch."""

from __future__ import annotations

from orchestrator.driver.events import read_events
from orchestrator.driver.machine import StepResult
from orchestrator.plan import Plan
from tests.unit.test_driver_machine import EU, US, FakeCloud, FakeTrainer, make_driver, names


class SlowTrainer(FakeTrainer):
    """Two pipelines; pipeline 1's node computes ``slow`` times slower (0.1 s per microbatch
    on pipeline 0). Reports what the runtime's counters give: seconds per microbatch per
    pipeline and the shares the running plan gives them (4 + 4 unless it says otherwise)."""

    def __init__(self, cloud, *, slow: float) -> None:
        super().__init__(cloud)
        self.slow, self.shares = slow, (4, 4)
        self.plans: list[Plan] = []
        self.same_nodes: list[bool] = []

    def start(self, plan: Plan, *, restore_step: int | None, same_nodes: bool = False) -> int:
        self.plans.append(plan)
        self.shares = plan.pipeline_microbatches or (4, 4)
        self.same_nodes.append(same_nodes)
        return super().start(plan, restore_step=restore_step)

    def step(self, step: int) -> StepResult:
        result = super().step(step)
        return StepResult(
            loss=result.loss,
            pipeline_s=(0.1, 0.1 * self.slow),
            pipeline_microbatches=self.shares,
        )


def _run(tmp_path, *, slow: float, steps: int = 100, **config):
    cloud = FakeCloud({US: 2, EU: 2})
    trainer = SlowTrainer(cloud, slow=slow)
    state = make_driver(tmp_path, cloud, trainer, steps=steps, every=10, **config).run()
    return state, trainer, cloud


def test_a_straggler_gets_a_smaller_share_on_the_same_nodes(tmp_path):
    # 2.5x slower: 4 + 4 microbatches take 1.0 s of compute, 6 + 2 take 0.6 s; 0.4 s x 95 steps
    # left beats twice the 15 s a move is guessed to cost
    state, trainer, cloud = _run(tmp_path, slow=2.5)
    assert state.phase == "done" and state.step == 100
    assert list(state.losses) == [1.0 / (k + 1) for k in range(100)]  # nothing trained twice
    assert trainer.steps_run == 100
    assert trainer.starts == [None, 5]  # restarted from the checkpoint of the move
    assert trainer.plans[-1].pipeline_microbatches == (6, 2)
    assert trainer.same_nodes == [False, True]  # each share stays with its measured node
    assert cloud.launched == 2  # the same two nodes: nothing launched for the move
    events = list(read_events(tmp_path / "job" / "events.jsonl"))
    (move,) = [e for e in events if e["event"] == "rebalancing"]
    assert move["details"] == {"step": 5, "shares": [6, 2]}
    assert "pipeline 1 computes 2.50x slower" in move["reason"]
    assert [e for e in events if e["event"] == "rebalanced"][0]["details"]["recovery_s"] > 0
    assert "rebalancing" not in names(tmp_path)[names(tmp_path).index("rebalanced") :]


def test_a_gain_smaller_than_the_move_keeps_the_shares_and_says_why(tmp_path):
    # 1.5x slower: 5 + 3 microbatches save 0.1 s per step, 1.5 s over the 15 steps left
    state, trainer, _ = _run(tmp_path, slow=1.5, steps=20)
    assert state.phase == "done" and trainer.starts == [None]
    kept = [e for e in read_events(tmp_path / "job" / "events.jsonl") if e["event"] == "straggler"]
    assert kept and "x2 margin" in kept[0]["reason"]


def test_pipelines_within_the_threshold_are_left_alone(tmp_path):
    state, trainer, _ = _run(tmp_path, slow=1.2)
    assert trainer.starts == [None] and "straggler" not in names(tmp_path)


def test_no_watching_unless_asked(tmp_path):
    _, trainer, _ = _run(tmp_path, slow=3.0, straggler_window_steps=None)
    assert trainer.starts == [None] and "rebalancing" not in names(tmp_path)
