"""Start one StageWorker actor per worker of a Layout, each in its place, and train.

Placement: the workers form one placement group (all placed or none, within a timeout); with
``by_place`` (the default) each bundle holds one unit of its place's custom resource
``infra:<cloud/region/zone>``, which the local simulated cloud (and our Ray on cloud nodes) puts on
every node, so each worker lands in its location; without it, anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.actor import StageWorker
from runtime.layout import Layout
from runtime.reference import TrainConfig


class WorkerPlacementError(RuntimeError):
    """The cluster cannot hold every worker of the layout where it must run."""


@dataclass
class WorkerGroup:
    layout: Layout
    actors: list
    nodes: list[str]  # Ray node id per rank
    placement: object  # the gang's placement group

    @classmethod
    def start(
        cls,
        layout: Layout,
        config: TrainConfig,
        *,
        by_place: bool = True,
        corpus_bytes: int = 2**20,
        timeout_s: float = 120.0,
    ) -> WorkerGroup:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        # the gang as one placement group: all workers get their slot in their place, or none do
        bundles = [
            {"CPU": 1.0, **({f"infra:{w.place}": 1.0} if by_place else {})} for w in layout.workers
        ]
        group = placement_group(bundles, strategy="PACK")
        try:
            ray.get(group.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(group)
            wanted = sorted({k for b in bundles for k in b})
            raise WorkerPlacementError(
                f"{len(bundles)} workers could not all be placed within {timeout_s:.0f} s; they need "
                f"one CPU each and these resources: {', '.join(wanted)} (see ray.cluster_resources())"
            ) from None
        remote = ray.remote(StageWorker)
        actors = [
            remote.options(
                num_cpus=1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=rank
                ),
            ).remote(layout, rank, config, corpus_bytes)
            for rank in range(layout.world_size)
        ]
        init_method = ray.get(actors[0].rendezvous.remote(), timeout=timeout_s)
        nodes = ray.get([a.setup.remote(init_method, timeout_s) for a in actors], timeout=timeout_s)
        return cls(layout, actors, nodes, group)

    def step(self, step: int, *, timeout_s: float = 600.0) -> float:
        """One training step on every worker; the global batch's mean loss."""
        import ray

        results = ray.get([a.step.remote(step) for a in self.actors], timeout=timeout_s)
        return sum(r for r in results if r is not None)

    def counters(self) -> list[dict]:
        import ray

        return ray.get([a.counters.remote() for a in self.actors])

    def shutdown(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        ray.get([a.close.remote() for a in self.actors])
        for actor in self.actors:
            ray.kill(actor)
        remove_placement_group(self.placement)
