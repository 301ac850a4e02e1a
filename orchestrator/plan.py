"""The Plan: which GPUs in which places run which layers (DESIGN.md's stage-major format).

    global_batch_size: 64
    microbatch_size: 1
    stages:                       # pipeline stages in order; layers are half-open ranges
      - layers: [0, 12]
        replicas:                 # data-parallel replicas of this stage; same count in every stage
          - {gpu: A100, tp: 4, infra: gcp/us-central1/us-central1-a, spot: true}
      - layers: [12, 26]
        replicas: [...]

Replica i of every stage forms pipeline i. The planner writes plans, the simulator and the driver
read them, a user may write one by hand. ``check_plan`` finds structural mistakes (layers missing or
overlapping, unequal DP across stages, microbatch counts that do not add up); checks against the
catalog and the model profile live with the simulator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from orchestrator.errors import UserError
from orchestrator.recipe import limits as L
from orchestrator.recipe.binder import Binder, described
from orchestrator.yamlsrc import (
    PLAN_LIMITS,
    YamlDoc,
    YamlSyntaxError,
    load_yaml_text,
    path_text,
    read_user_text,
)


class PlanError(UserError):
    """A plan is malformed or impossible; names the file, line and field when it came from YAML."""


class _cached:
    """``functools.cached_property`` without its lock: Python 3.11 takes a lock on every first
    access, a cost the planner pays several times per candidate plan; plans are built and read by
    one thread."""

    def __init__(self, compute) -> None:
        self.compute, self.__doc__ = compute, compute.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, plan, owner: type | None = None):
        if plan is None:
            return self
        value = plan.__dict__[self.name] = self.compute(plan)
        return value


_help = described  # a field with its "what to write" and its limits


@dataclass(frozen=True, kw_only=True, eq=False)
class Replica:
    gpu: str = _help("GPU type, e.g. A100")
    tp: int = _help(
        "tensor-parallel degree: GPUs of one node that hold this replica (1, 2, 4, 8)",
        default=1,
        most=L.MAX_TENSOR_PARALLEL,
    )
    infra: str = _help("place, cloud/region[/zone], e.g. gcp/us-central1/us-central1-a")
    spot: bool = _help("true for a spot VM, false for on-demand", default=True)
    instance_type: str | None = _help(
        "VM type to price this replica with; default: the cheapest that fits", default=None
    )

    def __post_init__(self) -> None:
        # the simulator groups replicas by kind in its inner loop: hash once, and keep the fields
        # as a tuple, a key whose hash and comparison cost no Python call (environment.py)
        key = (self.gpu, self.tp, self.infra, self.spot, self.instance_type)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not Replica or self._hash != other._hash:
            return False
        return self._key == other._key

    @property
    def gpus(self) -> int:
        return self.tp


@dataclass(frozen=True, kw_only=True)
class Stage:
    layers: tuple[int, ...] = _help(
        "half-open layer range [first, end), e.g. [0, 12]", most=L.MAX_LAYER_INDEX, items=2
    )
    replicas: tuple[Replica, ...] = _help(
        "the data-parallel replicas of this stage", items=L.MAX_PLAN_REPLICAS
    )

    @property
    def first_layer(self) -> int:
        return self.layers[0]

    @property
    def end_layer(self) -> int:
        return self.layers[1]


@dataclass(frozen=True, kw_only=True)
class Plan:
    global_batch_size: int = _help("samples per optimizer step", most=L.MAX_GLOBAL_BATCH_SIZE)
    microbatch_size: int = _help("samples per microbatch", most=L.MAX_GLOBAL_BATCH_SIZE)
    stages: tuple[Stage, ...] = _help("pipeline stages in order", items=L.MAX_PLAN_STAGES)
    allreduce: Literal["flat", "hierarchical"] = _help(
        "gradient sync across replicas: flat (one ring) or hierarchical (zone, region, then across regions)",
        default="hierarchical",
    )
    compression: Literal["none", "fp16", "int8"] = _help(
        "compression of the cross-region hop", default="none"
    )
    streams: int = _help(
        "parallel TCP streams per cross-region link", default=8, most=L.MAX_STREAMS
    )
    pipeline_warmup: tuple[int, ...] | None = _help(
        "warm-up microbatches per stage (non-increasing); default: standard 1F1B, P - s - 1. More hides "
        "long links at the cost of activation memory",
        default=None,
        most=L.MAX_GLOBAL_BATCH_SIZE,
        items=L.MAX_PLAN_STAGES,
    )
    pipeline_microbatches: tuple[int, ...] | None = _help(
        "microbatches per pipeline when pipelines get unequal shares; must add up to "
        "global_batch_size / microbatch_size",
        default=None,
        most=L.MAX_GLOBAL_BATCH_SIZE,
        items=L.MAX_PLAN_REPLICAS,
    )

    @_cached
    def warmup(self) -> tuple[int, ...]:
        """Warm-up forwards per stage: the plan's, or standard 1F1B's ``P - s - 1``."""
        if self.pipeline_warmup is not None:
            return self.pipeline_warmup
        return tuple(range(self.num_stages - 1, -1, -1))  # P - s - 1 for each stage s

    @_cached
    def num_stages(self) -> int:
        return len(self.stages)

    @_cached
    def dp_degree(self) -> int:
        return len(self.stages[0].replicas)

    @property
    def num_layers(self) -> int:
        return self.stages[-1].end_layer

    @property
    def total_gpus(self) -> int:
        return sum(r.tp for s in self.stages for r in s.replicas)

    def microbatches(self) -> tuple[int, ...]:
        """Microbatches each pipeline runs per iteration."""
        return self._microbatches

    @_cached
    def _microbatches(self) -> tuple[int, ...]:
        if self.pipeline_microbatches is not None:
            return self.pipeline_microbatches
        per_pipeline = self.global_batch_size // (self.microbatch_size * self.dp_degree)
        return (per_pipeline,) * self.dp_degree

    def with_warmup(self, warmup: tuple[int, ...]) -> Plan:
        """This plan with another warm-up; the replica grouping the simulator uses carries over."""
        plan = dataclasses.replace(self, pipeline_warmup=tuple(warmup))
        for cached in ("_shape", "_microbatches", "num_stages", "dp_degree"):
            if cached in self.__dict__:
                plan.__dict__[cached] = self.__dict__[cached]
        return plan

    @classmethod
    def from_pipelines(
        cls,
        *,
        global_batch_size: int,
        microbatch_size: int,
        layers: Sequence[tuple[int, int]],
        pipelines: Sequence[tuple[int, Sequence[Replica]]],
        **options,
    ) -> Plan:
        """A plan from kinds of pipeline: ``pipelines`` lists (how many, one replica per stage).
        Planners build plans this way: the simulator's grouping comes with the plan for free."""
        stages = tuple(
            Stage(
                layers=tuple(span),
                replicas=tuple(r for count, row in pipelines for r in [row[s]] * count),
            )
            for s, span in enumerate(layers)
        )
        plan = cls(
            global_batch_size=global_batch_size,
            microbatch_size=microbatch_size,
            stages=stages,
            **options,
        )
        kinds, kind_of = [], []
        for s in range(len(layers)):
            index: dict[Replica, int] = {}
            counts: list[int] = []
            order: list[int] = []
            for count, row in pipelines:
                k = index.setdefault(row[s], len(index))
                if k == len(counts):
                    counts.append(0)
                counts[k] += count
                order += [k] * count
            kinds.append(tuple(zip(index, counts, strict=True)))
            kind_of.append(tuple(order))
        if plan.pipeline_microbatches is None:  # equal shares: each kind of pipeline runs alike
            first, groups = 0, []
            for count, _ in pipelines:
                groups.append((first, count))
                first += count
        else:
            groups = _share_groups(pipelines, kind_of, plan.microbatches())
        plan.__dict__["_shape"] = (tuple(kinds), tuple(kind_of), tuple(groups))
        return plan

    @_cached
    def _shape(self) -> tuple[tuple, tuple, tuple]:
        kinds, kind_of = [], []
        for stage in self.stages:
            index: dict[Replica, int] = {}
            counts: list[int] = []
            order = []
            for replica in stage.replicas:
                k = index.setdefault(replica, len(index))
                if k == len(counts):
                    counts.append(0)
                counts[k] += 1
                order.append(k)
            kinds.append(tuple(zip(index, counts, strict=True)))
            kind_of.append(tuple(order))
        groups: dict[tuple, list[int]] = {}
        micro = self.microbatches()
        for i in range(self.dp_degree):
            groups.setdefault((micro[i], *(column[i] for column in kind_of)), []).append(i)
        pipelines = tuple((members[0], len(members)) for members in groups.values())
        return tuple(kinds), tuple(kind_of), pipelines

    @property
    def stage_kinds(self) -> tuple[tuple[tuple[Replica, int], ...], ...]:
        """Per stage, its distinct replicas and how many times each appears."""
        return self._shape[0]

    @property
    def kind_of(self) -> tuple[tuple[int, ...], ...]:
        """Per stage, per replica: the index of its kind in ``stage_kinds``."""
        return self._shape[1]

    @property
    def pipeline_groups(self) -> tuple[tuple[int, int], ...]:
        """Distinct pipelines as (index of one of them, how many): the same kinds of replica in every
        stage and the same microbatch count run alike."""
        return self._shape[2]

    def to_dict(self) -> dict:
        """Plain JSON/YAML data: lists, not tuples (what a stored copy reads back as)."""
        document = dataclasses.asdict(self)
        document["stages"] = list(document["stages"])
        for stage in document["stages"]:
            stage["layers"] = list(stage["layers"])
            stage["replicas"] = list(stage["replicas"])
            for replica in stage["replicas"]:
                if replica["instance_type"] is None:
                    del replica["instance_type"]
        for optional in ("pipeline_microbatches", "pipeline_warmup"):
            if document[optional] is None:
                del document[optional]
            else:
                document[optional] = list(document[optional])
        return document

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)


def plan_from_dict(document: dict) -> Plan:
    """A plan from its ``to_dict`` form (or ``dataclasses.asdict``'s), as the driver keeps it in
    its state: built directly, then checked; no YAML between."""
    fields = {f.name for f in dataclasses.fields(Plan)}
    unknown = set(document) - fields
    if unknown:
        raise PlanError(f"unknown plan fields {sorted(unknown)}", fix="a plan as to_dict writes it")
    stages = tuple(
        Stage(
            layers=tuple(stage["layers"]),
            replicas=tuple(Replica(**replica) for replica in stage["replicas"]),
        )
        for stage in document["stages"]
    )
    values = {**document, "stages": stages}
    for optional in ("pipeline_microbatches", "pipeline_warmup"):
        if values.get(optional) is not None:
            values[optional] = tuple(values[optional])
    plan = Plan(**values)
    check_plan(plan)
    return plan


def parse_plan(text: str, *, file: str) -> Plan:
    """Parse plan YAML strictly and check its structure; raise PlanError naming file, line, field."""
    try:
        doc = load_yaml_text(text, file=file, limits=PLAN_LIMITS)
    except YamlSyntaxError as exc:
        raise PlanError(exc.message, file=file, line=exc.line, fix="correct the YAML") from None
    try:
        plan = Binder(doc, Plan).bind()
    except UserError as exc:
        raise PlanError(
            exc.message, file=exc.file, line=exc.line, field=exc.field, fix=exc.fix
        ) from None
    check_plan(plan, doc)
    return plan


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    text = read_user_text(
        path,
        max_bytes=PLAN_LIMITS.max_bytes,
        error=PlanError,
        fix="give the path of a plan .yaml (plan writes one)",
    )
    return parse_plan(text, file=str(path))


def check_plan(plan: Plan, doc: YamlDoc | None = None) -> None:
    """Structural checks; ``doc`` (when the plan came from YAML) lets errors name lines."""

    def fail(path: tuple, message: str, fix: str) -> None:
        raise PlanError(
            message,
            file=doc.file if doc else None,
            line=doc.line(path) if doc else None,
            field=path_text(path) or None,
            fix=fix,
        )

    if plan.global_batch_size < 1 or plan.microbatch_size < 1:
        fail(
            ("global_batch_size",),
            "global_batch_size and microbatch_size must be >= 1",
            "write positive numbers",
        )
    if not plan.stages:
        fail(
            ("stages",),
            "a plan needs at least one stage",
            "list the stages with their layers and replicas",
        )
    expected_start = 0
    for index, stage in enumerate(plan.stages):
        path = ("stages", index, "layers")
        if len(stage.layers) != 2:
            fail(
                path,
                f"layers must be [first, end], got {list(stage.layers)}",
                "write e.g. layers: [0, 12]",
            )
        first, end = stage.layers
        if first != expected_start:
            kind = "overlap" if first < expected_start else "leave a gap"
            fail(
                path,
                f"stage {index} starts at layer {first} but the previous stage ends at {expected_start}: "
                f"layers {kind}",
                f"start stage {index} at layer {expected_start}",
            )
        if end <= first:
            fail(
                path,
                f"stage {index} has no layers ([{first}, {end}))",
                "the end must be above the first layer",
            )
        expected_start = end
        _check_replicas(plan, index, stage, fail)
    _check_batch(plan, fail)
    warmup = plan.pipeline_warmup
    if warmup is not None and (
        len(warmup) != plan.num_stages
        or min(warmup) < 0
        or any(a < b for a, b in zip(warmup, warmup[1:], strict=False))
    ):
        fail(
            ("pipeline_warmup",),
            f"needs {plan.num_stages} counts >= 0 that do not increase along the "
            f"pipeline, got {list(warmup)}",
            "write e.g. [3, 2, 1, 0] (standard 1F1B), or remove it",
        )
    if not 1 <= plan.streams <= 256:
        fail(("streams",), f"streams must be from 1 to 256, got {plan.streams}", "write e.g. 8")
    if plan.compression != "none" and plan.allreduce == "flat":
        fail(
            ("compression",),
            "compression applies to the cross-region hop of a hierarchical all-reduce",
            "write allreduce: hierarchical, or compression: none",
        )


def _check_replicas(plan: Plan, index: int, stage: Stage, fail) -> None:
    if not stage.replicas:
        fail(
            ("stages", index, "replicas"),
            f"stage {index} has no replicas",
            "give at least one replica",
        )
    if len(stage.replicas) != plan.dp_degree:
        fail(
            ("stages", index, "replicas"),
            f"stage {index} has {len(stage.replicas)} replicas but stage 0 has {plan.dp_degree}: every stage "
            "needs the same data-parallel degree (replica i of every stage forms pipeline i)",
            f"give every stage {plan.dp_degree} replicas",
        )
    for r, replica in enumerate(stage.replicas):
        if replica.tp < 1 or replica.tp & (replica.tp - 1):
            fail(
                ("stages", index, "replicas", r, "tp"),
                f"tp must be a power of two, got {replica.tp}",
                "write 1, 2, 4 or 8",
            )
    degrees = sorted({replica.tp for replica in stage.replicas})
    if len(degrees) > 1:
        fail(
            ("stages", index, "replicas"),
            f"stage {index} has replicas of tensor-parallel degrees {degrees}: the runtime sums a "
            "stage's gradients shard by shard, so its replicas must share one degree",
            "give every replica of a stage the same tp (stages may differ)",
        )


def _check_batch(plan: Plan, fail) -> None:
    per_step = plan.global_batch_size
    if per_step % plan.microbatch_size:
        fail(
            ("microbatch_size",),
            f"global_batch_size {per_step} is not divisible by microbatch_size "
            f"{plan.microbatch_size}",
            "choose a microbatch size that divides the global batch",
        )
    total = per_step // plan.microbatch_size
    if plan.pipeline_microbatches is None:
        if total % plan.dp_degree:
            fail(
                ("stages",),
                f"{total} microbatches cannot be split evenly over {plan.dp_degree} pipelines",
                "change the DP degree or microbatch size, or give pipeline_microbatches",
            )
        return
    shares = plan.pipeline_microbatches
    if len(shares) != plan.dp_degree or any(s < 1 for s in shares) or sum(shares) != total:
        fail(
            ("pipeline_microbatches",),
            f"needs {plan.dp_degree} positive counts adding up to {total}, got {list(shares)}",
            f"give one count per pipeline, summing to {total}",
        )


def _share_groups(
    pipelines: Sequence[tuple[int, Sequence[Replica]]],
    kind_of: Sequence[Sequence[int]],
    micro: Sequence[int],
) -> list[tuple[int, int]]:
    """``Plan.pipeline_groups`` of a plan built from ``pipelines`` with unequal shares: replicas
    of one kind of pipeline that run as many microbatches form one group, in order of their first
    replica, as ``Plan._shape`` finds them; without hashing every replica of every stage (the
    planner builds thousands of such plans per search)."""
    groups: dict[tuple, list[int]] = {}
    first = 0
    for count, _ in pipelines:
        kinds = tuple(column[first] for column in kind_of)  # the same for each of these replicas
        for i in range(first, first + count):
            groups.setdefault((micro[i], kinds), []).append(i)
        first += count
    return [(members[0], len(members)) for members in groups.values()]
