"""What GCP sells in a zone, as plain data: GPU names, machine types and the offers they make.

The Compute API says which zones are up, which accelerator types each zone has and which machine
types each zone has (with vCPUs, memory and, for accelerator-optimized types, the GPUs built in).
This module turns those facts into ``(zone, machine type, GPU, count)`` shapes; it imports no SDK, so
it is tested with plain values.

Two kinds of GPU machines exist on GCP:

- accelerator-optimized types (``a2-highgpu-1g``, ``a3-highgpu-8g``, ``g2-standard-8``) carry their
  GPUs in the machine type's ``accelerators`` field;
- N1 types take attachable GPUs (T4, V100, P100, P4) as ``guestAccelerators``. A launch request names
  only the machine type, so each GPU count gets one N1 type (``N1_TYPE_BY_COUNT``) and the count is
  read back from the type. Each pairing respects GCP's vCPU limit per GPU count (V100 x1 allows at
  most 12 vCPUs, hence n1-standard-8 for one GPU).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

# GCP accelerator type name -> SkyPilot accelerator name (DESIGN.md: names follow SkyPilot's).
GPU_BY_ACCELERATOR: Mapping[str, str] = {
    "nvidia-tesla-a100": "A100",
    "nvidia-a100-80gb": "A100-80GB",
    "nvidia-tesla-v100": "V100",
    "nvidia-tesla-t4": "T4",
    "nvidia-l4": "L4",
    "nvidia-h100-80gb": "H100",
    "nvidia-h100-mega-80gb": "H100-MEGA",
    "nvidia-h200-141gb": "H200",
    "nvidia-tesla-p100": "P100",
    "nvidia-tesla-p4": "P4",
}
ACCELERATOR_BY_GPU: Mapping[str, str] = {gpu: acc for acc, gpu in GPU_BY_ACCELERATOR.items()}

# GPUs that attach to N1 machine types (the others come only inside their machine type).
ATTACHABLE_GPUS = frozenset({"T4", "V100", "P100", "P4"})
# GPUs per node -> the N1 type we pair with that many attachable GPUs.
N1_TYPE_BY_COUNT: Mapping[int, str] = {
    1: "n1-standard-8",
    2: "n1-standard-16",
    4: "n1-standard-32",
    8: "n1-standard-64",
}
N1_COUNT_BY_TYPE: Mapping[str, int] = {t: n for n, t in N1_TYPE_BY_COUNT.items()}


@dataclass(frozen=True, kw_only=True)
class MachineShape:
    """One machine type in one zone, as the Compute API lists it."""

    name: str
    vcpus: float
    memory_gib: float
    # (accelerator type, count) built into the type; empty for N1 and other general types
    accelerators: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, kw_only=True)
class ZoneGpu:
    """One GPU machine a zone can run: the machine type, the GPU and how many per node."""

    region: str
    zone: str
    machine: MachineShape
    gpu: str
    gpus_per_node: int
    attached: bool  # True: the GPUs are guestAccelerators on an N1 type


def region_of(zone: str) -> str:
    """``us-central1-a`` -> ``us-central1`` (a GCP zone is its region plus ``-<letter>``)."""
    return zone.rsplit("-", 1)[0]


def last_segment(url_or_name: str) -> str:
    """The last path segment of a resource URL (the API returns full URLs for zones, types...)."""
    return url_or_name.rstrip("/").rsplit("/", 1)[-1]


def zone_gpus(
    *,
    zone: str,
    machines: Collection[MachineShape],
    accelerators: Mapping[str, int],
) -> list[ZoneGpu]:
    """Every GPU machine ``zone`` offers; ``accelerators`` maps the zone's accelerator types to the
    most cards one instance may take."""
    region = region_of(zone)
    found: list[ZoneGpu] = []
    by_name = {m.name: m for m in machines}
    for machine in machines:
        for accelerator, count in machine.accelerators:
            gpu = GPU_BY_ACCELERATOR.get(accelerator)
            if gpu is not None and count >= 1:
                found.append(
                    ZoneGpu(
                        region=region,
                        zone=zone,
                        machine=machine,
                        gpu=gpu,
                        gpus_per_node=count,
                        attached=False,
                    )
                )
    for accelerator, max_cards in accelerators.items():
        gpu = GPU_BY_ACCELERATOR.get(accelerator)
        if gpu not in ATTACHABLE_GPUS:
            continue
        for count, type_name in N1_TYPE_BY_COUNT.items():
            machine = by_name.get(type_name)
            if machine is not None and count <= max_cards:
                found.append(
                    ZoneGpu(
                        region=region,
                        zone=zone,
                        machine=machine,
                        gpu=gpu,
                        gpus_per_node=count,
                        attached=True,
                    )
                )
    return found


def gpus_for(instance_type: str, gpu: str, machine: MachineShape | None) -> tuple[int, bool]:
    """How many ``gpu`` a node of ``instance_type`` has, and whether they must be attached.

    An accelerator-optimized type says so itself (``machine``); an N1 type gets the count its
    pairing in ``N1_TYPE_BY_COUNT`` gives (one GPU for an N1 type outside the table)."""
    if machine is not None:
        for accelerator, count in machine.accelerators:
            if GPU_BY_ACCELERATOR.get(accelerator) == gpu:
                return count, False
    if gpu in ATTACHABLE_GPUS and instance_type.startswith("n1-"):
        return N1_COUNT_BY_TYPE.get(instance_type, 1), True
    return 0, False
