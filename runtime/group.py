"""Start one StageWorker actor per worker of a Layout, each in its place, and train.

Placement: each worker (each tensor-parallel group, which shares a node) holds a placement group of
one bundle, and a start reserves them all or none within a timeout; with ``by_place`` (the default)
a bundle holds one unit of its place's custom resource ``infra:<cloud/region/zone>``, which the local
simulated cloud (and our Ray on cloud nodes) puts on every node, so each worker lands in its
location; without it, anywhere. A bundle apiece lets a start ``reuse`` the workers of the group before
it where the new layout has a slot like theirs, and free the rest: a re-layout that keeps each
process (its imports, its CUDA context) rather than starting new ones.

A group started with a ``name`` outlives the process that started it: its actors and placement
groups are detached and named (``<name>-<rank>:<role>@<place>``, ``<name>-gang-<suffix>`` in the
``NAMESPACE``; runtime/slots.py), so a driver that Ray restarts finds its workers again with
``WorkerGroup.attach`` and trains on without a restart; it must ``shutdown`` them itself. A named
group keeps its name through a ``reuse``, so a kept worker's name still says its rank and role.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from runtime.actor import CONTROL_GROUP, StageWorker
from runtime.checkpoint import CheckpointReport, PendingCheckpoint
from runtime.config import DataSource, ModelSource, TrainConfig
from runtime.layout import Layout
from runtime.slots import (  # noqa: F401 - WorkerPlacementError and NAMESPACE are named here too
    GANG,
    NAMESPACE,
    NODE_ID_LABEL,
    WorkerPlacementError,
    actor_name,
    first_label,
    group_of,
    leads_of,
    new_actor,
    new_ranks,
    reserve,
    slot_of,
    wait_names_free,
)

log = logging.getLogger(__name__)
RENDEZVOUS_ATTEMPTS = 3
CLOSE_S = 10.0  # a healthy group leaves its process group in well under a second
# an idle kept worker answers in milliseconds; one that does not by then is not waited for (its
# node may be gone before Ray has noticed): it is stopped and a new worker takes its place
ANSWER_S = 0.25


def _port_taken(error: BaseException) -> bool:
    """Rank 0's store could not listen on the port its rendezvous probed (another process took
    it in between): worth a new port."""
    return "EADDRINUSE" in str(error) or "address already in use" in str(error)


def place_devices(places: tuple[str, ...]) -> dict[str, str]:
    """The device workers in each place train on: "cuda" where every live node of the place
    (carrying its ``infra:<place>`` resource) has a GPU, else "cpu" (the local simulated cloud's
    nodes, CPU-only cloud nodes)."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    devices = {}
    for place in places:
        here = [n["Resources"] for n in nodes if n["Resources"].get(f"infra:{place}", 0) > 0]
        gpus = bool(here) and all(r.get("GPU", 0) >= 1 for r in here)
        devices[place] = "cuda" if gpus else "cpu"
    return devices


@dataclass
class WorkerGroup:
    layout: Layout
    actors: list
    nodes: list[str]  # Ray node id per rank
    # one placement group per bundle (a worker, or a tensor-parallel group on one node), in the
    # order of the ranks that lead them: a later start with ``reuse`` keeps some and frees others
    placements: list
    name: str | None = None  # detached and named (see the module's docstring); None: owned
    by_place: bool = True
    gpu_share: float = 1.0
    parked: bool = False  # its workers left their process group, kept for a start's ``reuse``
    reused: int = 0  # of its workers, those a start took over from the group before (``reuse``)

    @property
    def names(self) -> tuple[str, ...]:
        """The actors' names (a named group), in rank order."""
        assert self.name is not None
        return tuple(actor_name(self.name, self.layout, r) for r in range(self.layout.world_size))

    @classmethod
    def start(
        cls,
        layout: Layout,
        config: TrainConfig,
        *,
        by_place: bool = True,
        corpus_bytes: int = 2**20,
        timeout_s: float = 120.0,
        name: str | None = None,
        nodes: tuple[str, ...] | None = None,
        gpu_share: float = 1.0,
        model: ModelSource | None = None,
        data: DataSource | None = None,
        reuse: WorkerGroup | None = None,
    ) -> WorkerGroup:
        """Place and set up one worker per rank; ``name``: a detached, named group (unique per
        start: a failed start's names are not reused); ``nodes``: the Ray node id of each rank
        (a restart that keeps each rank on the node it ran on, e.g. so a re-balanced share of
        the batch stays with the node it was measured on); ``gpu_share``: the part of a GPU each
        CUDA worker takes (below 1, workers share a GPU: small models, tests on one GPU; ranks
        sharing one are NCCL hosts of their own, runtime/devices.py);
        ``model``: the model to train (default: the layout's built-in one; a user's code reaches
        the workers with the Ray job's ``runtime_env``, which its actors inherit); ``data``:
        what a token model reads (default: the byte corpus); ``reuse``: a group of this process
        to end first, whose workers (their processes, with torch imported and any CUDA context
        made) take the new layout's ranks in the same place, device and tensor-parallel degree,
        each as a new worker would; the others are stopped. A reused group keeps its name
        (``name`` must be ``reuse.name``): a named worker is reused only where the new layout
        gives its rank the same role and place, which its name says."""
        import ray
        from ray.util.placement_group import remove_placement_group

        if reuse is not None and reuse.name != name:
            raise ValueError(
                f"a start that reuses group {reuse.name!r} keeps its name, not {name!r}: a named "
                "worker's name says its group"
            )
        # one bundle per tensor-parallel group (one worker without TP), so a group shares a node
        leads = leads_of(layout)
        if nodes is not None:
            assert len(nodes) == layout.world_size, "one node per rank"
        began = time.monotonic()
        kept = (
            {}
            if reuse is None
            else reuse._hand_over(
                layout,
                leads,
                nodes=nodes,
                by_place=by_place,
                gpu_share=gpu_share,
                timeout_s=timeout_s,
            )
        )
        placements = reserve(
            layout,
            [i for i in range(len(leads)) if i not in kept],
            leads,
            name=name,
            nodes=nodes,
            by_place=by_place,
            gpu_share=gpu_share,
            timeout_s=timeout_s,
            kept=kept,
        )
        handed_s = time.monotonic() - began
        # steps run one at a time; ``node`` answers beside them (runtime/actor.py)
        remote = ray.remote(concurrency_groups={CONTROL_GROUP: 1})(StageWorker)
        for attempt in range(RENDEZVOUS_ATTEMPTS):
            # a retry's actors get new names: a killed actor's name is freed asynchronously
            label = None if name is None else (name if attempt == 0 else f"{name}.{attempt}")
            args = (config, corpus_bytes, model, data)
            actors = []
            try:
                if label is not None:  # a reused group's stopped workers may hold a name a moment
                    wait_names_free(
                        [actor_name(label, layout, r) for r in new_ranks(layout, leads, kept)],
                        timeout_s=min(timeout_s, CLOSE_S),
                    )
                named_s = time.monotonic() - began
                for rank in range(layout.world_size):
                    bundle = leads.index(rank - layout.workers[rank].tp_rank)
                    if bundle in kept:
                        actor = kept[bundle][1][layout.workers[rank].tp_rank]
                        actor.reconfigure.remote(layout, rank, *args)  # before its setup
                    else:
                        actor = new_actor(
                            remote, layout, rank, label, placements[bundle], gpu_share
                        ).remote(layout, rank, *args)
                    actors.append(actor)
                init_method = ray.get(actors[0].rendezvous.remote(), timeout=timeout_s)
                setups = [a.setup.remote(init_method, timeout_s) for a in actors]
                nodes = ray.get(setups, timeout=timeout_s)
                reused = sum(len(workers) for _, workers in kept.values())
                log.info(
                    "workers %s: %d of %d kept; slots held after %.2f s, names free after "
                    "%.2f s, set up after %.2f s",
                    label or "",
                    reused,
                    layout.world_size,
                    handed_s,
                    named_s,
                    time.monotonic() - began,
                )
                return cls(
                    layout, actors, nodes, placements, label, by_place, gpu_share, reused=reused
                )
            except Exception as error:
                # a failed start must not keep its actors or the gang's slots: the next start
                # (the driver's retry) would wait for them forever
                for actor in actors + [a for _, workers in kept.values() for a in workers]:
                    ray.kill(actor)
                kept = {}  # a retry starts every worker afresh in the slots already held
                if attempt + 1 < RENDEZVOUS_ATTEMPTS and _port_taken(error):
                    continue  # the probed port was taken before the store listened: new port
                for group in placements:
                    remove_placement_group(group)
                raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def park(self, *, timeout_s: float = CLOSE_S) -> bool:
        """Stop training but keep the workers and their slots for a later start's ``reuse``:
        every worker leaves its process group. False, with every worker stopped and every slot
        freed, when one cannot within ``timeout_s`` (a peer died: the rest wait on it)."""
        import ray

        if self.parked or not self.actors:
            return bool(self.actors)
        try:
            ray.get([a.close.remote() for a in self.actors], timeout=timeout_s)
        except ray.exceptions.RayError as error:
            log.info("workers %s cannot be kept: %s", self.name or "", error)
            self.shutdown(graceful=False)
            return False
        self.parked = True
        return True

    def _answering(self, timeout_s: float) -> set[int]:
        """The ranks whose worker answers within ``timeout_s`` (a parked one whose node was let
        go since does not)."""
        import ray

        calls = [a.node.remote() for a in self.actors]
        ready, _ = ray.wait(calls, num_returns=len(calls), timeout=timeout_s)
        alive = set()
        for rank, call in enumerate(calls):
            if call in ready:
                try:
                    ray.get(call)
                except ray.exceptions.RayError:
                    continue
                alive.add(rank)
        return alive

    def _hand_over(
        self,
        layout: Layout,
        leads: list[int],
        *,
        nodes: tuple[str, ...] | None,
        by_place: bool,
        gpu_share: float,
        timeout_s: float,
    ) -> dict[int, tuple[object, list]]:
        """End this group for a start of ``layout`` that reuses it: it is parked (``park``),
        then the bundles of its live workers that the new layout has a match for (``_fits``)
        are kept with their workers, by the index of the new bundle they fill; the rest are
        stopped and freed."""
        import ray
        from ray.util.placement_group import remove_placement_group

        if not self.park(timeout_s=min(timeout_s, CLOSE_S)):
            return {}
        mine = leads_of(self.layout)
        alive = self._answering(min(timeout_s, ANSWER_S))
        free = {}  # old bundle index -> its lead rank, while unclaimed
        if (self.by_place, self.gpu_share) == (by_place, gpu_share):
            free = {
                i: lead
                for i, lead in enumerate(mine)
                if alive.issuperset(range(lead, lead + self.layout.workers[lead].tp))
            }
        kept: dict[int, tuple[object, list]] = {}
        for i, lead in enumerate(leads):
            fits = (j for j, old in free.items() if self._fits(old, layout, lead, nodes))
            match = next(fits, None)
            if match is not None:
                old = free.pop(match)
                tp = self.layout.workers[old].tp
                kept[i] = (self.placements[match], self.actors[old : old + tp])
        reused = {id(a) for _, actors in kept.values() for a in actors}
        for actor in self.actors:
            if id(actor) not in reused:
                ray.kill(actor)
        held = {id(group) for group, _ in kept.values()}
        for group in self.placements:
            if id(group) not in held:
                remove_placement_group(group)
        self.actors, self.placements = [], []  # handed over: its shutdown has nothing left
        return kept

    def _fits(self, old: int, layout: Layout, lead: int, nodes: tuple[str, ...] | None) -> bool:
        """Whether this group's bundle led by rank ``old`` can be the bundle of ``layout`` led by
        ``lead``: the same place, device and tensor-parallel degree (and node, where ``nodes``
        pins it); in a named group also the same names, which say rank, role and place."""
        if slot_of(self.layout, old) != slot_of(layout, lead):
            return False
        if nodes is not None and self.nodes[old] != nodes[lead]:
            return False
        if self.name is None:
            return True
        return all(
            actor_name(self.name, self.layout, old + t) == actor_name(self.name, layout, lead + t)
            for t in range(layout.workers[lead].tp)
        )

    @classmethod
    def attach(cls, layout: Layout, name: str, *, timeout_s: float = 30.0) -> WorkerGroup:
        """The named group ``name`` started earlier (by a driver that died since), if every worker
        is alive; raise WorkerPlacementError otherwise (``sweep`` then frees what is left)."""
        import ray
        from ray._raylet import PlacementGroupID
        from ray.util.placement_group import PlacementGroup

        try:
            actors = [
                ray.get_actor(actor_name(name, layout, rank), namespace=NAMESPACE)
                for rank in range(layout.world_size)
            ]
            nodes = ray.get([a.node.remote() for a in actors], timeout=timeout_s)
            held = ray.get(
                [actors[r].placement.remote() for r in leads_of(layout)], timeout=timeout_s
            )
            placements = [PlacementGroup(PlacementGroupID(bytes.fromhex(h))) for h in held]
        except (ValueError, TypeError, ray.exceptions.RayError) as error:
            raise WorkerPlacementError(f"workers {name!r} are not all alive: {error}") from None
        return cls(layout, actors, nodes, placements, name)

    @staticmethod
    def sweep(prefix: str, *, keep: str | None = None) -> list[str]:
        """Kill every named group whose name starts with ``prefix`` but ``keep``, and free their
        slots: what a driver that died left running (a group it was still starting, whose name
        it had not recorded, included). Returns the groups swept."""
        import ray
        from ray.util import get_placement_group, placement_group_table
        from ray.util.placement_group import remove_placement_group

        swept = set()
        for actor in ray.util.list_named_actors(all_namespaces=True):
            name, namespace = actor["name"], actor["namespace"]
            group = group_of(name)
            if namespace == NAMESPACE and name.startswith(prefix) and group != keep:
                try:
                    ray.kill(ray.get_actor(name, namespace=NAMESPACE))
                except ValueError:  # gone meanwhile
                    continue
                swept.add(group)
        kept = None if keep is None else first_label(keep)
        for entry in placement_group_table().values():
            name = entry.get("name") or ""
            group = name.rpartition(GANG)[0]
            if not group or not name.startswith(prefix) or group == kept:
                continue
            if entry["state"] != "REMOVED":
                try:
                    remove_placement_group(get_placement_group(name))
                except ValueError:  # removed meanwhile
                    continue
                swept.add(group)
        return sorted(swept)

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
        self,
        pending: PendingCheckpoint,
        *,
        keep_last: int = 3,
        timeout_s: float = 600.0,
        signing_key: bytes | None = None,
    ) -> CheckpointReport:
        """Wait for every worker's write, then commit the step's manifest, signed with
        ``signing_key`` (the step is complete from then on) and keep the ``keep_last`` newest
        complete steps."""
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
        key = checkpoint.commit(
            store, pending.job, pending.step, entries, keep_last=keep_last, signing_key=signing_key
        )
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
        signing_key: bytes | None = None,
    ) -> CheckpointReport:
        """Checkpoint the state after ``step`` and wait until it is committed."""
        pending = self.start_checkpoint(
            store_url, job, step, endpoint_url=endpoint_url, timeout_s=timeout_s
        )
        return self.finish_checkpoint(
            pending, keep_last=keep_last, timeout_s=timeout_s, signing_key=signing_key
        )

    def restore(
        self,
        store_url: str,
        job: str,
        step: int | None = None,
        *,
        endpoint_url: str | None = None,
        timeout_s: float = 600.0,
        manifest: dict | None = None,
    ) -> int:
        """Load every worker's state at ``step`` (the latest complete step when None); returns the
        step restored: train on from ``step + 1``. ``manifest``: the step's manifest as the caller
        verified it (its signature, every object's presence), which the workers then trust."""
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
            [a.restore.remote(store_url, job, step, endpoint_url, manifest) for a in self.actors],
            timeout=timeout_s,
        )
        return step

    def rescue(
        self,
        store_url: str,
        job: str,
        step: int,
        *,
        endpoint_url: str | None = None,
        keep_last: int = 3,
        timeout_s: float = 10.0,
        signing_key: bytes | None = None,
    ) -> bool:
        """After a worker died mid-step: commit a checkpoint of the state after ``step`` from the
        workers still alive, when each stage has one whose weights hold exactly that many steps
        (their step's update was not applied: its collective failed with the dead one). False
        when some stage has none, or none answers within ``timeout_s`` (a step still waiting on
        a silently vanished peer); then the newest checkpoint is all there is."""
        import ray

        from runtime import checkpoint
        from runtime.storage import open_store

        pending = [a.rescue.remote(store_url, job, step, endpoint_url) for a in self.actors]
        entries, stages = [], set(range(self.layout.num_stages))
        deadline = time.monotonic() + timeout_s
        # done once every stage has a state: the dead worker's call may take the cluster's
        # health check (~1.5 s here) to fail
        while pending and {e.stage for e in self._whole_groups(entries)} != stages:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            for call in ready:
                try:
                    entry = ray.get(call)
                except ray.exceptions.RayError:  # the dead worker, or one that failed since
                    continue
                if entry is not None:
                    entries.append(entry)
        entries = self._whole_groups(entries)
        if {e.stage for e in entries} != stages:
            return False
        store = open_store(store_url, endpoint_url=endpoint_url)
        checkpoint.commit(store, job, step, entries, keep_last=keep_last, signing_key=signing_key)
        return True

    def _whole_groups(self, entries: list) -> list:
        """The entries of replicas whose every tensor-parallel worker wrote its state (a stage
        is restored from one whole group's shards)."""
        groups: dict[tuple[int, int], set[int]] = {}
        for e in entries:
            groups.setdefault((e.stage, e.replica), set()).add(e.tp_rank)
        return [
            e
            for e in entries
            if groups[(e.stage, e.replica)] == set(range(self.layout.tp(e.stage)))
        ]

    def shutdown(self, *, graceful: bool = True, timeout_s: float = 60.0) -> None:
        """Stop every worker and free the gang's slots. ``graceful``: let workers finish their
        sends and leave the process group first (a group that lost a worker cannot: its members
        would wait on the dead one, so they are killed at once)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        try:
            if graceful and self.actors:
                ray.get([a.close.remote() for a in self.actors], timeout=timeout_s)
        finally:
            for actor in self.actors:
                ray.kill(actor)
            for group in self.placements:
                remove_placement_group(group)
            self.actors, self.placements = [], []
