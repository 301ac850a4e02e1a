"""Small hand-written fakes for simulator and planner tests: a uniform model profile, a network,
prices, and a catalog whose network is the seeds' table alone."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from orchestrator.catalog import Catalog
from orchestrator.catalog.catalog import PACKAGED_CONFIGS_DIR
from orchestrator.catalog.per_gpu import PerGpu
from orchestrator.plan import Plan, Replica
from orchestrator.profiles.profile import GpuProfile, LayerTable, ModelProfile, TimeTable
from orchestrator.simulator.settings import SimulatorSettings


def uniform_profile(
    *,
    layers: int = 8,
    forward_s: float = 0.01,
    backward_s: float = 0.02,
    update_s: float = 0.001,
    params: int = 1_000_000,
    act_out: int = 100_000,
    kept: float = 1e6,
    gpus=("A100", "V100"),
    slow: dict | None = None,
    precision: str = "fp32",
    optimizer: str = "adam",
    tied: int = 0,
) -> ModelProfile:
    """Every layer alike; ``slow`` = {layer: factor} makes some layers slower on every GPU."""
    slow = slow or {}
    factor = [slow.get(i, 1.0) for i in range(layers)]
    times = {
        (mbs, 1): TimeTable(
            tuple(forward_s * mbs * x for x in factor),
            tuple(backward_s * mbs * x for x in factor),
            (update_s,) * layers,
        )
        for mbs in (1, 2, 4)
    }
    table = LayerTable((params,) * layers, (act_out,) * layers, (kept,) * layers)
    return ModelProfile(
        "uniform",
        precision,
        optimizer,
        128,
        {1: table},
        {g: GpuProfile(g, "measured", "test", times) for g in gpus},
        tied,
    )


class FakeNetwork:
    """Links by place pair (both directions), a default for the rest; zero-cost links when asked."""

    def __init__(self, links: dict | None = None, default=(0.0, 1e9)) -> None:
        self.links = links or {}
        self.default = default
        self.sync_cache: dict = {}

    def link(self, src: str, dst: str, streams: int, gpus=None) -> tuple[float, float]:
        return self.links.get((src, dst)) or self.links.get((dst, src)) or self.default

    def hop(self, src: str, dst: str, streams: int, *gpus: str) -> tuple[float, float, float]:
        (lat_f, bw_f), (lat_b, bw_b) = self.link(src, dst, streams), self.link(dst, src, streams)
        return max(lat_f, lat_b), 1.0 / bw_f, 1.0 / bw_b

    def region_of(self, infra: str) -> str:
        return "/".join(infra.split("/")[:2])


class FakePrices:
    def __init__(self, usd_per_gpu_hour: float = 1.0, usd_per_gb: float = 0.0) -> None:
        self.usd_per_gpu_hour = usd_per_gpu_hour
        self.usd_per_gb = usd_per_gb

    def hourly_usd(self, stage_kinds) -> float:
        return sum(n * r.tp * self.usd_per_gpu_hour for kinds in stage_kinds for r, n in kinds)

    def egress_usd_per_byte(self, src: str, dst: str) -> float:
        return 0.0 if src == dst else self.usd_per_gb / 1e9


def settings(
    *,
    overlap: bool = False,
    overhead: float = 0.0,
    fragmentation: float = 0.0,
    round_s: float = 0.0,
    blocking: bool = False,
) -> SimulatorSettings:
    return SimulatorSettings(
        framework_overhead_bytes=PerGpu(overhead),
        tp_overhead_bytes=0.0,
        fragmentation_fraction=fragmentation,
        bucket_bytes=25 * 2**20,
        overlap_grad_sync=overlap,
        dp_round_overhead_s=round_s,
        blocking_p2p=blocking,
        gpu_memory_bytes={"A100": 40 * 2**30, "V100": 16 * 2**30, "T4": 16 * 2**30},
    )


def plan(
    layers: list[tuple[int, int]],
    places: list[list[str]],
    *,
    gpu: str = "A100",
    batch: int = 32,
    mbs: int = 1,
    allreduce: str = "flat",
    **options,
) -> Plan:
    """``places[s][i]``: where replica i of stage s runs."""
    pipelines = [
        (1, [Replica(gpu=gpu, tp=1, infra=places[s][i]) for s in range(len(layers))])
        for i in range(len(places[0]))
    ]
    return Plan.from_pipelines(
        global_batch_size=batch,
        microbatch_size=mbs,
        layers=layers,
        pipelines=pipelines,
        allreduce=allreduce,
        **options,
    )


def seeds_catalog(folder: Path) -> Catalog:
    """The packaged configs with the measured network tables removed: every pair of places gets the
    seeds' relation defaults (1.45 / 1.42 / 0.63 / 0.18 GB/s; < 1, 0.9, 31, 102 ms)."""
    configs = folder / "configs"
    shutil.copytree(PACKAGED_CONFIGS_DIR, configs)
    index = configs / "network" / "index.yaml"
    index.write_text(re.sub(r"\nmeasured:\n(.|\n)*", "\nmeasured: []\n", index.read_text()))
    catalog = Catalog(configs)
    assert not catalog.network.zone_pairs and not catalog.network.region_pairs
    return catalog
