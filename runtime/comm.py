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

import threading
import time
from collections import defaultdict
from datetime import timedelta

import torch
import torch.distributed as dist

from runtime.layout import Layout
from runtime.shaper import SendPacer, collective_s


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
        self.timeout_s = timeout_s
        # emulated links (Layout.links): sends are paced, collectives padded to their modeled time
        self._pacer = SendPacer(lambda tensor, to: dist.isend(tensor, to)) if layout.links else None

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
        here, there = self.layout.workers[self.rank].place, self.layout.workers[to].place
        self.bytes_sent[(here, there)] += tensor.numel() * tensor.element_size()
        link = self.layout.link(here, there)
        if self._pacer is not None and link is not None:
            self._pacer.send(
                tensor,
                to,
                latency_s=link.latency_s,
                bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
            )
        else:
            self._pending.append((dist.isend(tensor, to), tensor))

    def recv(
        self, shape: tuple[int, ...], dtype: torch.dtype, source: int, *, phase: str
    ) -> torch.Tensor:
        tensor = torch.empty(shape, dtype=dtype)
        start = time.perf_counter()
        dist.recv(tensor, source)
        self.wait_s[phase] += time.perf_counter() - start
        return tensor

    def finish_sends(self) -> None:
        start = time.perf_counter()
        works = [work for work, _ in self._pending]
        if self._pacer is not None:
            works += self._pacer.drain(self.timeout_s)
        for work in works:
            work.wait()
        self._pending = []
        self.wait_s["p2p_send"] += time.perf_counter() - start

    # -- collectives -----------------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, ranks: tuple[int, ...]) -> None:
        """Sum ``tensor`` over ``ranks`` in place (nothing to do for a group of one)."""
        if len(ranks) > 1:
            self._collective(
                "all_reduce", tensor, ranks, lambda g: dist.all_reduce(tensor, group=g)
            )

    def reduce(self, tensor: torch.Tensor, ranks: tuple[int, ...]) -> None:
        if len(ranks) > 1:
            self._collective(
                "reduce", tensor, ranks, lambda g: dist.reduce(tensor, dst=ranks[0], group=g)
            )

    def broadcast(self, tensor: torch.Tensor, ranks: tuple[int, ...]) -> None:
        if len(ranks) > 1:
            self._collective(
                "broadcast", tensor, ranks, lambda g: dist.broadcast(tensor, src=ranks[0], group=g)
            )

    def compressed_all_reduce(self, flat: torch.Tensor, ranks: tuple[int, ...], compressor) -> None:
        """``all_reduce`` of the cross-region hop through ``compressor`` (compression.py)."""
        if len(ranks) > 1:
            sent: list[int] = []

            def run(group) -> None:
                sent.append(compressor.all_reduce(flat, group, len(ranks)))

            self._collective(
                "all_reduce", flat, ranks, run, wire_bytes=lambda: sent[0] / (len(ranks) - 1)
            )

    def _collective(
        self, kind: str, tensor: torch.Tensor, ranks: tuple[int, ...], run, wire_bytes=None
    ) -> None:
        start = time.perf_counter()
        run(self._groups[ranks])
        if self.layout.links:
            size = wire_bytes() if wire_bytes else tensor.numel() * tensor.element_size()
            modeled = collective_s(self.layout, ranks, kind, size)
            left = modeled - (time.perf_counter() - start)
            if left > 0:  # pacing: the emulated links are slower than this machine's
                threading.Event().wait(left)
        self.wait_s["dp_sync"] += time.perf_counter() - start

    def close(self) -> None:
        self.finish_sends()
        if self._pacer is not None:
            self._pacer.close()
        dist.destroy_process_group()
