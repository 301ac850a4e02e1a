"""``PacedPoll``: an adapter's ``poll_events`` looks at its cloud at most once per interval however
often the driver asks (once between every two steps), hands out what is queued on every call, and
waits for the first event up to the timeout, looking once per interval meanwhile."""

from __future__ import annotations

import threading

from provisioners.base import NodeLost, PacedPoll


class FakeClock:
    """Seconds that pass only when a wait asks them to (``stop.wait``) or the test moves them."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


class TickingStop(threading.Event):
    """A stop event whose ``wait`` moves the fake clock instead of sleeping."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock, self.waits = clock, []

    def wait(self, timeout=None) -> bool:
        self.waits.append(timeout)
        self.clock.now_s += timeout
        return self.is_set()


def _poll(clock: FakeClock, *, found_at_look: int | None = None, interval_s: float = 5.0):
    looks, queue = [], []

    def look() -> None:
        looks.append(clock())
        if found_at_look is not None and len(looks) == found_at_look:
            queue.append(NodeLost(node_id="n1", infra="c/r/z", reason="preempted"))

    def drain():
        events = list(queue)
        queue.clear()
        return events

    stop = TickingStop(clock)
    poll = PacedPoll(look=look, drain=drain, interval_s=interval_s, stop=stop, clock=clock)
    return poll, looks, queue, stop


def test_polls_between_steps_look_once_per_interval_and_drain_every_time():
    clock = FakeClock()
    poll, looks, queue, _ = _poll(clock)
    for _ in range(50):  # 50 steps of 10 ms
        assert poll(timeout_s=0.0) == []
        clock.now_s += 0.01
    assert looks == [100.0]  # one look in the first 0.5 s, not one per step
    queue.append(NodeLost(node_id="n2", infra="c/r/z", reason="terminated"))
    (event,) = poll(timeout_s=0.0)  # queued meanwhile (a launch's failure): no look needed
    assert event.node_id == "n2" and len(looks) == 1
    clock.now_s += 5.0
    assert poll(timeout_s=0.0) == [] and len(looks) == 2  # an interval later: a new look


def test_a_wait_looks_once_per_interval_until_an_event():
    clock = FakeClock()
    poll, looks, _, stop = _poll(clock, found_at_look=3)
    (event,) = poll(timeout_s=60.0)
    assert event.node_id == "n1"
    assert looks == [100.0, 105.0, 110.0]  # looked at the pace, and returned at once
    assert sum(stop.waits) == 10.0


def test_a_wait_without_events_ends_at_its_timeout_and_a_stop_ends_it_sooner():
    clock = FakeClock()
    poll, looks, _, stop = _poll(clock)
    assert poll(timeout_s=12.0) == []
    assert clock() == 112.0 and looks == [100.0, 105.0, 110.0]
    stop.set()
    assert poll(timeout_s=60.0) == [] and clock() < 120.0
