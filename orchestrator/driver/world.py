"""The driver's collaborators for real: the market and planner, a provisioner, the runtime.

- ``MarketPlans`` (market_plans.py): the plans, from the provisioner's offers now.
- ``ProvisionerCloud``: launch / terminate / events through a provisioner (provisioners/base.py);
  capacity and quota errors become ``CapacityRefused`` so the driver fails over.
- ``RuntimeTrainer``: the runtime's worker group on the plan's layout (runtime/group.py), restored
  from the newest readable checkpoint (an older one when the newest is corrupt; none readable is
  a ``JobBroken``, never a silent start from step 0), with egress measured from the workers' byte
  counters and priced by the catalog's rules. Its errors are sorted (failures.py): a lost worker,
  node or link is ``WorkersLost`` (recover), a broken store, disk, value or code is ``JobBroken``
  (stop); the whole error, with the workers' tracebacks, goes to the log (the job's driver.log).
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from pathlib import Path

from orchestrator.catalog import Catalog
from orchestrator.driver.failures import classify
from orchestrator.driver.machine import (
    CapacityRefused,
    JobBroken,
    Request,
    StepResult,
    WorkersLost,
)
from orchestrator.driver.measure import MEASURE_TIMEOUT_S, measure_on_node
from orchestrator.driver.straggler import pipeline_seconds
from orchestrator.plan import Plan
from orchestrator.recipe.models import model_label, model_source, spec_of
from orchestrator.recipe.schema import Recipe
from provisioners.base import (
    CapacityError,
    CredentialsMissing,
    LaunchRequest,
    NodeState,
    Provisioner,
    ProvisionerError,
    QuotaError,
    Unsupported,
)

log = logging.getLogger(__name__)


class ProvisionerCloud:
    def __init__(self, provisioner: Provisioner, *, launch_timeout_s: float) -> None:
        self.provisioner, self.launch_timeout_s = provisioner, launch_timeout_s

    def launch(self, request: Request, *, gang: str) -> list[str]:
        launch = LaunchRequest(
            gang=gang,
            infra=request.infra,
            instance_type=request.instance_type,
            gpu=request.gpu,
            count=request.count,
            spot=request.spot,
            timeout_s=self.launch_timeout_s,
            gpus_per_node=request.gpus_per_node,
        )
        try:
            return [node.node_id for node in self.provisioner.launch(launch)]
        except (CapacityError, QuotaError) as error:
            raise CapacityRefused(
                request.infra, f"{error.call}: {error.message}", fix=error.fix
            ) from None
        except (CredentialsMissing, Unsupported) as error:  # a retry cannot fix these
            raise JobBroken(
                "cloud", f"{error.cloud}: {error.call}: {error.message}", fix=error.fix
            ) from None
        except ProvisionerError as error:  # an error page, a timeout, throttling: retry later
            raise WorkersLost(
                f"{error.cloud}: {error.call} failed: {error.message} (to fix: {error.fix})"
            ) from None

    def terminate(self, node_ids) -> None:
        if node_ids:
            self.provisioner.terminate(list(node_ids))

    def alive(self, node_ids) -> set[str]:
        wanted = set(node_ids)
        return {
            n.node_id
            for n in self.provisioner.nodes()
            if n.node_id in wanted and n.state is NodeState.RUNNING
        }

    def poll_events(self, *, timeout_s: float = 0.0) -> list:
        return self.provisioner.poll_events(timeout_s=timeout_s)


class RuntimeTrainer:
    """The runtime on the current plan; steps are committed counts (step ``k`` trains the
    ``k``-th step; a checkpoint "at k" holds the state after ``k`` steps)."""

    def __init__(
        self,
        *,
        recipe: Recipe,
        catalog: Catalog,
        job: str,
        checkpoint_url: str,
        network=None,
        signing_key: bytes | None = None,
    ) -> None:
        """``signing_key``: the job's key that signs the checkpoints' manifests (job.py keeps it
        in the job's folder); a manifest it did not sign is not loaded."""
        self.recipe, self.catalog, self.job = recipe, catalog, job
        self.checkpoint_url, self.network = checkpoint_url, network
        self.signing_key = signing_key
        self.group = None
        self._unreadable: tuple[str, ...] = ()
        self._sent: dict[tuple[str, str], int] = {}
        self._healthy = True  # False once a worker failed: stop without waiting on it
        self._last_nodes: tuple[str, ...] | None = None  # Ray node per rank of the last start
        # the workers a stop kept for the next start (``stop(restart=True)``), idle, holding
        # their slots: that start reuses those its plan has the same rank, role and place for
        self._parked = None

    def measure(self, gpu: str, infra: str):
        """The model's profile timed on a node of ``gpu`` in ``infra`` (measure.py)."""
        self._free_parked()  # the measurement may need a slot a kept worker holds
        return measure_on_node(self.recipe, gpu=gpu, infra=infra, timeout_s=MEASURE_TIMEOUT_S)

    def _layout(self, plan: Plan):
        from orchestrator.layout import layout_from_plan
        from runtime.group import place_devices

        places = tuple(sorted({r.infra for stage in plan.stages for r in stage.replicas}))
        return layout_from_plan(
            plan,
            model=model_label(self.recipe.model),
            devices=place_devices(places),
            network=self.network,
        )

    def start(self, plan: Plan, *, restore_step: int | None, same_nodes: bool = False) -> int:
        import ray

        from runtime.config import TrainConfig
        from runtime.group import WorkerGroup, WorkerPlacementError

        layout = self._layout(plan)
        training = self.recipe.training
        config = TrainConfig(
            steps=training.steps,
            global_batch_size=training.global_batch_size,
            microbatch_size=plan.microbatch_size,
            learning_rate=training.optimizer.lr,
            weight_decay=training.optimizer.weight_decay,
            seed=training.seed,
            optimizer=training.optimizer.name,
            momentum=training.optimizer.momentum,
            grad_clip_norm=training.optimizer.grad_clip_norm,
            precision=training.precision,
        )
        self._sent, self._healthy, self._unreadable = {}, True, ()
        check_space(self.checkpoint_url, layout, self.recipe)  # a full disk: say so before training
        # the checkpoints to restore from, checked before any worker starts
        verified = self._verified(restore_step) if restore_step else []
        # named and detached: the workers outlive a driver that dies, which then takes them over;
        # the workers kept from the last start keep their name, which then stays the group's
        reuse, self._parked = self._parked, None
        name = reuse.name if reuse is not None else f"{self.job}-w{uuid.uuid4().hex[:8]}"
        try:
            nodes = self._last_nodes if same_nodes else None
            if nodes is not None and len(nodes) != layout.world_size:
                nodes = None  # another shape: no rank has a node of its own to go back to
            self.group = WorkerGroup.start(
                layout,
                config,
                timeout_s=120.0,
                name=name,
                nodes=nodes,
                model=model_source(self.recipe.model),
                data=data_source(self.recipe.data),
                reuse=reuse,
            )
            self._last_nodes = tuple(self.group.nodes)
        except WorkerPlacementError as error:
            self._healthy = False
            raise WorkersLost(f"starting the workers failed: {error}") from None
        except ray.exceptions.RayError as error:
            self._healthy = False
            raise self._failure(error, "starting the workers") from None
        return self._restore(verified, restore_step)

    def unreadable(self) -> tuple[str, ...]:
        return self._unreadable

    def _failure(self, error: BaseException, doing: str) -> Exception:
        """``error`` as the driver's vocabulary: WorkersLost (a retry may help) or JobBroken
        (it cannot); the whole text, with the workers' tracebacks, to the log."""
        verdict = classify(error, doing=doing, store=self.checkpoint_url)
        log.warning("%s failed (%s): %s", doing, verdict.cause, error)
        if verdict.retry:
            return WorkersLost(verdict.message)
        return JobBroken(verdict.cause, verdict.message, fix=verdict.fix)

    def workers_name(self) -> str | None:
        return None if self.group is None else self.group.name

    def devices(self) -> str:
        """E.g. "4 workers on NVIDIA H200 (2 NCCL groups)" or "4 workers on cpu, 2 of them kept
        from the last start"."""
        import ray

        if self.group is None:
            return ""
        try:
            counters = self.group.counters()
        except ray.exceptions.RayError:  # a worker died meanwhile: the next step will say
            return ""
        kinds = sorted({c["device"] for c in counters})
        nccl = max((c["nccl_groups"] for c in counters), default=0)
        line = f"{len(counters)} worker{'s' if len(counters) != 1 else ''} on {', '.join(kinds)}"
        if any(kind != "cpu" for kind in kinds):
            line += f" ({nccl} NCCL groups" if nccl else " (no NCCL group: gloo"
            shared = any(c.get("gpu_shared") for c in counters)
            line += "; ranks share a GPU, each its own NCCL host)" if shared else ")"
        if self.group.reused:  # processes of the last start, kept through the restart
            line += f", {self.group.reused} of them kept from the last start"
        return line

    def attach(self, plan: Plan, *, workers: str) -> bool:
        from runtime.group import WorkerGroup, WorkerPlacementError

        layout = self._layout(plan)
        try:
            self.group = WorkerGroup.attach(layout, workers)
        except WorkerPlacementError as error:
            log.info("cannot take over the workers: %s", error)
            return False
        # bytes already counted as egress by the dead driver are not billed twice
        self._sent, self._healthy = self._totals(self.group.counters()), True
        return True

    def rescue(self, step: int) -> bool:
        import ray

        from runtime.checkpoint import CheckpointError

        if self.group is None:
            return False
        # a worker is gone: the group cannot leave its process group in order, so stopping it
        # next kills its workers rather than waiting on the dead one
        self._healthy = False
        if step < 1:
            return False
        try:
            return self.group.rescue(
                self.checkpoint_url,
                self.job,
                step - 1,
                keep_last=self.recipe.checkpointing.keep_last,
                signing_key=self.signing_key,
            )
        except (ray.exceptions.RayError, CheckpointError, OSError) as error:
            log.info("no rescue from the surviving workers: %s", error)
            return False

    def sweep(self, *, keep: str | None) -> None:
        from runtime.group import WorkerGroup

        swept = WorkerGroup.sweep(f"{self.job}-w", keep=keep)
        if swept:
            log.info("freed the workers an earlier driver left: %s", ", ".join(swept))

    def check_restorable(self, restore_step: int | None) -> None:
        if restore_step:
            self._verified(restore_step)

    def _verified(self, restore_step: int) -> list[tuple[int, dict]]:
        """The complete checkpoints before ``restore_step`` committed steps whose manifests
        verify (signature, every object there with its size), newest first, as (step, manifest);
        JobBroken when there is none. Checked in this process, before any worker starts."""
        from runtime import checkpoint
        from runtime.storage import StoreError, open_store

        store = open_store(self.checkpoint_url)
        found = checkpoint.steps(store, self.job)
        candidates = sorted(
            (s for s, done in found.items() if done and s < restore_step), reverse=True
        )
        good, problems = [], []  # (step, manifest), (step, why not)
        for trained in candidates:
            try:
                manifest = checkpoint.verified_manifest(
                    store, self.job, trained, signing_key=self.signing_key
                )
            except (checkpoint.CheckpointError, StoreError) as error:
                why = classify(error, doing=f"the checkpoint of step {trained + 1}").message
                problems.append((trained, why))
                continue
            good.append((trained, manifest))
        if not good:
            raise self._none_readable(restore_step, store.url, [why for _, why in problems])
        # what was skipped to get to the newest readable one (the driver's checkpoint_unreadable)
        self._unreadable = tuple(why for trained, why in problems if trained > good[0][0])
        return good

    def _none_readable(self, restore_step: int, url: str, problems: list[str]) -> JobBroken:
        return JobBroken(
            "checkpoint",
            f"no readable checkpoint at or before step {restore_step} in {url} under {self.job}/"
            + (f": {'; '.join(problems)}" if problems else ": none was found"),
            fix="restore the checkpoint files (or point checkpointing.path at them), or submit "
            "again with --from-scratch to train from step 0 (the steps trained so far are lost)",
        )

    def _restore(self, verified: list[tuple[int, dict]], restore_step: int | None) -> int:
        """Load the newest of the ``verified`` checkpoints into the workers (an older one when
        a worker finds its object damaged): the committed step training resumes at."""
        import ray

        from runtime import checkpoint
        from runtime.storage import StoreError

        if not restore_step:
            return 0
        problems = list(self._unreadable)
        for trained, manifest in verified:
            try:
                self.group.restore(self.checkpoint_url, self.job, trained, manifest=manifest)
                self._unreadable = tuple(problems)
                return trained + 1
            except (checkpoint.CheckpointError, StoreError, ray.exceptions.RayError) as error:
                verdict = classify(error, doing=f"restoring step {trained + 1}")
                if verdict.retry:  # a worker or its node went meanwhile: not the checkpoint's fault
                    self._healthy = False
                    raise WorkersLost(verdict.message) from None
                log.warning("checkpoint of step %d unusable: %s", trained + 1, error)
                problems.append(verdict.message)
        raise self._none_readable(restore_step, self.checkpoint_url, problems)

    def step(self, step: int) -> StepResult:
        import ray

        try:
            loss = self.group.step(step, timeout_s=300.0)
            counters = self.group.counters()
        except ray.exceptions.RayError as error:
            self._healthy = False
            raise self._failure(error, f"step {step + 1}") from None
        workers = self.group.layout.workers
        return StepResult(
            loss=loss,
            **self._egress(counters),
            pipeline_s=pipeline_seconds(counters, workers),
            pipeline_microbatches=tuple(
                w.microbatches for w in workers if w.stage == 0 and w.tp_rank == 0
            ),
            grads_finite=all(c.get("grads_finite", True) for c in counters),
            sample_ids=_sample_ids(counters, workers),
        )

    @staticmethod
    def _totals(counters: list[dict]) -> dict[tuple[str, str], int]:
        totals: dict[tuple[str, str], int] = defaultdict(int)
        for worker in counters:
            for pair, size in worker["bytes_sent"].items():  # "src->dst" (runtime/actor.py)
                src, dst = pair.split("->")
                totals[(src, dst)] += size
        return dict(totals)

    def _egress(self, counters: list[dict]) -> dict:
        """Bytes that crossed a place boundary since the last step, and their price."""
        totals = self._totals(counters)
        moved = usd = 0.0
        for pair, size in totals.items():
            delta = size - self._sent.get(pair, 0)
            if pair[0] != pair[1] and delta > 0:
                moved += delta
                usd += delta / 1e9 * self.catalog.egress_price(*pair).usd_per_gb
        self._sent = dict(totals)
        return {"egress_bytes": moved, "egress_usd": usd}

    def checkpoint(self, step: int) -> None:
        import ray

        from runtime.checkpoint import CheckpointError

        if step < 1:
            return
        try:
            self.group.checkpoint(
                self.checkpoint_url,
                self.job,
                step - 1,
                keep_last=self.recipe.checkpointing.keep_last,
                signing_key=self.signing_key,
            )
        # a worker died while copying its state (retry), or the store refused the write (stop)
        except (ray.exceptions.RayError, CheckpointError, OSError) as error:
            self._healthy = False
            raise self._failure(error, f"checkpoint of step {step}") from None

    def stop(self, *, restart: bool = False) -> None:
        import ray

        group, self.group = self.group, None
        if restart and group is not None and self._healthy and group.park():
            self._free_parked()
            self._parked = group  # for the start that follows (its workers have left training)
            return
        if not restart:
            self._free_parked()
        if group is None:
            return
        try:
            group.shutdown(graceful=self._healthy)
        except ray.exceptions.RayError as error:  # a worker died while closing: killed anyway
            log.info("stopping the workers: %s", error)

    def _free_parked(self) -> None:
        import ray

        parked, self._parked = self._parked, None
        if parked is not None:
            try:
                parked.shutdown(graceful=False)  # they left their process group already
            except ray.exceptions.RayError as error:
                log.info("stopping the kept workers: %s", error)


def check_space(url: str, layout, recipe: Recipe) -> None:
    """JobBroken when a local checkpoint folder cannot hold the checkpoints kept (and the one
    being written): said before training rather than at the first write."""
    import shutil

    if "://" in url:
        return  # object stores have no free-space figure to read
    folder = Path(url)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    # weights and two Adam moments in fp32, per worker of every stage (each replica writes its own)
    spec = spec_of(recipe.model)
    per_replica = spec.parameter_count() * 4 * 3
    replicas = layout.world_size / max(1, layout.num_stages)
    need = per_replica * replicas * (recipe.checkpointing.keep_last + 1)
    free = shutil.disk_usage(folder).free
    if free < need:
        raise JobBroken(
            "disk_full",
            f"the checkpoints need about {need / 1e6:,.0f} MB ({recipe.checkpointing.keep_last} "
            f"kept and one being written) and {folder} has {free / 1e6:,.0f} MB free",
            fix="free space there, or point checkpointing.path at a larger disk or s3://...; "
            "then submit the recipe again",
        )


def data_source(data):
    """What the workers read (runtime/workload.py's DataSource) for the recipe's ``data``."""
    from runtime.config import DataSource

    if data.source not in ("tokens", "shards"):
        return None  # the model's own: the byte corpus or synthetic images
    return DataSource(
        kind=data.source, url=data.path, dtype=data.dtype, log_samples=data.log_samples
    )


def _sample_ids(counters: list[dict], workers) -> tuple[int, ...] | None:
    """The ids the first stages read this step, pipeline after pipeline; None if not logged."""
    pairs = zip(counters, workers, strict=True)
    # one worker per pipeline: a tensor-parallel group reads the same samples on every worker
    first = [(w.replica, c.get("sample_ids")) for c, w in pairs if (w.stage, w.tp_rank) == (0, 0)]
    if any(ids is None for _, ids in first):
        return None
    return tuple(i for _, ids in sorted(first) for i in ids)


def checkpoint_url(recipe: Recipe) -> str:
    """The recipe's checkpoint path: a URL (``s3://...``) as is, a folder made absolute (relative
    folders are relative to where the job is submitted)."""
    path = recipe.checkpointing.path
    if "://" in path:
        return path
    return str(Path(path).resolve())
