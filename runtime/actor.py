"""The thin Ray actor around a StageRunner: placement, process-group setup, steps, counters.

Ray carries control (a step number in, a loss out); tensors go over torch.distributed (comm.py).
"""

from __future__ import annotations

import socket

from runtime.layout import Layout
from runtime.reference import TrainConfig


class StageWorker:
    def __init__(self, layout: Layout, rank: int, config: TrainConfig, corpus_bytes: int) -> None:
        self.layout, self.rank, self.config, self.corpus_bytes = layout, rank, config, corpus_bytes
        self.runner = None

    def rendezvous(self) -> str:
        """An init address on this worker's host (rank 0 is asked): tcp://ip:free-port."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((ip, 0))
            port = probe.getsockname()[1]
        return f"tcp://{ip}:{port}"

    def setup(self, init_method: str, timeout_s: float) -> str:
        """Join the process group and build this stage; returns the Ray node it runs on."""
        import ray
        import torch

        from runtime.comm import Comm
        from runtime.data.text import ByteCorpus
        from runtime.stage import StageRunner

        torch.set_num_threads(1)  # one CPU slot per worker, as a GPU per worker on a GPU node
        comm = Comm(self.layout, self.rank, init_method=init_method, timeout_s=timeout_s)
        corpus = ByteCorpus.stdlib(max_bytes=self.corpus_bytes)
        self.runner = StageRunner(
            self.layout, self.rank, config=self.config, corpus=corpus, comm=comm
        )
        return ray.get_runtime_context().get_node_id()

    def step(self, step: int) -> float | None:
        return self.runner.train_step(step)

    def counters(self) -> dict:
        comm = self.runner.comm
        return {
            "bytes_sent": {f"{a}->{b}": n for (a, b), n in comm.bytes_sent.items()},
            "wait_s": dict(comm.wait_s),
        }

    def close(self) -> None:
        if self.runner is not None:
            self.runner.comm.close()
