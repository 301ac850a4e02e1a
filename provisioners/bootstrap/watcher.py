"""A node's watcher: the last step of the bootstrap, in the foreground for the node's life.

Every ``PERIOD_S`` it asks the controller, through the overlay, for the job's members and makes
them its WireGuard peers (nodes come and go; a node's traffic goes straight to the node, not
through the controller). An answer is also the controller's sign of life: when none has come for
``grace_s`` (the recipe's ``recovery.controller_grace_s``), the controller is gone and nobody will
ever use or pay attention to this node again, so it shuts itself down (the dead-man switch: a
spot VM left behind by a crashed controller would bill for ever).

Where the cloud announces a preemption through its metadata service, the watcher polls it and
drains its own Ray node with reason PREEMPTION and the notice's deadline, as the local cloud does
through the GCS: Ray stops placing work there, and the driver sees the notice as a drain.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provisioners.overlay import node as overlay_node
from provisioners.overlay import wg

log = logging.getLogger("provisioners.bootstrap.watcher")

PERIOD_S = 1.0  # how often peers are synced and the controller asked after
METADATA_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Notice:
    deadline_s: float  # Unix seconds the cloud takes the node at
    text: str


def _cloud_notice(cloud: str) -> Callable[[], Notice | None]:
    """The cloud adapter's own reader of its metadata service (``provisioners/<cloud>/metadata.py``,
    standard library only: one implementation per cloud), imported on the first look. Its notice
    has the ``deadline_s`` and ``text`` of ``Notice``."""

    def read() -> Notice | None:
        module = importlib.import_module(f"provisioners.{cloud}.metadata")
        return module.notice(timeout_s=METADATA_TIMEOUT_S)

    read.__name__ = f"{cloud}_notice"
    return read


NOTICE_SOURCES: dict[str, Callable[[], Notice | None] | None] = {
    "none": None,  # the local cloud drains its nodes itself
    "aws": _cloud_notice("aws"),  # EC2's spot instance-action (IMDSv2): two minutes ahead
    "gcp": _cloud_notice("gcp"),  # GCE's instance/preempted: 30 s ahead
    "azure": _cloud_notice("azure"),  # Azure's Scheduled Events, a Preempt event: ~30 s ahead
}


class Watcher:
    def __init__(
        self,
        joined: overlay_node.Joined,
        *,
        grace_s: float,
        shutdown: Callable[[str], None],
        notice: Callable[[], Notice | None] | None = None,
        drain: Callable[[Notice], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.joined, self.grace_s, self.clock = joined, grace_s, clock
        self.shutdown, self.notice, self.drain = shutdown, notice, drain
        self.interface = wg.Interface(joined.interface)
        self.last_seen = clock()
        self.noticed = False

    def tick(self) -> bool:
        """One round; False once the node shuts down."""
        try:
            listed = overlay_node.peers(self.joined)
        except (OSError, ValueError):
            gone_s = self.clock() - self.last_seen
            if gone_s > self.grace_s:
                self.shutdown(
                    f"controller unreachable for {gone_s:.0f} s (grace {self.grace_s:g} s)"
                )
                return False
        else:
            self.last_seen = self.clock()
            try:
                overlay_node.apply_peers(
                    self.interface, listed, keep={self.joined.controller_public_key}
                )
            except wg.OverlayError as error:
                log.warning("peer sync: %s", error)
        self._check_notice()
        return True

    def _check_notice(self) -> None:
        if self.notice is None or self.noticed:
            return
        try:
            found = self.notice()
        except (OSError, ValueError, KeyError) as error:
            log.debug("metadata service: %s", error)
            return
        if found is not None:
            self.noticed = True
            log.warning("preemption notice: %s at %.0f", found.text, found.deadline_s)
            if self.drain is not None:
                self.drain(found)


def own_node_id(ray_address: str, node_ip: str) -> str | None:
    """This node's Ray node id: the live node whose raylet listens on our overlay address."""
    import ray._raylet
    from ray.core.generated import gcs_pb2

    client = ray._raylet.GcsClient(address=ray_address)
    for node_id, info in client.get_all_node_info(timeout=10).items():
        if info.node_manager_address == node_ip and info.state == gcs_pb2.GcsNodeInfo.ALIVE:
            return node_id.hex()
    return None


def _drain_with_ray(ray_address: str, node_ip: str) -> Callable[[Notice], None]:
    def drain(notice: Notice) -> None:
        import ray.exceptions

        from provisioners.local.cluster import drain_for_preemption

        # in this process, through the GCS client: a `ray drain-node` process would first import
        # Ray (~2 s of CPU), which on a loaded host can outlast a short notice
        try:
            # the node by id: without one, a drain would name the node its own driver landed on
            node_id = own_node_id(ray_address, node_ip)
            if node_id is None:
                log.error("no live Ray node at %s to drain", node_ip)
                return
            # the deadline at least a second ahead, as `ray drain-node` rounds it
            deadline_s = max(notice.deadline_s, time.time() + 1.0)
            drain_for_preemption(ray_address, node_id, deadline_s=deadline_s, message=notice.text)
        except (ray.exceptions.RayError, OSError) as error:
            log.error("draining this node for its preemption failed: %s", error)

    return drain


def _shutdown_with(command: str) -> Callable[[str], None]:
    def shutdown(why: str) -> None:
        log.warning("shutting the node down: %s", why)
        print(f"GEO-NODE-SHUTDOWN {why}", flush=True)
        subprocess.run(["/bin/sh", "-c", command], check=False, timeout=60)

    return shutdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--grace-s", type=float, required=True)
    parser.add_argument("--notice-source", choices=sorted(NOTICE_SOURCES), default="none")
    parser.add_argument("--ray-address", required=True)
    parser.add_argument("--shutdown-command", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s watcher: %(message)s")
    if args.notice_source != "none":  # a reader that cannot import fails the boot, not a tick
        importlib.import_module(f"provisioners.{args.notice_source}.metadata")
    joined = overlay_node.load(Path(args.state_dir))
    watcher = Watcher(
        joined,
        grace_s=args.grace_s,
        shutdown=_shutdown_with(args.shutdown_command),
        notice=NOTICE_SOURCES[args.notice_source],
        drain=_drain_with_ray(args.ray_address, joined.ip),
    )
    period = threading.Event()  # never set: its wait is the period between rounds
    try:
        while watcher.tick():
            period.wait(PERIOD_S)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
