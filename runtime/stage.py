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

import math
import threading
import time

import torch
from torch import nn

from runtime import checkpoint, reshard
from runtime import tensor_parallel as tp
from runtime.comm import Comm
from runtime.compression import CrossRegionCompressor
from runtime.layout import Layout, LayoutError
from runtime.memory import TensorMemory
from runtime.optim import StageOptimizer
from runtime.precision import autocast, clip_factor, loss_scaler, squares
from runtime.reference import TrainConfig
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
        self,
        layout: Layout,
        rank: int,
        *,
        config: TrainConfig,
        workload: Workload,
        comm: Comm,
        slowdown: float = 1.0,
    ) -> None:
        worker = layout.workers[rank]
        self.layout, self.rank, self.config, self.comm = layout, rank, config, comm
        # emulates a device this many times slower (a simulated cloud's noisy neighbour): each
        # forward and backward is followed by an idle wait of (slowdown - 1) times its length
        self.slowdown = slowdown
        self.workload = workload
        self.stage, self.replica = worker.stage, worker.replica
        self.tp, self.tp_rank = worker.tp, worker.tp_rank
        self.microbatches = worker.microbatches
        # every worker builds the whole model from the seed and keeps its stage: identical weights
        # everywhere without a broadcast (fine for the built-in sizes the CPU runtime trains)
        start, end = layout.layers[self.stage]
        mbs = layout.microbatch_size
        # the shape entering this stage, found by running the layers before it on the host (in
        # the training's precision: autocast may hand on another dtype)
        with autocast(config.precision, None):
            self.activation = workload.boundary(start, mbs) if self.stage > 0 else None
        # the comm's device: this worker's GPU on a CUDA worker, else None (the host)
        self.device = comm.device
        self.module = nn.Sequential(*workload.layers[start:end]).to(self.device or "cpu")
        if self.tp > 1:  # the replica's workers split its layers (tensor_parallel.py)
            tp.shard_stage(
                self.module,
                workload.tp_plan,
                group=comm.process_group(layout.tp_group(self.stage, self.replica)),
                device_type="cuda" if self.device is not None else "cpu",
                model=layout.model,
            )
        # the optimizer, the gradient buffer and checkpoints see each parameter's local part
        self.parameters = [tp.local(p) for p in self.module.parameters()]
        self.split = [tp.shard_dim(p) is not None for p in self.module.parameters()]
        # gradients live in one flat buffer (each .grad a view of it): backward accumulates into
        # it in place and the all-reduce sends it as is, with no gather or scatter copy
        self.flat_grad = torch.zeros(sum(p.numel() for p in self.parameters), device=self.device)
        offset = 0
        for p, mine in zip(self.module.parameters(), self.parameters, strict=True):
            tp.attach_grad(p, mine, self.flat_grad[offset : offset + mine.numel()].view_as(mine))
            offset += mine.numel()
        self.first, self.last = self.stage == 0, self.stage == layout.num_stages - 1
        ends = layout.num_stages > 1 and (self.first or self.last)
        self.tied = workload.tied if ends else None  # summed across the first and last stage
        # the last stage steps its copy of the tied weight apart, once the first stage's sum is in
        # (see ``_exchange_tied``)
        defer = self.last and self.tied is not None
        settings = config.optimizer_settings()
        self.optimizer = StageOptimizer(
            [p for p in self.parameters if not (defer and p is self.tied)], settings
        )
        self.tied_optimizer = StageOptimizer([self.tied], settings) if defer else None
        names = reshard.global_names(self.module, start, workload.tied)  # one stage or many
        self.optimizer_names = [
            n for n, p in zip(names, self.parameters, strict=True) if not (defer and p is self.tied)
        ]
        self._tied_pending = False
        self._tied_skip = False  # the step of the tied update in flight was skipped (fp16 inf)
        # fp16-mixed's loss scale, else None
        self.scaler = loss_scaler(config.precision, initial_scale=config.initial_loss_scale)
        # unscaling or clipping needs the whole model's gradient first (_finish_gradients)
        self._whole_model = self.scaler is not None or config.grad_clip_norm is not None
        self.state_lock = threading.Lock()  # the optimizer's update against a rescue copy
        self.applied = 0  # optimizer steps the weights hold (set again by a restore)
        self.grads_finite = True  # the last step's summed gradient held no NaN or inf
        self.sample_offset = mbs * sum(
            layout.worker(0, i).microbatches for i in range(self.replica)
        )
        self.last_phases_s: dict[str, float] = {}
        self.last_sample_ids: list[int] | None = None  # what the last step's first stage read
        # the cross-region hop's compression (region leaders only use it)
        self.compressor = (
            CrossRegionCompressor(layout.compression) if layout.compression != "none" else None
        )
        # keep only this stage's layers: the rest were built for identical weights, not to train
        workload.layers = [m if start <= i < end else None for i, m in enumerate(workload.layers)]
        owned = sum(p.numel() * p.element_size() for p in self.parameters)
        self.memory = TensorMemory(worker.device)
        self.memory.start(owned + self.flat_grad.numel() * self.flat_grad.element_size())

    def train_step(self, step: int) -> float | None:
        """One optimizer step; the last stage returns its pipeline's share of the loss. Records
        ``last_phases_s``: compute, waiting for activations/gradients, finishing sends, DP sync,
        optimizer."""
        started, waited = time.perf_counter(), dict(self.comm.wait_s)
        loss = self._step(step)
        apply = self._finish_gradients()
        optimizer_start = time.perf_counter()
        with self.state_lock:  # a rescue copy (another thread) sees the weights before or after
            if apply:
                self.optimizer.step()
            self.applied = step + 1
        self.memory.sample()
        if self.memory.rebases:
            self.memory.rebase(self._held_bytes())
        self.memory.step_done()
        end = time.perf_counter()
        phases = {k: v - waited.get(k, 0.0) for k, v in self.comm.wait_s.items()}
        phases["optimizer"] = end - optimizer_start
        phases["compute"] = (optimizer_start - started) - sum(
            v for k, v in phases.items() if k != "optimizer"
        )
        self.last_phases_s = phases
        return loss

    def _held_bytes(self) -> int:
        """Bytes of the tensors this worker holds between steps: weights, the gradient buffer,
        optimizer and compression state, sends not yet let go (memory.py's ``rebase``)."""
        tensors = [*self.parameters, self.flat_grad]
        for optimizer in (self.optimizer, self.tied_optimizer):
            for state in optimizer.state.values() if optimizer else ():
                tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
        if self.compressor is not None and self.compressor.residual is not None:
            tensors.append(self.compressor.residual)
        tensors += self.comm.pending_tensors()
        storages = {}  # each storage once (a weight and its local view share one)
        for t in tensors:
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())

    def _step(self, step: int) -> float | None:
        self.flush_tied()  # the previous step's tied update, before this step's first forward
        self.flat_grad.zero_()  # not zero_grad(): the .grad views must stay
        # one worker of a tensor-parallel group reports (its peers read the same samples)
        logs = self.first and self.tp_rank == 0 and self.workload.sample_ids is not None
        self.last_sample_ids = [] if logs else None
        # message numbers of this step's sends per peer (see Comm.release): activations by
        # microbatch, and input gradients in the order sent (microbatch order under 1F1B)
        self._sent_forward: dict[int, dict[int, int]] = {}
        self._sent_backward: list[dict[int, int]] = []
        kept: dict[int, tuple] = {}
        loss_sum = 0.0
        for kind, j in one_f_one_b(self.microbatches, self.layout.warmup[self.stage]):
            if self.slowdown > 1.0:
                started, waited = time.perf_counter(), sum(self.comm.wait_s.values())
            if kind == "F":
                kept[j] = self._forward(step, j)
                if self.last:
                    loss_sum += kept[j][1].item()
                    if self.scaler is not None:  # fp16-mixed: the backward of the scaled loss
                        kept[j] = (kept[j][0], kept[j][1] * self.scaler.scale)
            else:
                self._backward(j, *kept.pop(j))
            if self.slowdown > 1.0:
                # not a synchronisation: the emulated device is busy this long (counted as
                # compute); waits for a peer's tensor are not the device's work
                busy = time.perf_counter() - started - (sum(self.comm.wait_s.values()) - waited)
                time.sleep((self.slowdown - 1.0) * busy)
            self.memory.sample()
        self.comm.finish_sends()
        self._sync_gradients()
        self.memory.sample()
        return loss_sum if self.last and self.tp_rank == 0 else None

    def rescue_state(self, applied: int) -> dict | None:
        """A copy of this worker's state if its weights hold exactly ``applied`` steps, taken
        after a peer died mid-step (that step's optimizer update was not applied); None when they
        hold another number of steps, or the tied weight's last update is still on its way (it
        needs a peer)."""
        with self.state_lock:
            if self.applied != applied or self._tied_pending:
                return None
            return checkpoint.snapshot(self._state())

    def state_dict(self) -> dict:
        """What resuming this worker needs: weights, optimizer state, RNG. The data position is the
        step itself (sample ``k`` depends on the seed and ``k`` only)."""
        self.flush_tied()
        return self._state()

    def _state(self) -> dict:
        module, dims = tp.local_state(self.module)
        return {
            "stage": self.stage,
            "replica": self.replica,
            "layers": self.layout.layers[self.stage],
            # this worker's shards: the dimension each split tensor is cut on, and how many ways
            "tp": {"rank": self.tp_rank, "degree": self.tp, "dims": dims},
            "module": module,
            "optimizer": self.optimizer.state_dict(),
            "param_names": list(self.optimizer_names),  # for restoring into other layouts
            "tied_optimizer": self.tied_optimizer.state_dict() if self.tied_optimizer else None,
            "torch_rng": torch.random.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device else None,
            "compression": self.compressor.state_dict() if self.compressor else None,
            "scaler": self.scaler.state_dict() if self.scaler else None,
        }

    def load_state_dict(self, state: dict) -> None:
        self.flush_tied()  # take the sum in flight off the link, or it would meet the next receive
        if not self.holds_same(state):
            raise LayoutError(
                f"checkpoint holds layers {state['layers']} at tensor-parallel degree "
                f"{reshard.tp_of(state)['degree']}, this stage runs "
                f"{self.layout.layers[self.stage]} at {self.tp}: restore with the layout it was "
                "written by"
            )
        tp.load_local_state(self.module, state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.tied_optimizer is not None:
            self.tied_optimizer.load_state_dict(state["tied_optimizer"])
        torch.random.set_rng_state(state["torch_rng"])
        if self.device is not None and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        if self.compressor is not None and state.get("compression"):
            self.compressor.load_state_dict(state["compression"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])

    def holds_same(self, state: dict) -> bool:
        """Whether ``state`` is this worker's part of the model (same layers, same shards)."""
        saved = reshard.tp_of(state)
        return tuple(state["layers"]) == tuple(self.layout.layers[self.stage]) and (
            saved["degree"],
            saved["rank"],
        ) == (self.tp, self.tp_rank)

    def load_resharded(self, states: list[dict]) -> None:
        """Take this stage's layers from the states of another layout's stages (reshard.py)."""
        self.flush_tied()
        tensors, optimizer_states = reshard.merged(states)
        if self.tp > 1:  # cut this worker's shards from the whole tensors
            start = self.layout.layers[self.stage][0]
            _, dims = tp.local_state(self.module)
            tensors, optimizer_states = reshard.cut(
                tensors,
                optimizer_states,
                {reshard.global_key(start, key): dim for key, dim in dims.items()},
                rank=self.tp_rank,
                degree=self.tp,
            )
        reshard.load_module(self.module, self.layout.layers[self.stage][0], tensors)
        reshard.load_optimizer(self.optimizer, self.optimizer_names, optimizer_states)
        if self.tied_optimizer is not None:
            reshard.load_optimizer(self.tied_optimizer, [reshard.TIED], optimizer_states)
        torch.random.set_rng_state(states[0]["torch_rng"])
        if self.scaler is not None and states[0].get("scaler"):
            self.scaler.load_state_dict(states[0]["scaler"])  # every stage kept the same

    def _samples(self, step: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        mbs = self.layout.microbatch_size
        first = step * self.config.global_batch_size + self.sample_offset + j * mbs
        inputs, targets = self.workload.samples(first, mbs)
        if self.device is None:
            return inputs, targets
        return inputs.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)

    def _forward(self, step: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        layout = self.layout
        if self.first:
            inputs = self._samples(step, j)[0]
            if self.last_sample_ids is not None:
                first = step * self.config.global_batch_size + self.sample_offset
                mbs = layout.microbatch_size
                self.last_sample_ids += self.workload.sample_ids(first + j * mbs, mbs)
        else:
            source = layout.peer_rank(self.rank, self.stage - 1)
            shape, dtype = self.activation
            inputs = self.comm.recv(shape, dtype, source, phase="p2p_forward")
            inputs.requires_grad_()
            self._release_gradients(source, j)
        with autocast(self.config.precision, self.device):
            outputs = self.module(inputs)
            if self.last:
                scale = layout.microbatch_size / self.config.global_batch_size
                return inputs, self.workload.loss(outputs, self._samples(step, j)[1]) * scale
        self._sent_forward[j] = self._send(outputs.detach(), self.stage + 1)
        return inputs, outputs

    def _send(self, tensor: torch.Tensor, stage: int) -> dict[int, int]:
        """Send ``tensor`` to the workers of ``stage`` that take it from this one (one, unless
        the stages' tensor-parallel degrees differ); their message numbers by peer."""
        return {peer: self.comm.send(tensor, peer) for peer in self.layout.fanout(self.rank, stage)}

    def _backward(self, j: int, inputs: torch.Tensor, outputs: torch.Tensor) -> None:
        layout = self.layout
        if self.last:
            outputs.backward()
        else:
            source = layout.peer_rank(self.rank, self.stage + 1)
            grad = self.comm.recv(tuple(outputs.shape), outputs.dtype, source, phase="p2p_backward")
            sent = self._sent_forward.pop(j)
            if source in sent:  # its gradient came back
                self.comm.release(source, sent[source])
            outputs.backward(grad)
        if not self.first:
            self._sent_backward.append(self._send(inputs.grad, self.stage - 1))

    def _release_gradients(self, source: int, j: int) -> None:
        """Activation ``j`` came from the previous stage, which (1F1B) sent it right after its
        backward of microbatch ``j - warmup - 1``: the gradients sent to it up to that one arrived."""
        done = j - min(self.layout.warmup[self.stage - 1], self.microbatches) - 1
        if 0 <= done < len(self._sent_backward) and source in self._sent_backward[done]:
            self.comm.release(source, self._sent_backward[done][source])

    def _sync_gradients(self) -> None:
        """Sum gradients over the stage's replicas (a flat ring, or inside each region, across
        regions and back; with tensor parallelism, shard by shard between the replicas' workers
        of one rank), then the tied weight's two uses over the pipeline's first and last
        stage."""
        flat, layout = self.flat_grad, self.layout
        if layout.allreduce == "flat" or len(layout.region_groups(self.stage, self.tp_rank)) == 1:
            # one region: nothing to cross, the hierarchy is one ring (as simulator/collectives.py
            # models it); a reduce and a broadcast would move every byte twice
            self.comm.all_reduce(flat, layout.dp_group(self.stage, self.tp_rank))
        else:
            self._hierarchical(flat)
        if self.tied is not None:
            self._exchange_tied()

    def _exchange_tied(self) -> None:
        """Sum the tied weight's gradient over its two copies (the first stage's embedding, the last
        stage's head) without a round trip on the critical path. The last stage finishes its backward
        first and sends its share; the first stage adds it and sends the sum back before its optimizer
        step. The last stage applies that sum at the start of the next step (``flush_tied``), while
        the next step's first microbatch is still on its way to it. Same sum, same update, as one
        process stepping one weight. (With tensor parallelism every worker of both stages holds
        the whole tied weight: each pairs with its ``peer_rank`` on the other end.)"""
        grad, last = self.tied.grad, self.layout.num_stages - 1
        if self.last:
            self._send(grad.clone(), 0)  # a copy: the buffer is zeroed next step
            self._tied_pending = True
        else:
            source = self.layout.peer_rank(self.rank, last)
            grad += self.comm.recv(tuple(grad.shape), grad.dtype, source, phase="tied_sync")
            if not self._whole_model:  # nothing to unscale or clip: the sum goes back at once
                self._send(grad.clone(), last)

    def _finish_gradients(self) -> bool:
        """Unscale (fp16-mixed) and clip the summed gradient over the whole pipeline; hand the
        tied weight's final gradient to the last stage; whether to apply the step (fp16-mixed
        skips one whose gradient holds an inf or a NaN anywhere)."""
        clip = self.config.grad_clip_norm
        found_inf = False
        if self._whole_model:
            found_inf, factor = self._global_factor(clip)
            if not found_inf and factor != 1.0:
                self.flat_grad.mul_(factor)
        if self.scaler is not None:
            self.scaler.update(found_inf=found_inf)
            self.grads_finite = True  # an inf is the scaler's to skip, not the job's to stop
        else:
            # a NaN or inf stops the job (the driver's divergence guard) before the step is
            # committed or checkpointed
            self.grads_finite = bool(torch.isfinite(self.flat_grad).all())
        if self.tied is not None and self._whole_model:
            if self.first:  # the sum, unscaled and clipped like every other gradient
                self._send(self.tied.grad.clone(), self.layout.num_stages - 1)
            else:
                self._tied_skip = found_inf
        return not found_inf

    def _global_factor(self, clip: float | None) -> tuple[bool, float]:
        """(an inf or NaN somewhere, the factor to scale the summed gradient by), from one
        all-reduce of the pipeline's sums of squares; the last stage's copy of the tied weight
        holds its share only (the first stage's holds the sum) and is not counted. A split
        parameter counts each worker's shard; a whole one, held by every worker of a
        tensor-parallel group, counts once (its rank 0's)."""
        grads = [
            p.grad
            for p, split in zip(self.parameters, self.split, strict=True)
            if not (self.last and p is self.tied) and (split or self.tp_rank == 0)
        ]
        total = squares(grads).to(self.flat_grad.device)
        self.comm.all_reduce(total, self.layout.model_group(self.replica))
        value = float(total.item())
        if not math.isfinite(value):
            return True, 1.0
        scale = self.scaler.scale if self.scaler is not None else 1.0
        return False, clip_factor(value, scale=scale, max_norm=clip)

    def flush_tied(self) -> None:
        """Apply the tied weight's update the first stage sent, if one is still to come."""
        if not self._tied_pending:
            return
        grad, first = self.tied.grad, self.layout.peer_rank(self.rank, 0)
        grad.copy_(self.comm.recv(tuple(grad.shape), grad.dtype, first, phase="tied_sync"))
        if not self._tied_skip:
            self.tied_optimizer.step()
        self._tied_pending = False

    def close(self) -> None:
        self.flush_tied()  # the first stage's last send completes only once it is received
        self.comm.close()

    def _hierarchical(self, flat: torch.Tensor) -> None:
        """Reduce inside the region to its leader, all-reduce between region leaders, broadcast
        back inside the region (simulator/collectives.py models the same three phases)."""
        layout, s, rank = self.layout, self.stage, self.rank
        region = next(g for g in layout.region_groups(s, self.tp_rank) if rank in g)
        self.comm.reduce(flat, region)
        if rank == region[0]:
            leaders = layout.cross_region_group(s, self.tp_rank)
            if self.compressor is not None:
                self.comm.compressed_all_reduce(
                    flat, leaders, self.compressor, sample=self.memory.sample
                )
            else:
                self.comm.all_reduce(flat, leaders)
        self.comm.broadcast(flat, region)
