"""The Layout: which layers run on which worker, where, and in which communication groups.

The one topology object of the runtime (as torchtitan's ParallelDims): built once from the
orchestrator's plan, checked once, and asked by every worker for its rank, stage, replica, place
and groups. It knows nothing of clouds or planning: a place is an opaque ``cloud/region/zone``
string whose first two parts name the region.

Ranks are stage-major, then replica, then tensor-parallel rank: replica ``i`` of stage ``s`` is
``tp`` workers in one place (a tensor-parallel group, ``tp`` of the stage's own), ranks in a row.
Without tensor parallelism worker ``(s, i)`` has rank ``s * replicas + i``. Pipeline ``i`` is
replica ``i`` of every stage; the data-parallel group of stage ``s`` (and tensor-parallel rank
``t``) is its replicas' workers of that rank. For the hierarchical all-reduce, a stage's replicas
are grouped by region (members reduce to the region's first rank), and the region leaders form
the cross-region group. Stages may differ in their degree (GPU types of other memory); the
replicas of one stage share theirs (their gradients are summed shard by shard).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


class LayoutError(ValueError):
    """A layout that cannot run; says what is wrong and what to change."""


@dataclass(frozen=True, kw_only=True)
class Link:
    """What traffic from ``src`` to ``dst`` should see when links are emulated (comm.py)."""

    src: str
    dst: str
    latency_s: float  # one way
    bandwidth_bytes_per_s: float


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    stage: int
    replica: int
    place: str  # cloud/region/zone
    device: str = "cpu"  # "cpu" or "cuda"
    microbatches: int  # this replica's share of the global batch, in microbatches
    tp: int = 1  # workers in this replica's tensor-parallel group
    tp_rank: int = 0  # this worker's place in it

    @property
    def region(self) -> str:
        return "/".join(self.place.split("/")[:2])


@dataclass(frozen=True, kw_only=True)
class Layout:
    model: str  # a built-in model name (runtime/models/specs.py)
    layers: tuple[tuple[int, int], ...]  # per stage, the half-open layer range
    workers: tuple[WorkerSpec, ...]  # stage-major: rank order
    microbatch_size: int
    warmup: tuple[int, ...]  # 1F1B warm-up forwards per stage
    allreduce: str = "hierarchical"  # "flat" or "hierarchical"
    compression: str = "none"  # cross-region hop: "none", "fp16", "int8"
    # emulated links between places (empty: traffic runs at the local machine's speed)
    links: tuple[Link, ...] = ()
    # False: gloo even between GPUs of one place (NCCL refuses two workers of a group sharing one
    # GPU, as on a one-GPU test machine)
    nccl: bool = True

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise LayoutError("; ".join(problems))

    def _problems(self):
        stages, replicas = len(self.layers), self.replicas
        if stages == 0 or not self.workers:
            yield "a layout needs at least one stage and one worker"
            return
        degrees = {}
        for w in self.workers:
            degrees.setdefault(w.stage, w.tp)
        if sorted(degrees) != list(range(stages)) or min(degrees.values()) < 1:
            yield f"workers name stages {sorted(degrees)} for {stages} stages"
            return
        want = [
            (s, i, t) for s in range(stages) for i in range(replicas) for t in range(degrees[s])
        ]
        got = [(w.stage, w.replica, w.tp_rank) for w in self.workers]
        if got != want:
            yield (
                f"workers are (stage, replica, tp rank) {got[:8]}; expected {want[:8]}: "
                "stage-major, each replica's tensor-parallel workers in a row"
            )
            return
        for rank, w in enumerate(self.workers):
            lead = self.workers[rank - w.tp_rank]
            if w.tp != degrees[w.stage] or w.place != lead.place or w.device != lead.device:
                yield (
                    f"worker {rank} (stage {w.stage}, replica {w.replica}) has tp {w.tp} in "
                    f"{w.place} on {w.device}: a stage's replicas all have its tp "
                    f"({degrees[w.stage]}), and a tensor-parallel group is one place and device"
                )
        if self.layers[0][0] != 0 or any(
            a[1] != b[0] for a, b in zip(self.layers, self.layers[1:], strict=False)
        ):
            yield f"stage layer ranges {list(self.layers)} must start at 0 and follow each other"
        if len(self.warmup) != stages:
            yield f"{len(self.warmup)} warm-up values for {stages} stages"
        for rank, w in enumerate(self.workers):
            if w.device not in ("cpu", "cuda"):
                yield f"worker {rank} has device {w.device!r}; expected 'cpu' or 'cuda'"
        for i in range(replicas):
            shares = {self.worker(s, i).microbatches for s in range(stages)}
            if len(shares) != 1:
                yield f"pipeline {i} has stages with different microbatch counts {sorted(shares)}"

    @property
    def num_stages(self) -> int:
        return len(self.layers)

    @cached_property
    def replicas(self) -> int:
        return 1 + max(w.replica for w in self.workers)

    @cached_property
    def _ranks(self) -> dict[tuple[int, int, int], int]:
        return {(w.stage, w.replica, w.tp_rank): r for r, w in enumerate(self.workers)}

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def tp(self, stage: int) -> int:
        """The stage's tensor-parallel degree."""
        return self.workers[self.rank(stage, 0)].tp

    @property
    def uses_tp(self) -> bool:
        return any(w.tp > 1 for w in self.workers)

    def rank(self, stage: int, replica: int, tp_rank: int = 0) -> int:
        return self._ranks[(stage, replica, tp_rank)]

    def worker(self, stage: int, replica: int) -> WorkerSpec:
        """The first worker of the replica (its tensor-parallel group's rank 0)."""
        return self.workers[self.rank(stage, replica)]

    def tp_group(self, stage: int, replica: int) -> tuple[int, ...]:
        first = self.rank(stage, replica)
        return tuple(range(first, first + self.workers[first].tp))

    def pipeline(self, replica: int) -> tuple[int, ...]:
        """The first rank of each stage of pipeline ``replica``, first stage first."""
        return tuple(self.rank(s, replica) for s in range(self.num_stages))

    def model_group(self, replica: int) -> tuple[int, ...]:
        """Every rank of pipeline ``replica``: together they hold the whole model once."""
        return tuple(r for s in range(self.num_stages) for r in self.tp_group(s, replica))

    def peer_rank(self, rank: int, stage: int) -> int:
        """The worker of ``stage`` (same replica) that ``rank`` receives from or sends to by
        default: the same tensor-parallel rank, modulo the other stage's degree."""
        w = self.workers[rank]
        return self.rank(stage, w.replica, w.tp_rank % self.tp(stage))

    def fanout(self, rank: int, stage: int) -> tuple[int, ...]:
        """The workers of ``stage`` (same replica) whose ``peer_rank`` on this rank's stage is
        ``rank``: each receives this worker's tensor (all hold the same full activation)."""
        w = self.workers[rank]
        return tuple(
            r
            for r in self.tp_group(stage, w.replica)
            if self.workers[r].tp_rank % w.tp == w.tp_rank
        )

    def dp_group(self, stage: int, tp_rank: int = 0) -> tuple[int, ...]:
        return tuple(self.rank(stage, i, tp_rank) for i in range(self.replicas))

    def zone_groups(self, stage: int, tp_rank: int = 0) -> tuple[tuple[int, ...], ...]:
        """The stage's replicas grouped by place, in rank order; each group's first rank leads."""
        return _group(self.dp_group(stage, tp_rank), lambda r: self.workers[r].place)

    def region_groups(self, stage: int, tp_rank: int = 0) -> tuple[tuple[int, ...], ...]:
        """The stage's replicas grouped by region, in rank order; each group's first rank leads.
        The hierarchical all-reduce reduces inside each of these (the zones of a region share one
        ring, as the simulator models it: inter-zone links are nearly as fast as intra-zone)."""
        return _group(self.dp_group(stage, tp_rank), lambda r: self.workers[r].region)

    def cross_region_group(self, stage: int, tp_rank: int = 0) -> tuple[int, ...]:
        """One leader per region: the ranks whose traffic crosses regions."""
        return tuple(group[0] for group in self.region_groups(stage, tp_rank))

    def link(self, src: str, dst: str) -> Link | None:
        """The emulated link from ``src`` to ``dst``, if any."""
        return self._links.get((src, dst))

    @cached_property
    def _links(self) -> dict[tuple[str, str], Link]:
        return {(k.src, k.dst): k for k in self.links}

    @property
    def uses_cuda(self) -> bool:
        return any(w.device == "cuda" for w in self.workers)

    def on_nccl(self, ranks: tuple[int, ...]) -> bool:
        """Whether ``ranks`` exchange tensors over NCCL, straight from GPU memory: all on CUDA in
        one place (NCCL's sockets or NVLink reach inside a location). Any other group stages its
        tensors through host memory and gloo, which crosses the overlay between locations and
        talks to CPU workers."""
        return (
            self.nccl
            and len(set(ranks)) > 1
            and len({self.workers[r].place for r in ranks}) == 1
            and all(self.workers[r].device == "cuda" for r in ranks)
        )

    def places(self) -> tuple[str, ...]:
        return tuple(sorted({w.place for w in self.workers}))


def _group(ranks: tuple[int, ...], key) -> tuple[tuple[int, ...], ...]:
    groups: dict[str, list[int]] = {}
    for rank in ranks:
        groups.setdefault(key(rank), []).append(rank)
    return tuple(tuple(g) for g in groups.values())
