"""The Layout: which layers run on which worker, where, and in which communication groups.

The one topology object of the runtime (as torchtitan's ParallelDims): built once from the
orchestrator's plan, checked once, and asked by every worker for its rank, stage, replica, place
and groups. It knows nothing of clouds or planning: a place is an opaque ``cloud/region/zone``
string whose first two parts name the region.

Ranks are stage-major: worker ``(stage s, replica i)`` has rank ``s * replicas + i``; pipeline ``i``
is replica ``i`` of every stage; the data-parallel group of stage ``s`` is its replicas. For the
hierarchical all-reduce, a stage's replicas are grouped by region (members reduce to the region's
first rank), and the region leaders form the cross-region group.
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

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise LayoutError("; ".join(problems))

    def _problems(self):
        stages, replicas = len(self.layers), self.replicas
        if stages == 0 or not self.workers:
            yield "a layout needs at least one stage and one worker"
            return
        if len(self.workers) != stages * replicas:
            yield f"{len(self.workers)} workers for {stages} stages x {replicas} replicas"
            return
        for rank, w in enumerate(self.workers):
            if (w.stage, w.replica) != divmod(rank, replicas):
                yield f"worker {rank} is (stage {w.stage}, replica {w.replica}); expected {divmod(rank, replicas)}"
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

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def rank(self, stage: int, replica: int) -> int:
        return stage * self.replicas + replica

    def worker(self, stage: int, replica: int) -> WorkerSpec:
        return self.workers[self.rank(stage, replica)]

    def pipeline(self, replica: int) -> tuple[int, ...]:
        """Ranks of pipeline ``replica``, first stage first."""
        return tuple(self.rank(s, replica) for s in range(self.num_stages))

    def dp_group(self, stage: int) -> tuple[int, ...]:
        return tuple(self.rank(stage, i) for i in range(self.replicas))

    def zone_groups(self, stage: int) -> tuple[tuple[int, ...], ...]:
        """The stage's replicas grouped by place, in rank order; each group's first rank leads."""
        return _group(self.dp_group(stage), lambda r: self.workers[r].place)

    def region_groups(self, stage: int) -> tuple[tuple[int, ...], ...]:
        """The stage's replicas grouped by region, in rank order; each group's first rank leads.
        The hierarchical all-reduce reduces inside each of these (the zones of a region share one
        ring, as the simulator models it: inter-zone links are nearly as fast as intra-zone)."""
        return _group(self.dp_group(stage), lambda r: self.workers[r].region)

    def cross_region_group(self, stage: int) -> tuple[int, ...]:
        """One leader per region: the ranks whose traffic crosses regions."""
        return tuple(group[0] for group in self.region_groups(stage))

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
            len(set(ranks)) > 1
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
