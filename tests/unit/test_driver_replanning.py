"""The driver's re-planning against the fakes of test_driver_machine: capacity that comes back
(switch when the gain beats the move, keep the plan and say why once), no room after a loss (wait
for the market, or stop and keep the job), and a deadline that outweighs the price."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.driver.events import read_events
from orchestrator.driver.machine import Choice, Request
from tests.unit.test_driver_machine import (
    EU,
    US,
    FakeCloud,
    FakePlans,
    FakeTrainer,
    make_driver,
    names,
    plan_in,
)


class CapacityPlans(FakePlans):
    """US when the cloud has room for two nodes there (its own held ones count), at twice EU's
    rate; else EU."""

    def __init__(self, cloud: FakeCloud, us_rate: float = 20.0) -> None:
        super().__init__()
        self.cloud, self.us_rate = cloud, us_rate

    def choose(
        self, *, excluded: frozenset[str], held: dict[str, int], held_only: bool = False
    ) -> Choice:
        self.asked.append(excluded)
        room = self.cloud.capacity.get(US, 0) + held.get(US, 0)
        place, rate = (US, self.us_rate) if room >= 2 and US not in excluded else (EU, 10.0)
        request = Request(infra=place, gpu="T4", count=2, spot=True, usd_per_node_hour=0.5)
        return Choice(
            plan=plan_in(place),
            summary=f"2 x T4 in {place}",
            requests=(request,),
            samples_per_s=rate,
            usd_per_hour=1.0,
        )


def _capacity_returns_at_step_8(tmp_path, *, us_rate: float, **config):
    """EU first (no room in US); at step 8 US has room again, at ``us_rate`` samples/s."""
    cloud = FakeCloud({US: 0, EU: 2})
    trainer = FakeTrainer(cloud, {8: lambda t: cloud.capacity.update({US: 2})})
    plans = CapacityPlans(cloud, us_rate=us_rate)
    driver = make_driver(
        tmp_path, cloud, trainer, steps=40, plans=plans, samples_per_step=100, **config
    )
    return driver.run(), trainer, cloud, plans


def test_capacity_coming_back_switches_plans_when_the_gain_beats_the_move(tmp_path):
    state, trainer, cloud, _ = _capacity_returns_at_step_8(
        tmp_path, us_rate=20.0, replan_every_steps=5
    )
    assert state.phase == "done" and state.step == 40 and state.recoveries == 0
    assert list(state.losses) == [1.0 / (k + 1) for k in range(40)]
    assert trainer.steps_run == 40  # the move lost nothing
    assert trainer.starts == [None, 10]  # restarted from the checkpoint of the move
    events = list(read_events(tmp_path / "job" / "events.jsonl"))
    (switch,) = [e for e in events if e["event"] == "switching"]
    assert switch["plan_before"] == f"2 x T4 in {EU}" and switch["plan_after"] == f"2 x T4 in {US}"
    assert switch["details"]["step"] == 10  # the first look after the capacity came back
    assert [e for e in events if e["event"] == "switched"][0]["details"]["recovery_s"] > 0
    assert set(cloud.terminated) >= {"n1", "n2"}  # the EU nodes let go of


def test_a_small_gain_keeps_the_plan_and_says_why_once(tmp_path):
    # 5% faster: 14 s saved over the 30 steps left, against 2 x 15 s to move
    state, trainer, _, _ = _capacity_returns_at_step_8(tmp_path, us_rate=10.5, replan_every_steps=5)
    assert state.phase == "done" and trainer.starts == [None]
    kinds = names(tmp_path)
    assert "switching" not in kinds and kinds.count("plan_kept") == 1


def test_no_replanning_unless_asked(tmp_path):
    _, trainer, _, plans = _capacity_returns_at_step_8(tmp_path, us_rate=20.0)
    assert len(plans.asked) == 1 and trainer.starts == [None]


def _lose_all_room_at_step_7(tmp_path, *, come_back_after_polls: int, wait_s: float):
    """Two nodes in US, the only place; at step 7 one dies and US has no room left."""
    cloud = FakeCloud({US: 2})

    def squeeze(trainer) -> None:
        cloud.capacity[US] = -1  # the dead node's slot is not given back either
        cloud.returns[US] = (cloud.polls + come_back_after_polls, 2)
        cloud.kill(trainer.nodes[0])

    trainer = FakeTrainer(cloud, {7: squeeze})
    driver = make_driver(
        tmp_path, cloud, trainer, plans=FakePlans(places=(US,)), capacity_wait_s=wait_s
    )
    return driver.run(), trainer


def test_no_room_after_a_loss_waits_for_the_market_and_resumes(tmp_path):
    state, trainer = _lose_all_room_at_step_7(tmp_path, come_back_after_polls=5, wait_s=60)
    assert state.phase == "done" and state.step == 20
    assert list(state.losses) == [1.0 / (k + 1) for k in range(20)]
    kinds = names(tmp_path)
    assert kinds.count("waiting_for_capacity") == 1 and "no_plan" not in kinds


def test_no_room_for_longer_than_the_wait_stops_and_keeps_the_job(tmp_path):
    state, _ = _lose_all_room_at_step_7(tmp_path, come_back_after_polls=10**6, wait_s=20)
    assert state.phase == "failed" and state.step == 5  # back at its checkpoint, kept
    kinds = names(tmp_path)
    assert kinds.index("waiting_for_capacity") < kinds.index("no_plan")


def test_a_plan_that_would_miss_the_deadline_is_left_even_at_a_higher_price(tmp_path):
    """Goal min_cost: the dearer US plan (20 samples/s at $4/h) costs more to finish than EU's
    (10 samples/s at $1/h), but 30 steps x 100 samples left in 200 s need 15 samples/s."""

    class DearUS(CapacityPlans):
        def choose(self, *, excluded, held, held_only=False) -> Choice:
            choice = super().choose(excluded=excluded, held=held, held_only=held_only)
            return replace(choice, usd_per_hour=4.0) if US in choice.summary else choice

    cloud = FakeCloud({US: 0, EU: 2})
    trainer = FakeTrainer(cloud, {8: lambda t: cloud.capacity.update({US: 2})})
    common = dict(steps=40, samples_per_step=100, replan_every_steps=5, goal="min_cost")
    for deadline_s, switches in ((10**6, 0), (220.0, 1)):
        folder = tmp_path / str(switches)
        cloud.capacity.update({US: 0, EU: 2})
        trainer.script = {8: lambda t: cloud.capacity.update({US: 2})}
        driver = make_driver(
            folder, cloud, trainer, plans=DearUS(cloud), deadline_s=deadline_s, **common
        )
        driver.wall = lambda d=driver: d.state.started_at_s + 20.0  # 20 s into the job
        state = driver.run()
        assert state.phase == "done"
        assert names(folder).count("switching") == switches
