"""Start one StageWorker actor per worker of a Layout, each in its place, and train.

Placement: the workers form one placement group (all placed or none, within a timeout); with
``by_place`` (the default) each bundle holds one unit of its place's custom resource
``infra:<cloud/region/zone>``, which the local simulated cloud (and our Ray on cloud nodes) puts on
every node, so each worker lands in its location; without it, anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.actor import StageWorker
from runtime.checkpoint import CheckpointReport, PendingCheckpoint
from runtime.layout import Layout
from runtime.reference import TrainConfig

RENDEZVOUS_ATTEMPTS = 3


def _port_taken(error: BaseException) -> bool:
    """Rank 0's store could not listen on the port its rendezvous probed (another process took
    it in between): worth a new port."""
    return "EADDRINUSE" in str(error) or "address already in use" in str(error)


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
        for attempt in range(RENDEZVOUS_ATTEMPTS):
            actors = [
                remote.options(
                    num_cpus=1,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=group, placement_group_bundle_index=rank
                    ),
                ).remote(layout, rank, config, corpus_bytes)
                for rank in range(layout.world_size)
            ]
            try:
                init_method = ray.get(actors[0].rendezvous.remote(), timeout=timeout_s)
                setups = [a.setup.remote(init_method, timeout_s) for a in actors]
                nodes = ray.get(setups, timeout=timeout_s)
                return cls(layout, actors, nodes, group)
            except Exception as error:
                # a failed start must not keep its actors or the gang's slots: the next start
                # (the driver's retry) would wait for them forever
                for actor in actors:
                    ray.kill(actor)
                if attempt + 1 < RENDEZVOUS_ATTEMPTS and _port_taken(error):
                    continue  # the probed port was taken before the store listened: new port
                remove_placement_group(group)
                raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def step(self, step: int, *, timeout_s: float = 600.0) -> float:
        """One training step on every worker; the global batch's mean loss."""
        import ray

        results = ray.get([a.step.remote(step) for a in self.actors], timeout=timeout_s)
        return sum(r for r in results if r is not None)

    def counters(self) -> list[dict]:
        import ray

        return ray.get([a.counters.remote() for a in self.actors])

    def start_checkpoint(
        self,
        store_url: str,
        job: str,
        step: int,
        *,
        endpoint_url: str | None = None,
        timeout_s: float = 600.0,
    ) -> PendingCheckpoint:
        """Every worker copies its state after ``step`` and queues the write; returns once the
        copies are made, so the next ``step`` call trains while the writes run. One pending
        checkpoint at a time: call ``finish_checkpoint`` before the next one."""
        import ray

        snapshot_s = ray.get(
            [a.start_checkpoint.remote(store_url, job, step, endpoint_url) for a in self.actors],
            timeout=timeout_s,
        )
        return PendingCheckpoint(store_url, job, step, endpoint_url, tuple(snapshot_s))

    def finish_checkpoint(
        self, pending: PendingCheckpoint, *, keep_last: int = 3, timeout_s: float = 600.0
    ) -> CheckpointReport:
        """Wait for every worker's write, then commit the step's manifest (the step is complete
        from then on) and keep the ``keep_last`` newest complete steps."""
        import ray

        from runtime import checkpoint
        from runtime.storage import open_store

        written = ray.get(
            [a.finish_checkpoint.remote(timeout_s) for a in self.actors], timeout=timeout_s
        )
        # one pending checkpoint at a time is the contract; keep only this step's entries anyway
        prefix = checkpoint.step_prefix(pending.job, pending.step)
        entries = [e for rank in written for e in rank if e.key.startswith(prefix)]
        if len(entries) != self.layout.world_size:
            raise checkpoint.CheckpointError(
                f"step {pending.step} of {pending.job!r}: {len(entries)} of "
                f"{self.layout.world_size} workers wrote their state; call start_checkpoint for "
                "this step, then finish_checkpoint once"
            )
        store = open_store(pending.store_url, endpoint_url=pending.endpoint_url)
        key = checkpoint.commit(store, pending.job, pending.step, entries, keep_last=keep_last)
        return CheckpointReport(
            step=pending.step,
            manifest_key=key,
            snapshot_s=max(pending.snapshot_s),
            write_s=max(e.write_s for e in entries),
            size_bytes=sum(e.size_bytes for e in entries),
        )

    def checkpoint(
        self,
        store_url: str,
        job: str,
        step: int,
        *,
        endpoint_url: str | None = None,
        keep_last: int = 3,
        timeout_s: float = 600.0,
    ) -> CheckpointReport:
        """Checkpoint the state after ``step`` and wait until it is committed."""
        pending = self.start_checkpoint(
            store_url, job, step, endpoint_url=endpoint_url, timeout_s=timeout_s
        )
        return self.finish_checkpoint(pending, keep_last=keep_last, timeout_s=timeout_s)

    def restore(
        self,
        store_url: str,
        job: str,
        step: int | None = None,
        *,
        endpoint_url: str | None = None,
        timeout_s: float = 600.0,
    ) -> int:
        """Load every worker's state at ``step`` (the latest complete step when None); returns the
        step restored: train on from ``step + 1``."""
        import ray

        from runtime import checkpoint
        from runtime.storage import open_store

        if step is None:
            store = open_store(store_url, endpoint_url=endpoint_url)
            step = checkpoint.latest_complete(store, job)
            if step is None:
                raise checkpoint.CheckpointError(
                    f"no complete checkpoint of job {job!r} in {store.url}: check the URL and job "
                    "name, or start training from step 0"
                )
        ray.get(
            [a.restore.remote(store_url, job, step, endpoint_url) for a in self.actors],
            timeout=timeout_s,
        )
        return step

    def shutdown(self, *, graceful: bool = True, timeout_s: float = 60.0) -> None:
        """Stop every worker and free the gang's slots. ``graceful``: let workers finish their
        sends and leave the process group first (a group that lost a worker cannot: its members
        would wait on the dead one, so they are killed at once)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        try:
            if graceful:
                ray.get([a.close.remote() for a in self.actors], timeout=timeout_s)
        finally:
            for actor in self.actors:
                ray.kill(actor)
            remove_placement_group(self.placement)
