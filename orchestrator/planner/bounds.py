"""Proven bounds on a config (microbatch size, GPU type and TP degree per stage) before any split.

Per layer ``l``, ``u[l]`` is its forward + backward seconds on the fastest (GPU, TP) pair of the
config. A stage on pair ``p`` takes at least ``rho[p]`` times the ``u`` of its layers, where
``rho[p]`` is the least ratio of ``p``'s time to ``u`` over the layers. A stage holds at most
``n[s]`` layers: the most of the model's smallest layers (by bytes of weights, gradients, optimizer
state and the activations of the microbatches it keeps in flight) that fit in its GPU. So, with
``W = sum(u)``, the slowest stage ``T`` satisfies ``sum_s min(T / rho[s], C[s]) >= W`` where
``C[s]`` is the ``u`` of the ``n[s]`` largest layers: a stage cannot take more than its speed allows
in ``T``, nor more layers than fit. Layers are whole, too: a stage holding ``k`` layers takes at
least ``rho`` times the ``u`` of the ``k`` smallest, so within ``T`` it holds at most the ``k`` that
allows, and the stages together must hold every layer. The larger of the two least ``T`` bounds
every split from below (contiguity and the real layer sizes only make it worse); when the stages
cannot hold every layer even without a time limit, the config cannot hold the model at all: the
memory bound that sets the least stage count and TP degree per GPU type.

Leaving layers out only lowers such a bound, so ``rho``, ``W`` and ``C`` count the heavy layers
alone (``u`` at least half the median layer's): embeddings and heads, light and with other speed
ratios between GPU types, would otherwise set ``rho`` for the transformer blocks.
"""

from __future__ import annotations

import bisect
import math
import statistics

from orchestrator.errors import UserError
from orchestrator.profiles.profile import ModelProfile
from orchestrator.simulator import SimulatorSettings
from orchestrator.simulator.memory import OPTIMIZER_STATE_BYTES

HEAVY_LAYER_SHARE = 0.5  # layers lighter than this share of the median layer are left out


class ConfigBounds:
    """Caches per (microbatch, GPU, TP) so that bounding one config costs O(stages)."""

    def __init__(self, profile: ModelProfile, settings: SimulatorSettings) -> None:
        self.profile, self.settings = profile, settings
        self._work: dict = {}
        self._fastest: dict = {}
        self._prefixes: dict = {}
        self._layers: dict = {}
        self._gpu_seconds: dict = {}
        self._share: dict = {}
        self._mins: dict = {}
        self._families: dict = {}
        self._rhos: dict = {}

    def bytes_per_param(self) -> int:
        """Weights, gradients, optimizer state and fp32 master weights (mixed precision)."""
        element = self.profile.element_bytes
        optimizer = OPTIMIZER_STATE_BYTES.get(self.profile.optimizer, 8)
        return 2 * element + optimizer + (4 if element == 2 else 0)

    def layer_work(self, mbs: int, gpu: str, tp: int) -> list[float] | None:
        """Forward + backward seconds per layer, or None if the profile lacks this TP degree."""
        key = (mbs, gpu, tp)
        if key not in self._work:
            try:
                table = self.profile.time_table(gpu, mbs, tp)
                self._work[key] = [
                    f + b for f, b in zip(table.forward_s, table.backward_s, strict=True)
                ]
            except UserError:
                self._work[key] = None
        return self._work[key]

    def fastest(self, mbs: int, pairs: frozenset) -> tuple | None:
        """(W, the largest u, rho per pair, prefix sums of the heavy u largest first and smallest
        first, the times at which a stage may take one more heavy layer), or None."""
        key = (mbs, pairs)
        if key not in self._fastest:
            works = {pair: self.layer_work(mbs, *pair) for pair in pairs}
            if any(w is None for w in works.values()):
                self._fastest[key] = None
            else:
                u = [min(column) for column in zip(*works.values(), strict=True)]
                typical = statistics.median(u)
                heavy = [i for i, value in enumerate(u) if value >= HEAVY_LAYER_SHARE * typical]
                rho = {pair: min(work[i] / u[i] for i in heavy) for pair, work in works.items()}
                ordered = sorted(u[i] for i in heavy)
                largest_first = _prefix(ordered[::-1])
                smallest_first = _prefix(ordered)
                candidates = sorted(
                    {r * value for r in rho.values() for value in smallest_first[1:]}
                )
                self._fastest[key] = (
                    largest_first[-1],
                    max(u),
                    rho,
                    largest_first,
                    smallest_first,
                    candidates,
                )
        return self._fastest[key]

    def stage_rhos(
        self, mbs: int, gpus: tuple[str, ...], tps: tuple[int, ...]
    ) -> tuple[float, ...] | None:
        """Per stage, ``rho`` of its pair over the layers it may hold: stage ``s`` of ``P`` holds
        only layers of ``[s, s + L - P]`` (contiguous splits, one layer at least per stage), so
        the least ratio of its pair's times to the fastest pair's is taken over the heavy layers
        of that window. A middle stage never holds the embedding or the head, whose speed ratios
        between GPU types can be far from the blocks' (GPT-Neo: V100 at TP 4 takes 1.1x the A100's
        time for the embedding, 3.9x for a block). None if the profile lacks a pair."""
        key = ("stages", mbs, gpus, tps)
        if key in self._rhos:
            return self._rhos[key]
        pairs = frozenset(zip(gpus, tps, strict=True))
        found = None
        if self.fastest(mbs, pairs) is not None:
            slack = self.profile.num_layers - len(gpus)
            found = tuple(
                self._window_rho(mbs, pairs, pair, s, s + slack)
                for s, pair in enumerate(zip(gpus, tps, strict=True))
            )
        self._rhos[key] = found
        return found

    def _window_rho(self, mbs: int, pairs: frozenset, pair: tuple, low: int, high: int) -> float:
        key = ("windows", mbs, pairs, pair)
        table = self._rhos.get(key)
        if table is None:  # table[low][high]: the least ratio over the heavy layers low..high
            u, heavy = self._heavy(mbs, pairs)
            work = self.layer_work(mbs, *pair)
            ratio = [float("inf")] * len(u)
            for i in heavy:
                ratio[i] = work[i] / u[i]
            table = self._rhos[key] = _range_mins(ratio)
        found = table[low][min(high, len(table) - 1)]
        return found if found < float("inf") else self.fastest(mbs, pairs)[2][pair]

    def _heavy(self, mbs: int, pairs: frozenset) -> tuple[list[float], list[int]]:
        """``u`` per layer (the fastest pair's time) and the heavy layers' indices."""
        key = ("heavy", mbs, pairs)
        cached = self._rhos.get(key)
        if cached is None:
            works = [self.layer_work(mbs, *pair) for pair in pairs]
            u = [min(column) for column in zip(*works, strict=True)]
            typical = statistics.median(u)
            cached = self._rhos[key] = (
                u,
                [i for i, value in enumerate(u) if value >= HEAVY_LAYER_SHARE * typical],
            )
        return cached

    def forward_share(self, mbs: int, pairs: frozenset) -> float:
        """The least share of forward in forward + backward over the layers on ``pairs``: a stage's
        forward takes at least this share of its time."""
        key = (mbs, pairs)
        if key not in self._share:
            shares = []
            for g, t in pairs:
                table = self.profile.time_table(g, mbs, t)
                shares += [
                    f / (f + b)
                    for f, b in zip(table.forward_s, table.backward_s, strict=True)
                    if f + b > 0
                ]
            self._share[key] = min(shares)
        return self._share[key]

    def prefixes(self, mbs: int, gpu: str, tp: int, in_flight: int) -> tuple:
        """Prefix sums over layers of seconds and of bytes held on one GPU with ``in_flight``
        microbatches' activations kept, and the bytes it may hold (for the balanced split)."""
        key = (mbs, gpu, tp, in_flight)
        cached = self._prefixes.get(key)
        if cached is None:
            cached = self._prefixes[key] = (
                _prefix(self.layer_work(mbs, gpu, tp)),
                _prefix(self._held(mbs, tp, in_flight)),
                self.room_bytes(gpu, tp),
            )
        return cached

    def room_bytes(self, gpu: str, tp: int) -> float:
        """Bytes a GPU may give to tensors: capacity less overhead, less fragmentation."""
        usable = self.settings.capacity_bytes(gpu) - self.settings.overhead_bytes(gpu, tp)
        return usable / (1 + self.settings.fragmentation_fraction)

    def most_in_flight(self, mbs: int, gpu: str, tp: int, first: int, end: int) -> float:
        """The most microbatches whose kept activations layers ``[first, end)`` on (gpu, tp) can
        hold beside their weights and state: what any warm-up may keep in flight there (inf when
        the layers keep no activations)."""
        held = self._held(mbs, tp, 1)
        static = self._held(mbs, tp, 0)
        per = sum(held[first:end]) - sum(static[first:end])
        room = self.room_bytes(gpu, tp) - sum(static[first:end])
        return room / per if per > 0 else float("inf")

    def max_layers(self, mbs: int, gpu: str, tp: int, in_flight: int) -> int:
        """The most layers one stage on (gpu, tp) can hold: its count of the smallest that fit."""
        key = (mbs, gpu, tp, in_flight)
        if key not in self._layers:
            smallest_first = _prefix(sorted(self._held(mbs, tp, in_flight)))
            room = self.room_bytes(gpu, tp)
            self._layers[key] = bisect.bisect_right(smallest_first, room) - 1
        return self._layers[key]

    def slowest_stage(
        self, mbs: int, gpus: tuple[str, ...], tps: tuple[int, ...], m: int
    ) -> tuple[float, float] | None:
        """(W of the heavy layers, a lower bound on the slowest stage's seconds) for any split of
        this config whose pipelines run ``m`` or more microbatches, or None if no split fits in
        memory."""
        pairs = frozenset(zip(gpus, tps, strict=True))
        fastest = self.fastest(mbs, pairs)
        if fastest is None:
            return None
        stages = len(gpus)
        rows: dict[tuple, int] = {}
        held = 0
        rhos = self.stage_rhos(mbs, gpus, tps)
        for s, pair in enumerate(zip(gpus, tps, strict=True)):
            # standard 1F1B keeps P - s microbatches in flight (fewer when there are fewer)
            n = self.max_layers(mbs, *pair, min(stages - s, m))
            if n <= 0:
                return None
            held += n
            key = (rhos[s], n)  # the stage's speed over the layers it may hold, and their count
            rows[key] = rows.get(key, 0) + 1
        if held < self.profile.num_layers:
            return None

        def take(value) -> float:
            return sum(count * value(choice) for choice, count in rows.items())

        largest_first = fastest[3]
        heavy = len(largest_first) - 1
        pieces = []  # (T at which the stages are full, rho, u they hold then, how many)
        for (rho, n), count in rows.items():
            cap = largest_first[min(n, heavy)]
            pieces.append((cap * rho, rho, cap, count))
        by_work = _least_time(pieces, fastest[0])
        return fastest[0], self._slowest(fastest, take, by_work, rates={r for r, _ in rows})

    def forced_layers(self, mbs: int, gpus: tuple[str, ...], tps: tuple[int, ...]) -> float:
        """A lower bound on the slowest stage from the layers a stage cannot avoid: stage ``s`` of
        ``P`` holds at least one layer of ``[s, s + L - P]`` (the first holds layer 0, the last the
        head), so it takes at least the least of their times on its (GPU, TP) pair."""
        slack = self.profile.num_layers - len(gpus)
        worst = 0.0
        for s, pair in enumerate(zip(gpus, tps, strict=True)):
            mins = self._window_mins(mbs, pair)
            if mins is not None:
                worst = max(worst, mins[s][s + slack])
        return worst

    def forced_blocks(self, mbs: int, blocks: tuple[tuple[str, int], ...], stages: int) -> float:
        """``forced_layers`` for every config of ``stages`` stages in ``blocks`` (each at least one
        stage, in this order): block ``b`` of ``n`` has a stage among ``[b, P - n + b]``, so it
        holds a layer of ``[b, P - n + b + L - P]``; the first block holds layer 0, the last the
        head."""
        layers, n = self.profile.num_layers, len(blocks)
        slack = layers - stages
        worst = 0.0
        for b, pair in enumerate(blocks):
            mins = self._window_mins(mbs, pair)
            if mins is None:
                continue
            if b == 0:
                low, high = 0, slack
            elif b == n - 1:
                low, high = layers - 1 - slack, layers - 1
            else:
                low, high = b, stages - n + b + slack
            worst = max(worst, mins[low][high])
        return worst

    def _window_mins(self, mbs: int, pair: tuple[str, int]) -> list[list[float]] | None:
        """``mins[i][j]``: the least forward + backward seconds of layers ``i..j`` on ``pair``."""
        key = (mbs, pair)
        if key not in self._mins:
            work = self.layer_work(mbs, *pair)
            self._mins[key] = None if work is None else _range_mins(work)
        return self._mins[key]

    def family_slowest(
        self, mbs: int, stages: int, most_stages: dict[tuple[str, int], int]
    ) -> tuple[float, float] | None:
        """(W, a lower bound on the slowest stage) for any config of ``stages`` stages with at most
        ``most_stages[pair]`` on each pair (what its GPUs allow at some data-parallel degree): the
        bounds of ``slowest_stage``, each stage holding what one on the last stage would (the
        fewest activations in flight), stages given to the pairs that hold the most; None if no
        such config fits in memory."""
        # many data-parallel degrees leave the same counts (the large ones: one stage per pair)
        key = (mbs, stages, frozenset(most_stages.items()))
        if key not in self._families:
            self._families[key] = self._family_slowest(mbs, stages, most_stages)
        return self._families[key]

    def _family_slowest(
        self, mbs: int, stages: int, most_stages: dict[tuple[str, int], int]
    ) -> tuple[float, float] | None:
        fastest = self.fastest(mbs, frozenset(most_stages))
        if fastest is None:
            return None
        # the pairs' own ratios over every heavy layer: the blocks' order is not known here (a
        # family's bound is shared by its orders), so neither are the layers each may hold
        rho = fastest[2]
        pool = [
            ((rho[pair], self.max_layers(mbs, *pair, 1)), most)
            for pair, most in most_stages.items()
        ]

        def take(value) -> float:  # the best stages first, up to each pair's count, P in all
            left, got = stages, 0.0
            for v, most in sorted(((value(c), most) for c, most in pool), reverse=True):
                n = min(most, left)
                got += n * v
                left -= n
                if not left:
                    break
            return got if not left else float("-inf")

        if take(lambda choice: choice[1]) < self.profile.num_layers:
            return None
        return fastest[0], self._slowest(fastest, take)

    def _slowest(
        self, fastest: tuple, take, by_work: float | None = None, rates: set | None = None
    ) -> float:
        """The least T for which the stages can hold the heavy layers, by their work (``by_work``
        when known) and by their number; ``take(value)`` adds up ``value((rho, most layers
        held))`` over the stages. ``rates``: the stages' rho values when not the pairs' own."""
        total, largest, rho, largest_first, smallest_first, candidates = fastest
        heavy = len(largest_first) - 1
        if rates is not None and not rates <= set(rho.values()):
            # ``smallest_first`` lives as long as its cached ``fastest``: its id keys the list
            key = ("candidates", id(smallest_first), frozenset(rates))
            found = self._rhos.get(key)
            if found is None:
                found = self._rhos[key] = sorted(
                    {r * value for r in rates for value in smallest_first[1:]}
                )
            candidates = found

        def work_held(t: float) -> float:
            return take(lambda choice: min(t / choice[0], largest_first[min(choice[1], heavy)]))

        def layers_held(t: float) -> float:
            return take(
                lambda choice: min(
                    bisect.bisect_right(smallest_first, t / choice[0]) - 1, choice[1]
                )
            )

        low = by_work
        if low is None:
            # one stage on the slowest pair: all of it
            low, high = 0.0, max(rates or rho.values()) * total
            for _ in range(16):  # low stays a lower bound at every step
                middle = (low + high) / 2
                if work_held(middle) < total:
                    low = middle
                else:
                    high = middle
        # a stage holding k heavy layers takes at least rho times the k smallest: the least T is
        # the first candidate rho * (sum of the k smallest) at which enough layers are held
        first, last = 0, len(candidates) - 1
        if layers_held(candidates[last]) < heavy:
            return max(largest, low, candidates[last])
        while first < last:
            middle = (first + last) // 2
            if layers_held(candidates[middle]) >= heavy:
                last = middle
            else:
                first = middle + 1
        return max(largest, low, candidates[first])

    def fleet_seconds(
        self, mbs: int, pairs: frozenset, gpus_of: dict[str, int], batch: int
    ) -> float:
        """Least seconds per iteration given how many GPUs of each type there are: the heavy
        layers' GPU-seconds (TP degree x seconds) of ``batch / mbs`` microbatches spread over every
        GPU at once, each type at its best speed relative to the fastest (no bubble, no memory)."""
        key = (mbs, pairs)
        if key not in self._gpu_seconds:
            cost: dict[str, list[float]] = {}
            for g, t in pairs:
                work = [t * w for w in self.layer_work(mbs, g, t)]
                cost[g] = (
                    work
                    if g not in cost
                    else [min(a, b) for a, b in zip(cost[g], work, strict=True)]
                )
            best = [min(column) for column in zip(*cost.values(), strict=True)]
            typical = statistics.median(best)
            heavy = [i for i, value in enumerate(best) if value >= HEAVY_LAYER_SHARE * typical]
            kappa = {g: min(c[i] / best[i] for i in heavy) for g, c in cost.items()}
            self._gpu_seconds[key] = (sum(best[i] for i in heavy), kappa)
        total, kappa = self._gpu_seconds[key]
        rate = sum(gpus_of[g] / k for g, k in kappa.items())
        return batch / mbs * total / rate

    def _held(self, mbs: int, tp: int, in_flight: int) -> list[float]:
        sizes = self.profile.layer_table(tp)
        static = self.bytes_per_param()
        return [
            p * static + k * mbs * in_flight
            for p, k in zip(sizes.params, sizes.act_kept_bytes, strict=True)
        ]


def _range_mins(values: list[float]) -> list[list[float]]:
    """``mins[i][j]``: the least of ``values[i..j]`` (inf where ``j < i``)."""
    table = []
    for low in range(len(values)):
        row, least = [float("inf")] * len(values), float("inf")
        for high in range(low, len(values)):
            least = min(least, values[high])
            row[high] = least
        table.append(row)
    return table


def _least_time(pieces: list[tuple[float, float, float, int]], total: float) -> float:
    """The least T with ``sum count * min(T / rho, C) >= total``; ``pieces`` hold
    (C * rho, rho, C, count). The sum grows piecewise linearly: walk its breakpoints."""
    speed = sum(count / rho for _, rho, _, count in pieces)  # its slope while no stage is full
    full = 0.0  # u held by the stages already full
    for limit, rho, cap, count in sorted(pieces):
        if speed > 0 and (total - full) / speed <= limit:
            return (total - full) / speed
        full += count * cap
        speed -= count / rho
    return float("inf")


def _prefix(values: list[float]) -> list[float]:
    total, out = 0.0, [0.0]
    for v in values:
        total += v
        out.append(total)
    return out


def held_share(microbatches: int, stages: int) -> float:
    """``1 - (1 - 1/m)^P``: the share of the work that P stages can hold (search.py's ``seconds``),
    computed so that it stays above 0 however many microbatches there are."""
    if microbatches <= 1:
        return 1.0
    return -math.expm1(stages * math.log1p(-1 / microbatches))


def held_work(microbatches: int, rhos: tuple[float, ...]) -> float:
    """The most work (in the fastest pair's seconds) stages whose times are at least ``rhos``
    times that can hold in one second of pipeline, when stage ``s`` must finish the work of the
    stages ahead of it (one microbatch each) and ``m`` microbatches of its own:
    ``sum_{r<s} rho_r x_r + m rho_s x_s <= 1``. Solved from the last stage back: ``v_s`` is what
    stages ``s..`` hold per second left; stage ``s`` takes all it can when that beats leaving the
    time to the stages after it. With every ``rho`` 1 this is ``1 - (1 - 1/m)^P``."""
    m = microbatches
    value = 0.0
    for rho in reversed(rhos):
        value = max(value, 1 / (m * rho) + value * (1 - 1 / m))
    return value
