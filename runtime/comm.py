"""Tensors between workers: torch.distributed (gloo, and NCCL between GPUs of one place) under
Ray's control.

``Comm`` joins the job's process group (gloo, on every rank) and creates, on every rank and in the
same order (as torch.distributed requires), the groups the Layout names: each stage's
data-parallel group (one per tensor-parallel rank), its zone and region groups and cross-region
leaders for the hierarchical all-reduce, and each replica's tensor-parallel group. A group or pipeline pair whose members are all on CUDA in one place
(``Layout.on_nccl``) also gets an NCCL group, and its tensors go from GPU to GPU (where ranks share
a GPU, each is an NCCL host of its own: runtime/devices.py); every other
exchange copies a GPU tensor to host memory, goes over gloo (across the overlay between locations,
or to a CPU worker), and copies it back. NCCL's operations are asynchronous to the host: a receive
or collective on it waits for the device, so the phase timers measure the same wait as on gloo.

Point-to-point sends are asynchronous (``isend``) and receives block: with 1F1B's order on every
stage, each receive is matched by a send already posted, so no two stages wait on each other. A
send's tensor is held until the sender learns the peer has it (``release``: messages between two
ranks arrive in order, so a reply to message ``k`` means all up to ``k`` arrived) or the step ends
(``finish_sends``); holding every send to the end of the step would keep all its activations. Counters: bytes sent per (from place, to place) and seconds waiting per phase.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from datetime import timedelta

import torch
import torch.distributed as dist

from runtime.layout import Layout
from runtime.shaper import SendPacer, collective_s


def loopback_port() -> int:
    """A free TCP port on 127.0.0.1, for a group whose members all run on this machine."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Comm:
    def __init__(
        self,
        layout: Layout,
        rank: int,
        *,
        init_method: str,
        timeout_s: float = 300,
        pipelines: bool = False,
    ) -> None:
        """``pipelines``: also a group per pipeline (every worker of one replica's stages), for
        what is summed over a whole model (the gradient's norm: precision.py)."""
        self.layout, self.rank = layout, rank
        cuda = layout.workers[rank].device == "cuda"
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else None
        dist.init_process_group(
            "gloo",
            init_method=init_method,
            rank=rank,
            world_size=layout.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        self._groups: dict[tuple[int, ...], object] = {}
        self._nccl: dict[tuple[int, ...], object] = {}  # NCCL groups, by their sorted ranks
        self._gpus: list[str | None] = []  # each rank's physical GPU (devices.gpu_identity)
        self.gpu_shared = False  # ranks of this job share a GPU, each its own NCCL host
        if layout.uses_cuda:
            from runtime.devices import gpu_identity, own_nccl_host, share_a_gpu

            self._gpus = [None] * layout.world_size
            dist.all_gather_object(self._gpus, gpu_identity(self.device))
            # decided alike on every rank from the same gathered list, before any NCCL group
            self.gpu_shared = layout.nccl and share_a_gpu(self._gpus)
            if self.gpu_shared:
                own_nccl_host(rank)
        self._create_groups(pipelines)
        # per peer, oldest first: [message number, tensor, work handles (one, once posted)]
        self._pending: dict[int, deque] = defaultdict(deque)
        self._sent_count: dict[int, int] = defaultdict(int)
        self.bytes_sent: dict[tuple[str, str], int] = defaultdict(int)
        self.wait_s: dict[str, float] = defaultdict(float)
        self.timeout_s = timeout_s
        # emulated links (Layout.links): sends are paced, collectives padded to their modeled time
        self._pacer = SendPacer(self._post) if layout.links else None

    def _create_groups(self, pipelines: bool) -> None:
        """Every group of the layout, created by every rank in one order."""
        layout = self.layout
        wanted: list[tuple[int, ...]] = []
        for s in range(layout.num_stages):
            for t in range(layout.tp(s)):
                wanted.append(layout.dp_group(s, t))
                wanted += layout.zone_groups(s, t)
                wanted += layout.region_groups(s, t)
                wanted.append(layout.cross_region_group(s, t))
            wanted += [layout.tp_group(s, i) for i in range(layout.replicas)]
        if pipelines:
            wanted += [layout.model_group(i) for i in range(layout.replicas)]
        for ranks in wanted:
            if len(ranks) > 1 and ranks not in self._groups:
                self._groups[ranks] = dist.new_group(list(ranks))
        if not layout.uses_cuda:
            return
        # pipeline neighbours and the tied weight's two ends exchange point to point
        last = layout.num_stages - 1
        for rank, worker in enumerate(layout.workers):
            ends = [worker.stage - 1, worker.stage + 1]
            ends += [last] if worker.stage == 0 else [0] if worker.stage == last else []
            for stage in ends:
                if 0 <= stage <= last and stage != worker.stage:
                    wanted += [tuple(sorted((rank, p))) for p in layout.fanout(rank, stage)]
        for ranks in wanted:
            # every rank creates every NCCL group, members or not (torch.distributed's rule);
            # NCCL sets up its communicator at the group's first operation, on members only
            key = tuple(sorted(set(ranks)))
            if layout.on_nccl(key) and self._nccl_reaches(key) and key not in self._nccl:
                self._nccl[key] = dist.new_group(list(key), backend="nccl")

    def _nccl_reaches(self, ranks: tuple[int, ...]) -> bool:
        """Whether NCCL can join ``ranks``: each on a GPU, and each on a GPU of its own unless
        every rank is an NCCL host of its own (``gpu_shared``)."""
        gpus = [self._gpus[r] for r in ranks]
        return None not in gpus and (self.gpu_shared or len(set(gpus)) == len(gpus))

    @property
    def nccl_groups(self) -> int:
        """How many NCCL groups this rank's process has (what runs GPU to GPU)."""
        return len(self._nccl)

    def group(self, ranks: tuple[int, ...]):
        return self._groups[ranks]

    def process_group(self, ranks: tuple[int, ...]):
        """The group to run ``ranks``' collectives on: NCCL's where it has one, else gloo's."""
        return self._nccl.get(tuple(sorted(ranks))) or self._groups[ranks]

    def _pair(self, peer: int):
        """The NCCL group to ``peer``, or None: the pair talks over gloo (the default group)."""
        return self._nccl.get(tuple(sorted((self.rank, peer))))

    def _post(self, tensor: torch.Tensor, to: int):
        return dist.isend(tensor, to, group=self._pair(to))

    def _device_wait(self) -> None:
        """Wait until the device has done what NCCL queued (so a phase's timer holds its wait)."""
        if self.device is not None:
            torch.cuda.synchronize(self.device)

    # -- point to point --------------------------------------------------------------------------

    def send(self, tensor: torch.Tensor, to: int) -> int:
        """Send ``tensor`` to rank ``to`` without waiting; returns the message's number on that
        pair (for ``release``)."""
        tensor = tensor.contiguous()
        if tensor.is_cuda and self._pair(to) is None:
            tensor = tensor.cpu()  # over gloo: from host memory
        here, there = self.layout.workers[self.rank].place, self.layout.workers[to].place
        self.bytes_sent[(here, there)] += tensor.numel() * tensor.element_size()
        link = self.layout.link(here, there)
        number, works = self._sent_count[to], []
        self._sent_count[to] += 1
        if self._pacer is not None and link is not None:
            self._pacer.send(
                tensor,
                to,
                latency_s=link.latency_s,
                bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
                record=works,
            )
        else:
            works.append(self._post(tensor, to))
        self._pending[to].append((number, tensor, works))
        return number

    def release(self, to: int, number: int) -> None:
        """Let go of the sends to ``to`` up to message ``number``, which ``to`` has received (the
        caller knows it from what came back). Their work completes at once; a send the pacing
        thread has not handed over yet stays until ``finish_sends``."""
        queue = self._pending[to]
        while queue and queue[0][0] <= number and queue[0][2]:
            queue.popleft()[2][0].wait()

    def pending_tensors(self) -> list[torch.Tensor]:
        """The tensors of sends not let go yet (held until their peer has them)."""
        return [tensor for queue in self._pending.values() for _, tensor, _ in queue]

    def recv(
        self, shape: tuple[int, ...], dtype: torch.dtype, source: int, *, phase: str
    ) -> torch.Tensor:
        """The next tensor from ``source``, on this worker's device."""
        group = self._pair(source)
        tensor = torch.empty(shape, dtype=dtype, device=self.device if group else None)
        start = time.perf_counter()
        dist.recv(tensor, source, group=group)
        if group is not None:
            self._device_wait()
        self.wait_s[phase] += time.perf_counter() - start
        return tensor if self.device is None else tensor.to(self.device)

    def finish_sends(self, *, delivered: bool = False) -> None:
        """Wait until this rank's sends have left it: on an emulated link, until its channel has
        carried their bytes (what is still in flight, its latency, does not hold the sender up;
        the pacing thread delivers it later and the next call finishes it); with ``delivered``,
        until every send has been handed to its peer."""
        start = time.perf_counter()
        if self._pacer is not None:
            if delivered:
                self._pacer.drain(self.timeout_s)
            else:
                self._pacer.wait_sent()
        for queue in self._pending.values():
            while queue and queue[0][2]:  # posted (in order per peer)
                queue.popleft()[2][0].wait()
            assert not delivered or not queue, "drained sends are all posted"
        self.wait_s["p2p_send"] += time.perf_counter() - start

    # -- collectives -----------------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, ranks: tuple[int, ...]) -> None:
        """Sum ``tensor`` over ``ranks`` in place (nothing to do for a group of one)."""
        if len(ranks) > 1:
            self._collective("all_reduce", tensor, ranks, lambda t, g: dist.all_reduce(t, group=g))

    def reduce(self, tensor: torch.Tensor, ranks: tuple[int, ...]) -> None:
        if len(ranks) > 1:
            self._collective(
                "reduce", tensor, ranks, lambda t, g: dist.reduce(t, dst=ranks[0], group=g)
            )

    def broadcast(self, tensor: torch.Tensor, ranks: tuple[int, ...]) -> None:
        if len(ranks) > 1:
            self._collective(
                "broadcast", tensor, ranks, lambda t, g: dist.broadcast(t, src=ranks[0], group=g)
            )

    def compressed_all_reduce(
        self, flat: torch.Tensor, ranks: tuple[int, ...], compressor, sample=lambda: None
    ) -> None:
        """``all_reduce`` of the cross-region hop through ``compressor`` (compression.py);
        ``sample`` is its memory probe."""
        if len(ranks) > 1:
            sent: list[int] = []

            def run(tensor, group) -> None:
                sent.append(compressor.all_reduce(tensor, group, len(ranks), sample))

            self._collective(
                "all_reduce", flat, ranks, run, wire_bytes=lambda: sent[0] / (len(ranks) - 1)
            )

    def _collective(
        self, kind: str, tensor: torch.Tensor, ranks: tuple[int, ...], run, wire_bytes=None
    ) -> None:
        start = time.perf_counter()
        nccl = self._nccl.get(tuple(sorted(ranks)))
        if nccl is not None:
            run(tensor, nccl)
            self._device_wait()
        elif tensor.is_cuda:  # over gloo: through host memory and back
            staged = tensor.cpu()
            run(staged, self._groups[ranks])
            tensor.copy_(staged)
        else:
            run(tensor, self._groups[ranks])
        size = wire_bytes() if wire_bytes else tensor.numel() * tensor.element_size()
        self._count_ring(ranks, size)
        if self.layout.links:
            modeled = collective_s(self.layout, ranks, kind, size)
            left = modeled - (time.perf_counter() - start)
            if left > 0:  # pacing: the emulated links are slower than this machine's
                threading.Event().wait(left)
        self.wait_s["dp_sync"] += time.perf_counter() - start

    def _count_ring(self, ranks: tuple[int, ...], message_bytes: float) -> None:
        """Count what this rank sends in a collective over ``ranks`` in ``bytes_sent``, as the
        simulator counts a collective's egress (simulator/collectives.py): a ring over the members
        ordered by place, each sending 2(n-1)/n of the message to the next. gloo does not report
        bytes per peer; its ring and halving-doubling algorithms send that much per member."""
        ring = sorted(ranks, key=lambda r: (self.layout.workers[r].place, r))
        after = ring[(ring.index(self.rank) + 1) % len(ring)]
        here, there = self.layout.workers[self.rank].place, self.layout.workers[after].place
        self.bytes_sent[(here, there)] += round(2 * (len(ring) - 1) / len(ring) * message_bytes)

    def close(self) -> None:
        self.finish_sends(delivered=True)
        if self._pacer is not None:
            self._pacer.close()
        dist.destroy_process_group()
