"""MarketPlans turns a recipe's deadline into the throughput the rest of the job needs now;
ProvisionerCloud turns the provider's typed errors into the driver's: capacity and quota into a
refused place (with the cloud's fix), rejected credentials into a stop, an API failure into a loss
that the retry budget retries."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.driver.market_plans import MarketPlans
from orchestrator.recipe import parse_recipe

RECIPE = """\
name: due
provider: local
model: {name: gpt-tiny, profile: analytic}
training: {global_batch_size: 8, microbatch_sizes: [2], steps: 100, precision: fp32}
objective: {goal: min_cost, deadline_h: 1.0}
constraints: {gpu_types: [T4], pricing: spot}
"""


def _floor(progress) -> tuple[float | None, float | None]:
    recipe = parse_recipe(RECIPE, file="due.yaml", folder=Path("."))
    plans = MarketPlans(recipe, catalog=None, provisioner=None, progress=progress)
    objective = plans._with_deadline_left().objective
    return objective.min_throughput_samples_per_s, objective.deadline_h


def test_before_any_progress_the_recipe_is_planned_as_written():
    assert _floor(lambda: (0, 0.0)) == (None, 1.0)


def test_the_floor_is_what_the_remaining_steps_need_in_the_time_left():
    floor, deadline = _floor(lambda: (50, 1800.0))  # half the steps, half the hour
    assert deadline is None and floor == pytest.approx(50 * 8 / 1800)
    late, _ = _floor(lambda: (50, 3600.0 * 2))  # past the deadline: as fast as one minute needs
    assert late == pytest.approx(50 * 8 / 60)


class _Failing:
    """A provisioner whose launch raises ``error``."""

    cloud = "aws"

    def __init__(self, error) -> None:
        self.error = error

    def launch(self, request):
        raise self.error


def _launch_with(error):
    from orchestrator.driver.contract import Request
    from orchestrator.driver.world import ProvisionerCloud

    cloud = ProvisionerCloud(_Failing(error), launch_timeout_s=60.0)
    request = Request(infra="aws/us-east-1/us-east-1a", gpu="T4", count=1, spot=True,
                      usd_per_node_hour=0.2, instance_type="g4dn.xlarge")  # fmt: skip
    cloud.launch(request, gang="g")


def test_the_providers_errors_become_the_drivers():
    from orchestrator.driver.contract import CapacityRefused, JobBroken, WorkersLost
    from provisioners.base import CloudCallError, CredentialsMissing, QuotaError

    args = {"cloud": "aws", "call": "ec2.run_instances"}
    with pytest.raises(CapacityRefused) as refused:
        _launch_with(QuotaError("VcpuLimitExceeded: no", fix="ask for more vCPUs", **args))
    assert refused.value.infra == "aws/us-east-1/us-east-1a"
    assert refused.value.fix == "ask for more vCPUs" and "ec2.run_instances" in str(refused.value)
    with pytest.raises(JobBroken) as broken:
        _launch_with(CredentialsMissing("AuthFailure: keys rejected", fix="rotate them", **args))
    assert broken.value.cause == "cloud" and "aws: ec2.run_instances" in broken.value.message
    with pytest.raises(WorkersLost, match="ec2.run_instances failed: an error page"):
        _launch_with(CloudCallError("an error page", fix="try later", **args))


def test_refused_everywhere_is_one_line_grouped_by_the_clouds_answer():
    from orchestrator.driver.failures import refused_everywhere

    zone = "aws/us-east-1/us-east-1"
    broken = refused_everywhere(
        {
            zone + "a": (
                "ec2.run_instances: InsufficientInstanceCapacity: none in a.",
                "try later",
            ),
            zone + "b": (
                "ec2.run_instances: InsufficientInstanceCapacity: none in b.",
                "try later",
            ),
            "aws/eu-west-1/eu-west-1a": ("ec2.run_instances: VcpuLimitExceeded: 0 vCPUs", "ask"),
        }
    )
    assert broken.cause == "capacity" and "\n" not in broken.message
    assert (
        f"ec2.run_instances answered InsufficientInstanceCapacity in {zone}a, {zone}b"
        in broken.message
    )
    assert "VcpuLimitExceeded in aws/eu-west-1/eu-west-1a" in broken.message
    assert broken.fix.startswith("try later; ask; or allow more locations")


def test_times_measured_on_the_jobs_nodes_replace_the_estimate_in_the_next_plan():
    """profile: auto on a real cloud: the estimate first; once the T4 is measured (here: this
    CPU standing in, slower than any T4), plans are predicted on the measured times."""
    from orchestrator.catalog import default_catalog
    from orchestrator.profiles.measured import measured_profile
    from runtime.models.specs import model_spec
    from runtime.profiler import ProfilerConfig, profile_gpt

    text = RECIPE.replace("provider: local", "provider: gcp").replace("analytic", "auto")
    text = text.replace("min_cost, deadline_h: 1.0", "max_throughput").replace(
        "pricing: spot}", "pricing: spot, max_gpus: 2, locations: [gcp/us-central1]}"
    )
    recipe = parse_recipe(text, file="auto.yaml", folder=Path("."))
    catalog = default_catalog()
    plans = MarketPlans(recipe, catalog, provisioner=None, progress=lambda: (0, 0.0))
    plans.market = lambda held, held_only=False: catalog.market("gcp")
    estimated = plans.choose(excluded=frozenset(), held={})
    assert plans.unmeasured(estimated.plan) == ("T4",)
    config = ProfilerConfig(microbatch_sizes=(2,), repeats=1, warmup=1)
    slow = measured_profile(profile_gpt(model_spec("gpt-tiny"), config), gpu="T4", precision="fp32")
    plans.learn("T4", slow)
    assert plans.unmeasured(estimated.plan) == ()
    measured = plans.choose(excluded=frozenset(), held={})
    assert measured.samples_per_s < 0.7 * estimated.samples_per_s  # a CPU slot is no T4
    # what was not measured (TP 2) is the estimate calibrated by the measured TP 1
    profile = plans.node_profiles.measured  # laid over the estimate when planning
    from orchestrator.profiles import profile_for_recipe
    from orchestrator.profiles.profile import overlaid

    estimate = profile_for_recipe(recipe, ["T4"], catalog, microbatch_sizes=(2,), tp_degrees=(1, 2))
    both = overlaid(estimate, profile)
    ratio = both.time_table("T4", 2, 1).forward_s[1] / estimate.time_table("T4", 2, 1).forward_s[1]
    assert both.time_table("T4", 2, 2).forward_s[1] == pytest.approx(
        estimate.time_table("T4", 2, 2).forward_s[1] * ratio
    )
    local = parse_recipe(RECIPE.replace("analytic", "auto"), file="l.yaml", folder=Path("."))
    assert MarketPlans(local, catalog, provisioner=None).unmeasured(estimated.plan) == ()
