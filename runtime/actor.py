"""The thin Ray actor around a StageRunner: placement, process-group setup, steps, counters.

Ray carries control (a step number in, a loss out); tensors go over torch.distributed (comm.py).
A step asked for twice in a row is trained once: a driver that died while its ``step`` call ran
asks again after Ray restarts it, and gets the loss of the step the workers already took.

``node`` and ``counters`` answer from a concurrency group of their own (``CONTROL_GROUP``), beside
a running step: a driver that died between handing a step to one worker and to the next leaves the
first blocked in that step's collective until the restarted driver hands the step to the rest, and
the restarted driver asks every worker where it runs and what it counted before it takes them
over. ``counters`` therefore reads copies (a dict copy is one step under the GIL) and names its
GPU, since the control thread's current CUDA device is not the worker's.
"""

from __future__ import annotations

import socket

import ray

from runtime.config import DataSource, ModelSource, TrainConfig, builtin
from runtime.layout import Layout

# A node that emulates a slower device (the local simulated cloud's noisy neighbour) carries this Ray
# node label, a factor > 1: its worker's forwards and backwards take that many times as long.
SLOWDOWN_LABEL = "geo-slowdown"
CONTROL_GROUP = "control"  # runtime/group.py makes the actors with this concurrency group


class StageWorker:
    def __init__(
        self,
        layout: Layout,
        rank: int,
        config: TrainConfig,
        corpus_bytes: int,
        model: ModelSource | None = None,
        data: DataSource | None = None,
    ) -> None:
        self.layout, self.rank, self.config, self.corpus_bytes = layout, rank, config, corpus_bytes
        self.model = model or builtin(layout.model)  # the layout names a built-in one
        self.data = data
        self.runner = None
        # made by the first start_checkpoint, for its (store URL, job, endpoint)
        self.checkpointer, self.checkpointer_target = None, None
        self.done: tuple[int, float | None] | None = None  # the last step trained, its loss

    def rendezvous(self) -> str:
        """An init address on this worker's host (rank 0 is asked): tcp://ip:free-port."""
        ip = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((ip, 0))
            port = probe.getsockname()[1]
        return f"tcp://{ip}:{port}"

    def setup(self, init_method: str, timeout_s: float) -> str:
        """Join the process group and build this stage; returns the Ray node it runs on."""
        import torch

        from runtime.comm import Comm
        from runtime.memory import keep_freed_memory
        from runtime.stage import StageRunner
        from runtime.workload import build_workload

        torch.set_num_threads(1)  # one CPU slot per worker, as a GPU per worker on a GPU node
        pin_interfaces(ray.util.get_node_ip_address())
        if self.layout.workers[self.rank].device == "cpu":
            keep_freed_memory()  # as the profiler measured (runtime/memory.py)
        elif not torch.cuda.is_available():
            raise RuntimeError(
                f"worker {self.rank} is placed on a GPU of node {ray.util.get_node_ip_address()}, "
                "but torch there sees no CUDA device: install a CUDA build of torch on the node"
            )
        else:
            from runtime.devices import cuda_index

            torch.cuda.set_device(
                cuda_index(ray.get_gpu_ids(), device_count=torch.cuda.device_count())
            )
        config = self.config
        whole_model = config.grad_clip_norm is not None or config.precision == "fp16-mixed"
        comm = Comm(
            self.layout,
            self.rank,
            init_method=init_method,
            timeout_s=timeout_s,
            pipelines=whole_model,
        )
        workload = build_workload(
            self.model, seed=self.config.seed, corpus_bytes=self.corpus_bytes, data=self.data
        )
        labels = ray.get_runtime_context().get_node_labels()
        self.runner = StageRunner(
            self.layout,
            self.rank,
            config=self.config,
            workload=workload,
            comm=comm,
            slowdown=float(labels.get(SLOWDOWN_LABEL, 1.0)),
        )
        return ray.get_runtime_context().get_node_id()

    def step(self, step: int) -> float | None:
        if self.done is not None and self.done[0] == step:
            return self.done[1]  # asked again by a restarted driver: trained once
        loss = self.runner.train_step(step)
        self.done = (step, loss)
        return loss

    @ray.method(concurrency_group=CONTROL_GROUP)
    def node(self) -> str:
        """The Ray node this worker runs on (a restarted driver checks its workers with it, also
        while a step runs)."""
        return ray.get_runtime_context().get_node_id()

    @ray.method(concurrency_group=CONTROL_GROUP)
    def placement(self) -> str | None:
        """The id (hex) of the placement group this worker holds its slot in (a restarted driver
        finds its workers' slots by it)."""
        return ray.get_runtime_context().get_placement_group_id()

    @ray.method(concurrency_group=CONTROL_GROUP)
    def counters(self) -> dict:
        """Bytes sent per place pair and seconds per phase (whole run), the last step's phases,
        and this worker's peak memory."""
        comm = self.runner.comm
        return {
            "rank": self.rank,
            "bytes_sent": {f"{a}->{b}": n for (a, b), n in dict(comm.bytes_sent).items()},
            "wait_s": dict(comm.wait_s),
            "last_step_phases_s": dict(self.runner.last_phases_s),
            "peak_memory_bytes": _peak_memory_bytes(comm.device),
            # what this worker computes on ("cpu", or the GPU's name) and its NCCL groups
            "device": _device_name(comm.device),
            "nccl_groups": comm.nccl_groups,
            "gpu_shared": comm.gpu_shared,
            # the stage's tensors at their peak (runtime/memory.py); None where not measurable
            "peak_tensor_bytes": self.runner.memory.peak_bytes,
            # the last step's summed gradient held no NaN or inf (the driver's divergence guard)
            "grads_finite": self.runner.grads_finite,
            # the set's samples the last step's first stage read (a source that logs them)
            "sample_ids": self.runner.last_sample_ids,
        }

    def start_checkpoint(
        self, store_url: str, job: str, step: int, endpoint_url: str | None = None
    ) -> float:
        """Copy this worker's state after ``step`` and queue its write; returns at once with the
        seconds the copy took. The write runs on a thread while the next steps train."""
        from runtime.checkpoint import Checkpointer
        from runtime.storage import open_store

        target = (store_url, job, endpoint_url)
        if self.checkpointer is None or self.checkpointer_target != target:
            if self.checkpointer is not None:
                self.checkpointer.close()
            store = open_store(store_url, endpoint_url=endpoint_url)
            self.checkpointer = Checkpointer(
                store,
                job,
                stage=self.runner.stage,
                replica=self.runner.replica,
                tp_rank=self.runner.tp_rank,
            )
            self.checkpointer_target = target
        return self.checkpointer.save(step, self.runner.state_dict())

    def finish_checkpoint(self, timeout_s: float) -> list:
        """Wait for the queued writes; their CheckpointEntry list (raises a write's error)."""
        return [] if self.checkpointer is None else self.checkpointer.wait(timeout_s)

    def restore(
        self,
        store_url: str,
        job: str,
        step: int,
        endpoint_url: str | None = None,
        manifest: dict | None = None,
    ) -> None:
        """Load this worker's state at ``step`` (checksum and identity verified against
        ``manifest``, the driver's verified copy, or the store's), from a checkpoint of this
        layout or of any other (runtime/reshard.py); training goes on at step + 1."""
        from runtime import checkpoint
        from runtime.storage import open_store

        store = open_store(store_url, endpoint_url=endpoint_url)
        runner = self.runner
        self.done = None  # the steps after ``step`` are trained again
        runner.applied = step + 1
        manifest = manifest or checkpoint.read_manifest(store, job, step)
        mine = {
            "stage": runner.stage,
            "replica": runner.replica,
            "tp_rank": runner.tp_rank,
            "manifest": manifest,
        }
        if checkpoint.has_state(store, job, step, **mine):
            state = checkpoint.load(store, job, step, **mine)
            if runner.holds_same(state):
                runner.load_state_dict(state)  # the same worker of the same layout: exactly
                return
        # written by another layout: take this stage's layers from the stages that held them
        runner.load_resharded(checkpoint.load_stages(store, job, step, manifest=manifest))

    def rescue(self, store_url: str, job: str, step: int, endpoint_url: str | None = None):
        """Write this worker's state after ``step`` now, if its weights hold exactly that (a peer
        died during the next step, before its optimizer update); its CheckpointEntry, or None.
        It runs once this worker's failed step has returned: a peer whose process dies closes
        its connections and gloo fails the collective at once. (A peer that vanishes silently
        leaves the step waiting for gloo's timeout; the driver's rescue then times out and the
        newest checkpoint is used. Answering beside a stuck step would need a threaded actor,
        whose thread-pool allocations cost ~2 MiB per worker that no profile describes.)"""
        from runtime import checkpoint
        from runtime.storage import open_store

        state = self.runner.rescue_state(step + 1)
        if state is None:
            return None
        store = open_store(store_url, endpoint_url=endpoint_url)
        return checkpoint.write_entry(
            store,
            job,
            step,
            state,
            stage=self.runner.stage,
            replica=self.runner.replica,
            tp_rank=self.runner.tp_rank,
        )

    def close(self) -> None:
        """Leave the process group in order (every worker of the group at once) and drop the
        stage; the process stays, for ``reconfigure`` or ``ray.kill``."""
        if self.runner is not None:
            self.runner.close()
            self.runner = None
        if self.checkpointer is not None:
            self.checkpointer.close(timeout_s=10.0)  # the driver waited for its writes already
            self.checkpointer, self.checkpointer_target = None, None

    def reconfigure(
        self,
        layout: Layout,
        rank: int,
        config: TrainConfig,
        corpus_bytes: int,
        model: ModelSource | None = None,
        data: DataSource | None = None,
    ) -> None:
        """Become rank ``rank`` of ``layout`` (a group started with ``reuse``, runtime/group.py)
        after ``close``: as a new actor would be, without a new process (its torch, CUDA context
        and imports stay). ``setup`` follows."""
        assert self.runner is None, "close() first: the old process group is still joined"
        self.__init__(layout, rank, config, corpus_bytes, model, data)
        _reset_peak_memory()  # counters() reports this layout's peak, not the last one's


def pin_interfaces(ip: str) -> None:
    """Make gloo and NCCL listen where Ray does, unless told otherwise. On a cloud VM the host
    name resolves to the VM's private address, which another cloud cannot reach; the node's Ray
    address is its overlay address (provisioners/bootstrap). On loopback (every node on one
    machine) NCCL, which leaves ``lo`` out by default, is told to use it: its ranks sharing a GPU
    are hosts of their own (runtime/devices.py) that meet over sockets."""
    import os

    import psutil

    if ip.startswith("127."):
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        return
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addresses):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", name)
            os.environ.setdefault("NCCL_SOCKET_IFNAME", name)
            return


def _peak_memory_bytes(device) -> int:
    """GPU (a torch device): the allocator's peak there; CPU (None): the process's peak resident
    set since its last reconfigure (Linux reports KiB)."""
    if device is not None:
        import torch

        return int(torch.cuda.max_memory_allocated(device))
    try:  # the high-water mark since the last reset (reconfigure), where Linux keeps one
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the process's whole life


def _reset_peak_memory() -> None:
    """Start the process's resident high-water mark (VmHWM) afresh, where Linux allows it (a
    process may reset its own: proc(5), clear_refs)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass  # not Linux, or not allowed: the peak of the process's whole life is reported


def _device_name(device) -> str:
    if device is None:
        return "cpu"
    import torch

    return torch.cuda.get_device_name(device)
