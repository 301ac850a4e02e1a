"""One worker's training step: its layers of one pipeline stage, 1F1B over its microbatches, then the
gradient sync of its data-parallel group and the optimizer step. A plain class (Ray wraps it in
actor.py), driven by ``train_step(step)``.

Samples are drawn by index (data/text.py), so no stage waits for data from another: pipeline ``i``
takes the ``i``-th contiguous share of the step's global batch, in microbatches, on its first stage
(inputs) and last stage (targets). Each microbatch's loss is scaled by ``microbatch_size /
global_batch_size``, so summing gradients over microbatches and replicas gives the global mean,
as in the single-process reference (reference.py).
"""

from __future__ import annotations

import time

import torch
from torch import nn

from runtime.comm import Comm
from runtime.compression import CrossRegionCompressor
from runtime.layout import Layout, LayoutError
from runtime.reference import TrainConfig, make_optimizer
from runtime.workload import Workload


def one_f_one_b(microbatches: int, warmup: int) -> list[tuple[str, int]]:
    """The order of a stage's operations: ``warmup`` forwards, then one forward and one backward
    in turn, then the remaining backwards (PipeDream-flush 1F1B)."""
    w = min(warmup, microbatches)
    order = [("F", j) for j in range(w)]
    for j in range(microbatches - w):
        order += [("F", w + j), ("B", j)]
    return order + [("B", j) for j in range(microbatches - w, microbatches)]


class StageRunner:
    def __init__(
        self, layout: Layout, rank: int, *, config: TrainConfig, workload: Workload, comm: Comm
    ) -> None:
        worker = layout.workers[rank]
        self.layout, self.rank, self.config, self.comm = layout, rank, config, comm
        self.workload = workload
        self.stage, self.replica = worker.stage, worker.replica
        self.microbatches = worker.microbatches
        # every worker builds the whole model from the seed and keeps its stage: identical weights
        # everywhere without a broadcast (fine for the built-in sizes the CPU runtime trains)
        start, end = layout.layers[self.stage]
        self.module = nn.Sequential(*workload.layers[start:end])
        self.parameters = list(self.module.parameters())
        self.optimizer = make_optimizer(self.parameters, config)
        # gradients live in one flat buffer (each .grad a view of it): backward accumulates into
        # it in place and the all-reduce sends it as is, with no gather or scatter copy
        self.flat_grad = torch.zeros(sum(p.numel() for p in self.parameters))
        offset = 0
        for p in self.parameters:
            p.grad = self.flat_grad[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        self.first, self.last = self.stage == 0, self.stage == layout.num_stages - 1
        ends = layout.num_stages > 1 and (self.first or self.last)
        self.tied = workload.tied if ends else None  # summed across the first and last stage
        mbs = layout.microbatch_size
        self.sample_offset = mbs * sum(
            layout.worker(0, i).microbatches for i in range(self.replica)
        )
        self.activation = workload.boundary(start, mbs) if not self.first else None
        self.last_phases_s: dict[str, float] = {}
        # the cross-region hop's compression (region leaders only use it)
        self.compressor = (
            CrossRegionCompressor(layout.compression) if layout.compression != "none" else None
        )

    def train_step(self, step: int) -> float | None:
        """One optimizer step; the last stage returns its pipeline's share of the loss. Records
        ``last_phases_s``: compute, waiting for activations/gradients, finishing sends, DP sync,
        optimizer."""
        started, waited = time.perf_counter(), dict(self.comm.wait_s)
        loss = self._step(step)
        optimizer_start = time.perf_counter()
        self.optimizer.step()
        end = time.perf_counter()
        phases = {k: v - waited.get(k, 0.0) for k, v in self.comm.wait_s.items()}
        phases["optimizer"] = end - optimizer_start
        phases["compute"] = (optimizer_start - started) - sum(
            v for k, v in phases.items() if k != "optimizer"
        )
        self.last_phases_s = phases
        return loss

    def _step(self, step: int) -> float | None:
        self.flat_grad.zero_()  # not zero_grad(): the .grad views must stay
        kept: dict[int, tuple] = {}
        loss_sum = 0.0
        for kind, j in one_f_one_b(self.microbatches, self.layout.warmup[self.stage]):
            if kind == "F":
                kept[j] = self._forward(step, j)
                if self.last:
                    loss_sum += kept[j][1].item()
            else:
                self._backward(*kept.pop(j))
        self.comm.finish_sends()
        self._sync_gradients()
        return loss_sum if self.last else None

    def state_dict(self) -> dict:
        """What resuming this worker needs: weights, optimizer state, RNG. The data position is the
        step itself (sample ``k`` depends on the seed and ``k`` only)."""
        return {
            "stage": self.stage,
            "replica": self.replica,
            "layers": self.layout.layers[self.stage],
            "module": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.random.get_rng_state(),
            "compression": self.compressor.state_dict() if self.compressor else None,
        }

    def load_state_dict(self, state: dict) -> None:
        if tuple(state["layers"]) != tuple(self.layout.layers[self.stage]):
            raise LayoutError(
                f"checkpoint holds layers {state['layers']}, this stage runs "
                f"{self.layout.layers[self.stage]}: restore with the layout it was written by"
            )
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.random.set_rng_state(state["torch_rng"])
        if self.compressor is not None and state.get("compression"):
            self.compressor.load_state_dict(state["compression"])

    def _samples(self, step: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        mbs = self.layout.microbatch_size
        first = step * self.config.global_batch_size + self.sample_offset + j * mbs
        return self.workload.samples(first, mbs)

    def _forward(self, step: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        layout = self.layout
        if self.first:
            inputs = self._samples(step, j)[0]
        else:
            source = layout.rank(self.stage - 1, self.replica)
            shape, dtype = self.activation
            inputs = self.comm.recv(shape, dtype, source, phase="p2p_forward")
            inputs.requires_grad_()
        outputs = self.module(inputs)
        if self.last:
            scale = layout.microbatch_size / self.config.global_batch_size
            return inputs, self.workload.loss(outputs, self._samples(step, j)[1]) * scale
        self.comm.send(outputs.detach(), layout.rank(self.stage + 1, self.replica))
        return inputs, outputs

    def _backward(self, inputs: torch.Tensor, outputs: torch.Tensor) -> None:
        layout = self.layout
        if self.last:
            outputs.backward()
        else:
            source = layout.rank(self.stage + 1, self.replica)
            grad = self.comm.recv(tuple(outputs.shape), outputs.dtype, source, phase="p2p_backward")
            outputs.backward(grad)
        if not self.first:
            self.comm.send(inputs.grad, layout.rank(self.stage - 1, self.replica))

    def _sync_gradients(self) -> None:
        """Sum gradients over the stage's replicas (a flat ring, or inside each region, across
        regions and back), then the tied weight's two uses over the pipeline's first and last
        stage."""
        flat, layout = self.flat_grad, self.layout
        if layout.allreduce == "flat":
            self.comm.all_reduce(flat, layout.dp_group(self.stage))
        else:
            self._hierarchical(flat)
        if self.tied is not None:
            pipeline = layout.pipeline(self.replica)
            self.comm.all_reduce(self.tied.grad, (pipeline[0], pipeline[-1]))

    def _hierarchical(self, flat: torch.Tensor) -> None:
        """Reduce inside the region to its leader, all-reduce between region leaders, broadcast
        back inside the region (simulator/collectives.py models the same three phases)."""
        layout, s, rank = self.layout, self.stage, self.rank
        region = next(g for g in layout.region_groups(s) if rank in g)
        self.comm.reduce(flat, region)
        if rank == region[0]:
            leaders = layout.cross_region_group(s)
            if self.compressor is not None:
                self.comm.compressed_all_reduce(flat, leaders, self.compressor)
            else:
                self.comm.all_reduce(flat, leaders)
        self.comm.broadcast(flat, region)
