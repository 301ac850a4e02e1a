"""Tensors between workers: torch.distributed (gloo on CPU, NCCL on GPU) under Ray's control.

``Comm`` joins the job's process group and creates, on every rank and in the same order (as
torch.distributed requires), the groups the Layout names: each stage's data-parallel group, its
zone and region groups and cross-region leaders for the hierarchical all-reduce, and for a model
with tied embeddings the (first stage, last stage) pair of every pipeline.

Point-to-point sends are asynchronous (``isend``; completed before the step ends) and receives block:
with 1F1B's order on every stage, each receive is matched by a send already posted, so no two stages
wait on each other. Counters: bytes sent per (from place, to place) and seconds waiting per phase.
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import timedelta

import torch
import torch.distributed as dist

from runtime.layout import Layout


class Comm:
    def __init__(
        self, layout: Layout, rank: int, *, init_method: str, timeout_s: float = 300
    ) -> None:
        self.layout, self.rank = layout, rank
        backend = "nccl" if layout.workers[rank].device == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=layout.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        self._groups: dict[tuple[int, ...], object] = {}
        self._create_groups()
        self._pending: list = []
        self.bytes_sent: dict[tuple[str, str], int] = defaultdict(int)
        self.wait_s: dict[str, float] = defaultdict(float)

    def _create_groups(self) -> None:
        """Every group of the layout, created by every rank in one order."""
        layout = self.layout
        wanted: list[tuple[int, ...]] = []
        for s in range(layout.num_stages):
            wanted.append(layout.dp_group(s))
            wanted += layout.zone_groups(s)
            wanted += layout.region_groups(s)
            wanted.append(layout.cross_region_group(s))
        if layout.num_stages > 1:
            wanted += [(p[0], p[-1]) for p in map(layout.pipeline, range(layout.replicas))]
        for ranks in wanted:
            if len(ranks) > 1 and ranks not in self._groups:
                self._groups[ranks] = dist.new_group(list(ranks))

    def group(self, ranks: tuple[int, ...]):
        return self._groups[ranks]

    # -- point to point --------------------------------------------------------------------------

    def send(self, tensor: torch.Tensor, to: int) -> None:
        tensor = tensor.contiguous()
        self._pending.append((dist.isend(tensor, to), tensor))
        here, there = self.layout.workers[self.rank].place, self.layout.workers[to].place
        self.bytes_sent[(here, there)] += tensor.numel() * tensor.element_size()

    def recv(
        self, shape: tuple[int, ...], dtype: torch.dtype, source: int, *, phase: str
    ) -> torch.Tensor:
        tensor = torch.empty(shape, dtype=dtype)
        start = time.perf_counter()
        dist.recv(tensor, source)
        self.wait_s[phase] += time.perf_counter() - start
        return tensor

    def finish_sends(self) -> None:
        for work, _ in self._pending:
            work.wait()
        self._pending = []

    # -- collectives -----------------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, ranks: tuple[int, ...]) -> None:
        """Sum ``tensor`` over ``ranks`` in place (nothing to do for a group of one)."""
        if len(ranks) > 1:
            dist.all_reduce(tensor, group=self._groups[ranks])

    def reduce(self, tensor: torch.Tensor, ranks: tuple[int, ...]) -> None:
        if len(ranks) > 1:
            dist.reduce(tensor, dst=ranks[0], group=self._groups[ranks])

    def broadcast(self, tensor: torch.Tensor, ranks: tuple[int, ...]) -> None:
        if len(ranks) > 1:
            dist.broadcast(tensor, src=ranks[0], group=self._groups[ranks])

    def close(self) -> None:
        self.finish_sends()
        dist.destroy_process_group()
