"""A worker group's slots and names: one placement group per bundle (a worker, or a tensor-parallel
group sharing a node), reserved all or none; the names a named group's workers and placement groups
carry (runtime/group.py uses them; ``ray list actors`` and the dashboard show them)."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

from runtime.layout import Layout

NODE_ID_LABEL = "ray.io/node-id"  # every Ray node carries its id as this label
NAMESPACE = "geo-orchestrator"


class WorkerPlacementError(RuntimeError):
    """The cluster cannot hold every worker of the layout where it must run."""


@dataclass(frozen=True)
class Bundle:
    """One placement group's slot: a worker, or a tensor-parallel group sharing a node."""

    place: str
    tp: int
    device: str


GANG = "-gang-"  # a named group's placement groups: <group>-gang-<unique suffix>, one a bundle


def gang_name(group: str) -> str:
    """A new placement group's name: unique, since one a reused group kept may have any index."""
    return f"{first_label(group)}{GANG}{uuid.uuid4().hex[:8]}"


def leads_of(layout: Layout) -> list[int]:
    """The rank leading each bundle (a worker, or the first rank of a tensor-parallel group: its
    ranks are contiguous), in rank order."""
    return [r for r, w in enumerate(layout.workers) if w.tp_rank == 0]


def new_ranks(layout: Layout, leads: list[int], kept: dict) -> list[int]:
    """The ranks a start makes new workers for: those of the bundles not ``kept``."""
    return [
        r
        for i, lead in enumerate(leads)
        if i not in kept
        for r in range(lead, lead + layout.workers[lead].tp)
    ]


def wait_names_free(names: list[str], *, timeout_s: float) -> None:
    """Wait until no actor holds any of ``names``: a stopped worker's name is freed a moment after
    it dies. WorkerPlacementError when one is still held after ``timeout_s``."""
    import ray

    pause, deadline = threading.Event(), time.monotonic() + timeout_s
    for name in names:
        while True:
            try:
                ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                break  # free
            if time.monotonic() >= deadline:
                raise WorkerPlacementError(
                    f"the worker name {name!r} is still taken after {timeout_s:g} s"
                )
            pause.wait(0.1)


def first_label(group: str) -> str:
    """The name a group's start was given: its placement groups carry it also when a retried
    rendezvous named the workers ``<name>.<attempt>``."""
    head, dot, tail = group.rpartition(".")
    return head if dot and tail.isdigit() else group


def slot_of(layout: Layout, lead: int) -> Bundle:
    worker = layout.workers[lead]
    return Bundle(place=worker.place, tp=worker.tp, device=worker.device)


def reserve(
    layout: Layout,
    missing: list[int],
    leads: list[int],
    *,
    name: str | None,
    nodes: tuple[str, ...] | None,
    by_place: bool,
    gpu_share: float,
    timeout_s: float,
    kept: dict[int, tuple[object, list]],
) -> list:
    """A placement group for each bundle in ``missing`` (indices into ``leads``), all placed or
    none within ``timeout_s``; returns every bundle's group, the ``kept`` ones included. On a
    timeout nothing is held any more: the new groups and the kept ones are freed, the kept
    workers stopped."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    made = {}
    for i in missing:
        w = layout.workers[leads[i]]
        bundle = {
            "CPU": 1.0 * w.tp,
            **({"GPU": gpu_share * w.tp} if w.device == "cuda" else {}),
            **({f"infra:{w.place}": 1.0 * w.tp} if by_place else {}),
        }
        options = {} if name is None else {"name": gang_name(name), "lifetime": "detached"}
        if nodes is not None:
            options["bundle_label_selector"] = [{NODE_ID_LABEL: nodes[leads[i]]}]
        made[i] = (placement_group([bundle], **options), bundle)
    try:
        ray.get([group.ready() for group, _ in made.values()], timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        for group, _ in made.values():
            remove_placement_group(group)
        for group, actors in kept.values():
            for actor in actors:
                ray.kill(actor)
            remove_placement_group(group)
        wanted = sorted({k for _, b in made.values() for k in b})
        raise WorkerPlacementError(
            f"{len(leads)} workers could not all be placed within {timeout_s:.0f} s; they need "
            f"one CPU each and these resources: {', '.join(wanted)} (see ray.cluster_resources())"
        ) from None
    return [kept[i][0] if i in kept else made[i][0] for i in range(len(leads))]


def new_actor(remote, layout: Layout, rank: int, label: str | None, placement, gpu_share: float):
    """``remote.options`` for a new worker of ``rank`` in its bundle's ``placement``."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    named = {}
    if label is not None:  # detached: the workers outlive the driver that started them
        named = dict(name=actor_name(label, layout, rank), namespace=NAMESPACE, lifetime="detached")
    return remote.options(
        num_cpus=1,
        num_gpus=gpu_share if layout.workers[rank].device == "cuda" else 0,
        **named,
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=placement, placement_group_bundle_index=0
        ),
    )


def actor_name(group: str, layout: Layout, rank: int) -> str:
    """A worker's name says its role and place, as ``ray list actors`` and the dashboard show it:
    ``<group>-3:stage1-dp0@local/sim-us/sim-us-a`` (``-tp1`` for a tensor-parallel rank); a
    group's name has no ``:`` (a job's name is a slug), so the group is what precedes it."""
    worker = layout.workers[rank]
    tp = f"-tp{worker.tp_rank}" if worker.tp > 1 else ""
    return f"{group}-{rank}:stage{worker.stage}-dp{worker.replica}{tp}@{worker.place}"


def group_of(name: str) -> str:
    """The group of a worker's name (``actor_name``)."""
    return name.split(":", 1)[0].rsplit("-", 1)[0]
