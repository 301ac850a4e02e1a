"""Plans: strict YAML, structural checks, checks against catalog and profile, and the simulate command."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.plan import Plan, PlanError, Replica, parse_plan, plan_from_dict

REPO = Path(__file__).resolve().parents[2]
SAILOR_RECIPE = REPO / "recipes" / "sailor-opt350m-gcp-zones.yaml"
ZONE_A = "gcp/us-central1/us-central1-a"


def stage_yaml(layers: str, replicas: list[str]) -> str:
    lines = [f"  - layers: {layers}", "    replicas:"]
    return "\n".join(lines + [f"      - {r}" for r in replicas]) + "\n"


A100 = f"{{gpu: A100, tp: 1, infra: {ZONE_A}}}"


def plan_text(*stages: str, header: str = "global_batch_size: 1024\nmicrobatch_size: 2\n") -> str:
    return header + "stages:\n" + "".join(stages)


@pytest.mark.parametrize(
    ("text", "field", "line", "fragment"),
    [
        (
            plan_text(stage_yaml("[0, 13]", [A100]), stage_yaml("[12, 26]", [A100])),
            "stages[1].layers",
            7,
            "layers overlap",
        ),
        (
            plan_text(stage_yaml("[0, 13]", [A100]), stage_yaml("[14, 26]", [A100])),
            "stages[1].layers",
            7,
            "leave a gap",
        ),
        (
            plan_text(stage_yaml("[0, 13]", [A100, A100]), stage_yaml("[13, 26]", [A100])),
            "stages[1].replicas",
            9,
            "same data-parallel degree",
        ),
        (
            plan_text(stage_yaml("[0, 26]", [f"{{gpu: A100, tp: 3, infra: {ZONE_A}}}"])),
            "stages[0].replicas[0].tp",
            6,
            "power of two",
        ),
        (
            plan_text(
                stage_yaml("[0, 26]", [A100]),
                header="global_batch_size: 1024\nmicrobatch_size: 3\n",
            ),
            "microbatch_size",
            2,
            "not divisible",
        ),
        (plan_text(stage_yaml("[0, 26]", [A100] * 3)), "stages", 3, "cannot be split evenly"),
        (
            plan_text(
                stage_yaml("[0, 26]", [A100]),
                header="global_batch_size: 1024\nmicrobatch_size: 2\nstreamz: 4\n",
            ),
            "streamz",
            3,
            "did you mean 'streams'",
        ),
        (
            plan_text(stage_yaml("[0, 26]", [f"{{gpu: A100, infra: {ZONE_A}, spto: true}}"])),
            "stages[0].replicas[0].spto",
            6,
            "did you mean 'spot'",
        ),
        (
            plan_text(
                stage_yaml("[0, 13]", [A100]),
                stage_yaml("[13, 26]", [A100]),
                header="global_batch_size: 8\nmicrobatch_size: 1\npipeline_warmup: [0, 1]\n",
            ),
            "pipeline_warmup",
            3,
            "do not increase",
        ),
        (
            plan_text(
                stage_yaml("[0, 26]", [A100]),
                header="global_batch_size: 1024\nmicrobatch_size: 2\n"
                "allreduce: flat\ncompression: int8\n",
            ),
            "compression",
            4,
            "hierarchical",
        ),
    ],
)
def test_bad_plan_names_field_and_line(text, field, line, fragment):
    with pytest.raises(PlanError) as info:
        parse_plan(text, file="plan.yaml")
    error = info.value
    assert (error.field, error.line) == (field, line), error.render()
    assert fragment in error.message and error.fix


def test_plan_round_trips_through_yaml():
    text = plan_text(stage_yaml("[0, 13]", [A100, A100]), stage_yaml("[13, 26]", [A100, A100]))
    plan = parse_plan(text, file="plan.yaml")
    again = parse_plan(plan.to_yaml(), file="again.yaml")
    assert again == plan and again.microbatches() == (256, 256)


def test_plan_round_trips_through_its_stored_form():
    """The driver keeps its plan as JSON in the job's state and builds it back without YAML."""
    text = plan_text(stage_yaml("[0, 13]", [A100, A100]), stage_yaml("[13, 26]", [A100, A100]))
    plan = parse_plan(text, file="plan.yaml")
    shared = dataclasses.replace(plan, pipeline_microbatches=(300, 212))
    for original in (plan, shared):
        stored = json.loads(json.dumps(original.to_dict()))
        assert stored == original.to_dict()  # plain lists: what a reload reads
        assert plan_from_dict(stored) == original
        assert plan_from_dict(dataclasses.asdict(original)) == original
    with pytest.raises(PlanError, match="unknown plan fields"):
        plan_from_dict({**plan.to_dict(), "stagez": []})
    with pytest.raises(PlanError):  # checked as a parsed plan is
        plan_from_dict({**plan.to_dict(), "pipeline_microbatches": [5, 5]})


A100_A = Replica(gpu="A100", infra=ZONE_A)
V100_B = Replica(gpu="V100", infra="gcp/us-central1/us-central1-b")


def _compact(pipelines, **options) -> Plan:
    """A plan of two stages (layers 0-10, 10-26) built from kinds of pipeline."""
    return Plan.from_pipelines(
        global_batch_size=48,
        microbatch_size=2,
        layers=[(0, 10), (10, 26)],
        pipelines=pipelines,
        **options,
    )


def test_compact_construction_matches_the_expanded_plan():
    a, b = A100_A, V100_B
    compact = _compact([(2, [a, a]), (1, [b, a])])
    parsed = parse_plan(compact.to_yaml(), file="p.yaml")
    assert parsed == compact
    assert compact.stage_kinds == parsed.stage_kinds and compact.kind_of == parsed.kind_of
    assert compact.pipeline_groups == parsed.pipeline_groups == ((0, 2), (2, 1))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


def test_simulate_json_has_the_documented_keys(tmp_path, capsys):
    assert (
        main(
            [
                "simulate",
                str(SAILOR_RECIPE),
                "--plan",
                str(REPO / "recipes/plans/sailor-opt350m-4zones.yaml"),
                "--json",
            ]
        )
        == 0
    )
    document = json.loads(capsys.readouterr().out)
    for key in (
        "iteration_time_s",
        "samples_per_s",
        "peak_memory_bytes",
        "oom",
        "cost_per_hour_usd",
        "cost_per_iteration_usd",
        "egress_usd_per_iteration",
        "cost_per_million_samples_usd",
        "granularity",
        "breakdown",
        "profile_source",
    ):
        assert key in document
    assert document["profile_source"] == "imported"
    assert len(document["peak_memory_bytes"]) == 4 and len(document["peak_memory_bytes"][0]) == 8
    assert {"stages", "memory", "egress", "bottleneck"} <= set(document["breakdown"])


def test_simulate_table(capsys):
    assert (
        main(
            [
                "simulate",
                str(REPO / "recipes/quickstart.yaml"),
                "--plan",
                str(REPO / "recipes/plans/quickstart.yaml"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "samples/s" in out
        and "estimated" in out
        and "per 1M samples" in out
        and "granularity" in out
    )


@pytest.mark.parametrize(
    ("replica", "fragment"),
    [
        (f"{{gpu: A1000, infra: {ZONE_A}}}", "unknown GPU 'A1000' (did you mean 'A100'?)"),
        ("{gpu: A100, infra: gcp/us-central1/us-central1-zz}", "unknown zone"),
        (
            "{gpu: A100, infra: gcp/us-central1/us-central1-q}",
            "no A100 offer in gcp/us-central1/us-central1-q",
        ),
        ("{gpu: A100, infra: gcp}", "names a whole cloud"),
        (f"{{gpu: T4, tp: 8, infra: {ZONE_A}}}", "tp=8 is larger than any T4 node"),
        ("{gpu: A100, infra: gcp/australia-southeast1}", "no A100 offer"),
        (f"{{gpu: A100, tp: 8, infra: {ZONE_A}}}", "no times at TP=8"),
    ],
)
def test_simulate_rejects_plans_that_cannot_run(tmp_path, capsys, replica, fragment):
    recipe = (
        SAILOR_RECIPE
        if "T4" not in replica
        else REPO / "recipes" / "erben-roberta-xlm-t4-4continents.yaml"
    )
    layers = "[0, 26]" if "T4" not in replica else "[0, 26]"
    batch = 1024 if "T4" not in replica else 32768
    text = plan_text(
        stage_yaml(layers, [replica]), header=f"global_batch_size: {batch}\nmicrobatch_size: 8\n"
    )
    assert main(["simulate", str(recipe), "--plan", str(write(tmp_path, text))]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "To fix:" in err and "Traceback" not in err


def test_simulate_rejects_a_plan_for_another_model(tmp_path, capsys):
    text = plan_text(stage_yaml("[0, 20]", [A100]))
    assert main(["simulate", str(SAILOR_RECIPE), "--plan", str(write(tmp_path, text))]) == 2
    assert "has 26 layers" in capsys.readouterr().err


def test_simulate_rejects_another_batch(tmp_path, capsys):
    text = plan_text(
        stage_yaml("[0, 26]", [A100]), header="global_batch_size: 512\nmicrobatch_size: 2\n"
    )
    assert main(["simulate", str(SAILOR_RECIPE), "--plan", str(write(tmp_path, text))]) == 2
    assert "differs from the recipe's 1024" in capsys.readouterr().err


@pytest.mark.parametrize(
    "shares, groups",
    [
        ((5, 5, 5, 5, 4), ((0, 2), (2, 2), (4, 1))),
        # replicas 1 and 4: the same kind of pipeline and as many microbatches, though built
        # from two entries of the list
        ((6, 4, 5, 5, 4), ((0, 1), (1, 2), (2, 2))),
    ],
)
def test_compact_construction_with_unequal_shares_groups_as_the_expanded_plan(shares, groups):
    a, b = A100_A, V100_B
    compact = _compact([(2, [a, a]), (2, [b, a]), (1, [a, a])], pipeline_microbatches=shares)
    parsed = parse_plan(compact.to_yaml(), file="p.yaml")  # its shape found replica by replica
    assert parsed == compact
    assert compact.stage_kinds == parsed.stage_kinds and compact.kind_of == parsed.kind_of
    assert compact.pipeline_groups == parsed.pipeline_groups == groups
