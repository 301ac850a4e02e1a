"""Link emulation for the local simulated cloud: traffic between workers in different simulated
places gets that pair's latency and bandwidth (Layout.links), so local runs behave like
geo-distributed ones and the simulator can be checked against them.

Point to point: a message of ``n`` bytes to a peer occupies the link's channel for
``n / bandwidth`` after the channel frees, and arrives ``latency`` later; the sender posts it to
torch.distributed at that arrival time, from one pacing thread (in order per peer, so receivers
match sends as without emulation). Collectives: after the real operation, the caller waits out the
rest of the time the simulator's formula gives for it on the group's slowest link
(``collective_s``). Pacing waits on a clock (``threading.Condition.wait`` with the time left);
nothing waits for another thread's progress by sleeping.
"""

from __future__ import annotations

import heapq
import itertools
import sys
import threading
import time
from collections.abc import Callable

from runtime.layout import Layout

SWITCH_INTERVAL_S = 2e-4  # how late the pacing thread may get the GIL at a message's due time


class SendPacer:
    """Posts sends at their emulated arrival times, in one background thread."""

    def __init__(self, post: Callable[[object, int], object]) -> None:
        self._post = post  # (tensor, peer) -> work handle
        self._heap: list = []
        self._order = itertools.count()
        self._channel_free: dict[int, float] = {}
        self._busy = 0
        self._error: BaseException | None = None
        self._ready = threading.Condition()
        self._stop = False
        # The pacing thread needs the GIL at each due time, and a training thread running Python
        # gives it up only every switch interval (5 ms by default): each message would arrive up
        # to 5 ms late, a pipeline's many small messages adding up to ~10% of a step. So while
        # messages are queued the interval is sub-ms; it goes back as soon as none is: kept
        # sub-ms all the time, every other thread of the process (Ray's) that wants the GIL
        # preempts the training thread within 0.2 ms, which cost data-parallel workers with
        # emulated links (no sends to pace) ~10% of their compute on a busy 2-core machine.
        self._default_interval = sys.getswitchinterval()
        self._thread = threading.Thread(target=self._run, name="link-pacer", daemon=True)
        self._thread.start()

    def send(
        self, tensor, peer: int, *, latency_s: float, bandwidth_bytes_per_s: float, record: list
    ) -> None:
        """Queue ``tensor`` for ``peer``; its work handle is appended to ``record`` once posted."""
        now = time.monotonic()
        size = tensor.numel() * tensor.element_size()
        with self._ready:
            leaves = max(now, self._channel_free.get(peer, 0.0)) + size / bandwidth_bytes_per_s
            self._channel_free[peer] = leaves
            item = (leaves + latency_s, next(self._order), tensor, peer, record)
            heapq.heappush(self._heap, item)
            if not self._busy:
                sys.setswitchinterval(min(self._default_interval, SWITCH_INTERVAL_S))
            self._busy += 1
            self._ready.notify()

    def _run(self) -> None:
        with self._ready:
            while not self._stop:
                if not self._heap:
                    self._ready.wait()
                    continue
                due = self._heap[0][0] - time.monotonic()
                if due > 0:
                    self._ready.wait(due)  # pacing: the message is still on the emulated wire
                    continue
                _, _, tensor, peer, record = heapq.heappop(self._heap)
                try:
                    record.append(self._post(tensor, peer))
                except RuntimeError as error:  # surfaced to the training thread by drain()
                    self._error = error
                self._busy -= 1
                if not self._busy:
                    sys.setswitchinterval(self._default_interval)
                self._ready.notify_all()

    def wait_sent(self) -> None:
        """Wait until every queued message has left its channel (its bytes are on the wire): a
        wait on the clock, to the latest channel-free time."""
        with self._ready:
            until = max(self._channel_free.values(), default=0.0)
        left = until - time.monotonic()
        if left > 0:
            threading.Event().wait(left)  # pacing: the emulated channel is still busy

    def drain(self, timeout_s: float) -> None:
        """Wait until every queued send is posted."""
        deadline = time.monotonic() + timeout_s
        with self._ready:
            while self._busy and not self._error:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{self._busy} emulated sends still queued after {timeout_s} s"
                    )
                self._ready.wait(left)
            if self._error is not None:
                raise self._error

    def close(self) -> None:
        with self._ready:
            self._stop = True
            self._ready.notify_all()
            sys.setswitchinterval(self._default_interval)
        self._thread.join(timeout=5)


def collective_s(layout: Layout, ranks: tuple[int, ...], kind: str, message_bytes: float) -> float:
    """Emulated seconds of a collective over ``ranks`` (simulator/collectives.py's formulas on the
    group's slowest emulated link: highest latency, lowest bandwidth; 0 if no link is emulated)."""
    places = sorted({layout.workers[r].place for r in ranks})
    links = [layout.link(a, b) for a in places for b in places if a != b]
    links = [k for k in links if k is not None]
    if not links:
        return 0.0
    latency = max(k.latency_s for k in links)
    bandwidth = min(k.bandwidth_bytes_per_s for k in links)
    n = len(ranks)
    if kind == "all_reduce":  # ring: 2(n-1) steps of M/n bytes
        return 2 * (n - 1) * (latency + message_bytes / n / bandwidth)
    # reduce or broadcast inside a group: one tree phase
    return 2 * (n - 1) / n * message_bytes / bandwidth + n * latency
