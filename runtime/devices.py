"""Which GPU a worker trains on, and which of a group's members share one.

On a cloud node Ray shows each worker only the GPU it was given (``CUDA_VISIBLE_DEVICES``), so
the worker's device is CUDA device 0. On the local simulated cloud of a machine with GPUs, Ray is
told to leave ``CUDA_VISIBLE_DEVICES`` alone (every simulated node would otherwise see "its" GPU 0)
and the node's environment says which of the machine's GPUs its first GPU is
(``CUDA_FIRST_ENV``, set by provisioners/local/cluster.py under the same name); Ray's GPU id
then counts from there, round robin over the machine's GPUs.

NCCL refuses two ranks of one communicator on one GPU of one host ("Duplicate GPU detected").
``gpu_identity`` names a worker's physical GPU; where ranks of a job share one (a machine with
fewer GPUs than the local cloud's nodes hold, or fractional GPUs in tests), ``own_nccl_host`` makes
each rank an NCCL host of its own (``NCCL_HOSTID``), as the simulated nodes are meant to be
separate machines: NCCL then joins them over its network transport (sockets, through host memory)
instead of refusing, so NCCL runs on one GPU as it would between nodes (runtime/comm.py).
"""

from __future__ import annotations

import os
import socket

CUDA_FIRST_ENV = "GEO_LOCAL_CUDA_FIRST"
NOSET_ENV = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
NCCL_HOST_ENV = "NCCL_HOSTID"  # NCCL's own override of the host it thinks a rank is on


def cuda_index(ray_gpu_ids: list, *, device_count: int) -> int:
    """The CUDA device index of a worker given Ray's GPU ids for it (``ray.get_gpu_ids()``)."""
    if not os.environ.get(NOSET_ENV) or not ray_gpu_ids:
        return 0  # Ray's CUDA_VISIBLE_DEVICES shows the worker its GPU alone
    first = int(os.environ.get(CUDA_FIRST_ENV, "0"))
    return (first + int(ray_gpu_ids[0])) % max(1, device_count)


def gpu_identity(device) -> str | None:
    """This host and the UUID of the physical GPU ``device`` is (None: a CPU worker)."""
    if device is None:
        return None
    import torch

    return f"{socket.gethostname()}/{torch.cuda.get_device_properties(device).uuid}"


def share_a_gpu(gpus: list[str | None]) -> bool:
    """Whether two of these ranks' GPUs (``gpu_identity``; None: a CPU rank) are one."""
    named = [g for g in gpus if g is not None]
    return len(set(named)) < len(named)


def own_nccl_host(rank: int) -> None:
    """Make this process rank ``rank``'s own NCCL host, before its first NCCL communicator (NCCL
    reads the variable when one is set up). Every rank of the job must do the same, so that no
    two of them look like one host with one GPU twice."""
    os.environ[NCCL_HOST_ENV] = f"{socket.gethostname()}/geo-rank-{rank}"
