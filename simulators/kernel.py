"""The SimPy kernel: engines as dispatcher processes over ready queues, a host thread per rank,
collectives that wait for every rank of their communicator.

SimPy is the clock and event queue. To simulate hundreds of thousands of ops per second there is
no process per op and no ``AllOf`` per op: each engine is one process that pops the best ready op
of its group (a heap keyed by the policy's priority), holds it for its duration with one
``Timeout``, then decrements its successors' in-degree counters and pushes those that became ready,
waking an idle engine if there is one. Durations, successors and counters are flat lists built
once (:class:`~simulators.problem.SchedulingProblem`).

The host thread is one process per rank. Launches are asynchronous, so between sync points the
host's issue times are a running sum of its per-op overhead, written in bulk; an op whose
dependencies are done before the host has issued it is released by one event at its issue time.
At a sync point the host waits for that op to finish on the device before it issues more.

Ops running at once on the engines of one rank share its device (:mod:`simulators.share`) unless
the configuration declares independent engines; collectives run on links and are not shared.
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
import random
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import cast

import simpy
from simpy.events import Event, Timeout

from opgraph.ir import OpKind
from simulators.config import EngineGroup, EngineRole, SimulationConfig
from simulators.errors import SimulationConfigError, SimulationError
from simulators.policies.base import SchedulingPolicy
from simulators.problem import SchedulingProblem
from simulators.share import DeviceShare, device_share

INF = math.inf
FREE = -1
"""Queue index of ops that occupy no engine."""
COLLECTIVE = -2
"""Queue index of collectives (they go to the link queue of their communicator)."""
NO_TRACK = -1


@dataclass
class RankRecord:
    """What one rank did: per op start, duration and track index; per op host issue time."""

    start_us: list[float]
    """Start of each op (-1 if it never started)."""
    dur_us: list[float]
    """Duration of each op on this rank."""
    track: list[int]
    """Track index of each op (-1 for free ops)."""
    issue_us: list[float]
    """When the host finished issuing each op."""
    alone_us: list[float]
    """Duration of each op had it run alone on the device: ``dur_us`` unless ops running at once
    shared the device and slowed each other (then ``dur_us`` is the longer time it took)."""


@dataclass
class KernelResult:
    """Raw output of :class:`Simulator.run`."""

    ranks: list[RankRecord]
    tracks: list[str]
    """Track names; index ``t`` is the name of track ``t``."""
    track_group: list[str]
    """Engine group of each track."""
    track_rank: list[int]
    """Rank of each track."""
    host_us: list[float]
    """Host time per op."""
    makespan_us: float
    notes: list[str]
    collective_wait_us: list[float]
    """Per rank: time its collectives waited for the other ranks and for a free link."""
    host_segments: list[tuple[int, int]]
    """Program-index ranges the host issued without waiting; each range but the last ends at a sync op."""


class _LinkQueue:
    __slots__ = ("heap", "idle", "order", "pos", "ranks", "started")

    def __init__(self, ranks: list[int], order: list[int]) -> None:
        self.heap: list[int] = []
        self.idle: list[Event] = []
        self.ranks = ranks
        self.order = order
        self.pos = 0
        self.started = False


class Simulator:
    """One simulation run of ``problem`` under ``config`` with host time ``host_us`` per op.

    ``policy`` is resolved by the caller (:func:`simulators.simulate` does it); ``progress`` is
    called with (ops started, ops in all ranks) about a hundred times during long runs.
    """

    def __init__(
        self,
        problem: SchedulingProblem,
        config: SimulationConfig,
        policy: SchedulingPolicy,
        host_us: Sequence[float],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.problem = problem
        self.config = config
        self.policy = policy
        self.progress = progress
        self.notes: list[str] = []
        n = len(problem)
        if len(host_us) != n:
            raise SimulationConfigError(f"host_us has {len(host_us)} entries for {n} ops")
        self.host_us = list(host_us)
        self.env = simpy.Environment()
        self.tp = config.tp
        self._route()
        self._rank_keys()
        self.host_segments = self._host_segments()
        """Program-index ranges the host issues without waiting (each but the last ends at a sync op)."""
        self._started = 0

    # ---------------------------------------------------------------- set-up
    def _route(self) -> None:
        cfg, pb = self.config, self.problem
        cap = self.policy.max_engines
        self.local_groups: list[EngineGroup] = []
        link: EngineGroup | None = None
        for g in cfg.groups:
            if g.role is EngineRole.LINK:
                link = g
                continue
            if cap is not None and g.count > cap:
                self.notes.append(f"policy {self.policy.name} runs {cap} engine(s) per group; {g.name} had {g.count}")
                g = g.model_copy(update={"count": cap})
            self.local_groups.append(g)
        if link is not None and cap is not None and link.count > cap:
            link = link.model_copy(update={"count": cap})
        self.link_group = link
        by_kind: dict[OpKind, int] = {}
        catch_all = 0
        for gi, g in enumerate(self.local_groups):
            if not g.kinds:
                catch_all = gi
            for k in g.kinds:
                by_kind[k] = gi
        qidx = [0] * len(pb)
        comm_size = [0] * len(pb)
        tp = self.tp
        big: set[int] = set()
        free = pb.free
        collective = OpKind.COLLECTIVE
        for i, kind in enumerate(pb.kinds):
            if free[i]:
                qidx[i] = FREE
            elif kind is collective:
                op = pb.ops[i]
                if link is None:
                    raise SimulationConfigError(
                        f"op {op.id} is a collective but no link engine group is configured",
                        hint="add a group with role 'link' (or --links 1)",
                    )
                size = min(int(getattr(op, "group_size", 1)), tp)
                if tp % size:
                    raise SimulationConfigError(
                        f"collective op {op.id} has group_size {size}, which does not divide --tp {tp}",
                        where=f"op {op.id}",
                    )
                if int(getattr(op, "group_size", 1)) > tp:
                    big.add(int(getattr(op, "group_size", 1)))
                qidx[i] = COLLECTIVE
                comm_size[i] = size
            else:
                qidx[i] = by_kind.get(kind, catch_all)
        if big:
            self.notes.append(
                f"collectives of group size {sorted(big)} exceed tp={tp}: the ranks not simulated are assumed identical"
            )
        self.qidx = qidx
        self.comm_size = comm_size
        # Tracks: rank prefix only with several ranks.
        self.tracks: list[str] = []
        self.track_group: list[str] = []
        self.track_rank: list[int] = []
        self.local_tracks: list[list[list[int]]] = []  # [rank][group][engine] -> track index
        self.link_tracks: list[list[int]] = []  # [rank][engine] -> track index
        for r in range(tp):
            prefix = f"rank{r}/" if tp > 1 else ""
            per_group = []
            for g in self.local_groups:
                per_group.append([self._add_track(f"{prefix}{g.name}{k}", g.name, r) for k in range(g.count)])
            self.local_tracks.append(per_group)
            if link is not None:
                self.link_tracks.append(
                    [self._add_track(f"{prefix}{link.name}{k}", link.name, r) for k in range(link.count)]
                )
            else:
                self.link_tracks.append([])

    def _add_track(self, name: str, group: str, rank: int) -> int:
        self.tracks.append(name)
        self.track_group.append(group)
        self.track_rank.append(rank)
        return len(self.tracks) - 1

    def _rank_keys(self) -> None:
        n = len(self.problem)
        prio = self.policy.priorities(self.problem)
        if isinstance(prio, range) and prio == range(n):
            op_at = list(range(n))
        else:
            if len(prio) != n:
                raise SimulationError(f"policy {self.policy.name!r} returned {len(prio)} priorities for {n} ops")
            op_at = sorted(range(n), key=lambda i: (prio[i], i))
        key = [0] * n
        for k, i in enumerate(op_at):
            key[i] = k
        self.key, self.op_at = key, op_at

    def _host_segments(self) -> list[tuple[int, int]]:
        """Program-index ranges ``[a, b]`` the host issues without waiting; each ``b`` but the last is a sync op."""
        pb, host = self.problem, self.config.host
        n = len(pb)
        syncs: set[int] = set()
        if host.sync_ops:
            wanted = set(host.sync_ops)
            syncs |= {i for i, op in enumerate(pb.ops) if op.id in wanted}
        if host.sync_each_step:
            steps = [op.step for op in pb.ops]
            syncs |= {i for i in range(n - 1) if steps[i] is not None and steps[i] != steps[i + 1]}
        segs: list[tuple[int, int]] = []
        a = 0
        for b in sorted(syncs):
            if b < n - 1:
                segs.append((a, b))
                a = b + 1
        if a < n or not segs:
            segs.append((a, n - 1))
        self.watch = bytearray(n)
        for _, b in segs[:-1]:
            self.watch[b] = 1
        return segs

    # ---------------------------------------------------------------- run
    def run(self) -> KernelResult:
        """Simulate; raises :class:`SimulationError` if some op never ran (a deadlock).

        Each call is a fresh run on a new SimPy environment: calling it again gives the same result.
        """
        pb = self.problem
        env = self.env = simpy.Environment()
        self._started = 0
        n, tp = len(pb), self.tp
        self.indeg = [pb.indeg.copy() for _ in range(tp)]
        self.issue = [[INF] * n for _ in range(tp)]
        self.start = [[-1.0] * n for _ in range(tp)]
        self.track = [[NO_TRACK] * n for _ in range(tp)]
        self.dur = [self._durations(r) for r in range(tp)]
        self.share = self._shares()
        # What each op took: its duration, or longer where ops sharing the device slowed it.
        self.took = [d if sh is None else d.copy() for d, sh in zip(self.dur, self.share, strict=True)]
        self.heaps: list[list[list[int]]] = [[[] for _ in self.local_groups] for _ in range(tp)]
        self.idles: list[list[list[Event]]] = [[[] for _ in self.local_groups] for _ in range(tp)]
        self.pend: list[list[list[int]]] = [[[] for _ in self.local_groups] for _ in range(tp)]
        self.timer_at = [[INF] * len(self.local_groups) for _ in range(tp)]
        self.in_order = self.policy.in_order
        if self.in_order:
            key, qidx = self.key, self.qidx
            orders = [sorted(key[i] for i in range(n) if qidx[i] == g) for g in range(len(self.local_groups))]
            self.orders = orders
            self.pos = [[0] * len(self.local_groups) for _ in range(tp)]
        self.links: dict[tuple[int, int], _LinkQueue] = {}
        self.arrivals: dict[tuple[int, int, int], int] = {}
        self.finished_watch: list[set[int]] = [set() for _ in range(tp)]
        self.host_waits: list[tuple[int, Event] | None] = [None] * tp
        self.arrived_at: list[dict[int, float]] = [{} for _ in range(tp)]
        self.coll_wait = [0.0] * tp
        self.issue_cbs = [self._make_issue_cb(r) for r in range(tp)]
        for r in range(tp):
            for g, group in enumerate(self.local_groups):
                for k in range(group.count):
                    env.process(self._engine(r, g, self.local_tracks[r][g][k]))
            env.process(self._host(r))
        if self.progress is not None:
            env.process(self._ticker())
        env.run()
        missing = [
            (r, i) for r in range(tp) if min(self.start[r], default=0.0) < 0 for i in range(n) if self.start[r][i] < 0
        ]
        if missing:
            r, i = missing[0]
            op = pb.ops[i]
            raise SimulationError(
                f"{len(missing)} op(s) never ran (first: op {op.id} {op.definition} on rank {r}): a deadlock",
                hint="a host sync op waits for an op issued after it, or ranks disagree on collectives",
            )
        makespan = 0.0
        for r in range(tp):
            makespan = max(makespan, max(map(operator.add, self.start[r], self.took[r]), default=0.0))
        ranks = [RankRecord(self.start[r], self.took[r], self.track[r], self.issue[r], self.dur[r]) for r in range(tp)]
        notes = list(self.notes)
        slowed = [sum(sh.slowed) for sh in self.share if sh is not None]
        if any(slowed):
            notes.append(
                f"{slowed[0]} op(s) ran slower than alone: ops running at once on several engines share the "
                "device's peak FLOP/s and memory bandwidth (declare independent engines for a device whose "
                "engines each have the whole peak)"
            )
        return KernelResult(
            ranks,
            self.tracks,
            self.track_group,
            self.track_rank,
            self.host_us,
            makespan,
            notes,
            self.coll_wait,
            self.host_segments,
        )

    def _shares(self) -> list[DeviceShare | None]:
        """Per rank, the device its engines share; ``None`` where they cannot slow each other (one
        engine, independent engines, or a problem without the ops' device work)."""
        pb = self.problem
        engines = sum(g.count for g in self.local_groups)
        if self.config.independent_engines or engines < 2 or not pb.compute_us:
            return [None] * self.tp
        return [device_share(pb.compute_us, pb.memory_us, self.dur[r], engines) for r in range(self.tp)]

    def _durations(self, rank: int) -> list[float]:
        base = self.problem.dur_us
        sigma = self.config.jitter
        if sigma <= 0:
            return base.copy()
        rng = random.Random(f"{self.config.seed}:{rank}")
        lognorm = rng.lognormvariate
        return [d * lognorm(0.0, sigma) if d > 0 else d for d in base]

    def _ticker(self) -> Generator[Event, object, None]:
        pb = self.problem
        total = len(pb) * self.tp
        engines = max(1, sum(g.count for g in self.local_groups))
        horizon = max(pb.serial_us / engines, sum(self.host_us), 1e-3)
        step = horizon / 100
        assert self.progress is not None
        while self._started < total:
            yield Timeout(self.env, step)
            self.progress(min(self._started, total), total)
        self.progress(total, total)

    # ---------------------------------------------------------------- processes
    def _engine(self, rank: int, g: int, track_id: int) -> Generator[Event, object, None]:
        env = self.env
        heaps, idles, pends = self.heaps[rank], self.idles[rank], self.pend[rank]
        heap, idle, pend = heaps[g], idles[g], pends[g]
        dur, start, track = self.dur[rank], self.start[rank], self.track[rank]
        took, share = self.took[rank], self.share[rank]
        indeg, issue = self.indeg[rank], self.issue[rank]
        succ, qidx, key, op_at, watch = self.problem.succ, self.qidx, self.key, self.op_at, self.watch
        heappush, heappop = heapq.heappush, heapq.heappop
        slow, arm = self._deps_done, self._arm
        in_order = self.in_order
        order = self.orders[g] if in_order else []
        pos = self.pos[rank] if in_order else []
        while True:
            if pend and issue[pend[0]] <= env.now:
                self._issue_pending(rank, g)
            if heap and (not in_order or heap[0] == order[pos[g]]):
                if in_order:
                    pos[g] += 1
                i = op_at[heappop(heap)]
                start[i] = env.now
                track[i] = track_id
                self._started += 1
                if share is None:
                    yield Timeout(env, dur[i])
                else:  # ops running at once share the device
                    took_i = yield from share.hold(env, i, dur[i])
                    if took_i is not None:
                        took[i] = took_i
                if watch[i]:
                    self._notify(rank, i)
                now = env.now
                for j in succ[i]:
                    c = indeg[j] - 1
                    indeg[j] = c
                    if c == 0:
                        q = qidx[j]
                        if q >= 0 and issue[j] <= now:
                            heappush(heaps[q], key[j])
                            wake = idles[q]
                            if wake:
                                wake.pop(0).succeed()
                        else:
                            slow(rank, j)
            else:
                if pend:
                    arm(rank, g, 1)
                ev = Event(env)
                idle.append(ev)
                yield ev

    def _issue_pending(self, rank: int, g: int, now: float | None = None) -> None:
        """Move ops of group ``g`` whose issue time has come (by ``now``, default the clock) from the
        pending heap to the ready heap."""
        pend, heap, issue, key = self.pend[rank][g], self.heaps[rank][g], self.issue[rank], self.key
        now = self.env.now if now is None else max(now, self.env.now)
        while pend and issue[pend[0]] <= now:
            heapq.heappush(heap, key[heapq.heappop(pend)])
        idle = self.idles[rank][g]
        extra = len(heap) - 1
        while idle and extra > 0:
            idle.pop(0).succeed()
            extra -= 1

    def _arm(self, rank: int, g: int, extra_idle: int = 0) -> None:
        """Make sure an event fires when the first pending op of group ``g`` is issued, if anyone waits."""
        pend = self.pend[rank][g]
        if not pend or not (self.idles[rank][g] or extra_idle):
            return
        t = self.issue[rank][pend[0]]
        current = self.timer_at[rank][g]
        if current <= t:
            return
        self.timer_at[rank][g] = t
        ev = Timeout(self.env, t - self.env.now, (rank, g, t))
        ev.callbacks.append(self._on_timer)

    def _on_timer(self, ev: Event) -> None:
        # The timer fires at now + (t - now), which rounding can put a hair before t: the ops due at
        # t are released by t itself, or none would be and no timer would be armed again.
        rank, g, t = cast(tuple[int, int, float], ev.value)
        if self.timer_at[rank][g] <= t:
            self.timer_at[rank][g] = INF
        self._issue_pending(rank, g, t)
        if self.heaps[rank][g]:
            idle = self.idles[rank][g]
            if idle:
                idle.pop(0).succeed()
        self._arm(rank, g)

    def _host(self, rank: int) -> Generator[Event, object, None]:
        env = self.env
        issue, indeg, hus = self.issue[rank], self.indeg[rank], self.host_us
        segments = self.host_segments
        last = len(segments) - 1
        for s, (a, b) in enumerate(segments):
            times = itertools.accumulate(hus[a : b + 1], initial=env.now)
            next(times)
            issue[a : b + 1] = times
            # Ops whose predecessors finished before the host got to them (all sources at first).
            for i in itertools.compress(range(a, b + 1), map(operator.not_, indeg[a : b + 1])):
                self._deps_done(rank, i)
            if s < last and b not in self.finished_watch[rank]:
                ev = Event(env)
                self.host_waits[rank] = (b, ev)
                yield ev

    def _make_issue_cb(self, rank: int) -> Callable[[Event], None]:
        ready = self._ready

        def issued(ev: Event) -> None:
            ready(rank, cast(int, ev.value))

        return issued

    def _notify(self, rank: int, i: int) -> None:
        self.finished_watch[rank].add(i)
        w = self.host_waits[rank]
        if w is not None and w[0] == i:
            self.host_waits[rank] = None
            w[1].succeed()

    # ---------------------------------------------------------------- slow paths
    def _deps_done(self, rank: int, j: int) -> None:
        """Op ``j`` of ``rank`` has all its predecessors done: release it now or at its issue time."""
        t = self.issue[rank][j]
        now = self.env.now
        if t > now:
            if t == INF:  # the host releases it when it gets there
                return
            q = self.qidx[j]
            if q >= 0:  # engines take it once issued; an event only if an engine idles meanwhile
                heapq.heappush(self.pend[rank][q], j)
                self._arm(rank, q)
            else:
                ev = Timeout(self.env, t - now, j)
                ev.callbacks.append(self.issue_cbs[rank])
            return
        self._ready(rank, j)

    def _ready(self, rank: int, j: int) -> None:
        """Op ``j`` of ``rank`` is issued and its predecessors are done."""
        q = self.qidx[j]
        if q >= 0:
            heapq.heappush(self.heaps[rank][q], self.key[j])
            wake = self.idles[rank][q]
            if wake:
                wake.pop(0).succeed()
        elif q == FREE:
            self.start[rank][j] = self.env.now
            self._started += 1
            self._complete(rank, j)
        else:
            self._arrive(rank, j)

    def _complete(self, rank: int, i: int) -> None:
        """Op ``i`` of ``rank`` finished (free ops, collectives): release its successors."""
        stack = [i]
        succ, indeg, watch = self.problem.succ, self.indeg[rank], self.watch
        while stack:
            i = stack.pop()
            if watch[i]:
                self._notify(rank, i)
            for j in succ[i]:
                c = indeg[j] - 1
                indeg[j] = c
                if c == 0:
                    now = self.env.now
                    if self.qidx[j] == FREE and self.issue[rank][j] <= now:
                        self.start[rank][j] = now
                        self._started += 1
                        stack.append(j)
                    else:
                        self._deps_done(rank, j)

    def _arrive(self, rank: int, j: int) -> None:
        """A collective is ready on ``rank``; when every rank of its communicator is, it is queued."""
        size = self.comm_size[j]
        self.arrived_at[rank][j] = self.env.now
        cg = rank // size
        akey = (size, cg, j)
        count = self.arrivals.get(akey, 0) + 1
        if count < size:
            self.arrivals[akey] = count
            return
        self.arrivals.pop(akey, None)
        lq = self.links.get((size, cg))
        if lq is None:
            order = sorted(self.key[i] for i in range(len(self.problem)) if self.comm_size[i] == size)
            lq = _LinkQueue(list(range(cg * size, (cg + 1) * size)), order)
            self.links[(size, cg)] = lq
            assert self.link_group is not None
            for k in range(self.link_group.count):
                self.env.process(self._link_engine(lq, k))
        heapq.heappush(lq.heap, self.key[j])
        if lq.idle:
            lq.idle.pop(0).succeed()

    def _link_engine(self, lq: _LinkQueue, k: int) -> Generator[Event, object, None]:
        env = self.env
        op_at, in_order = self.op_at, self.in_order
        ranks = lq.ranks
        while True:
            if lq.heap and (not in_order or lq.heap[0] == lq.order[lq.pos]):
                lq.pos += 1
                j = op_at[heapq.heappop(lq.heap)]
                now = env.now
                d = max(self.dur[r][j] for r in ranks)
                for r in ranks:
                    self.coll_wait[r] += now - self.arrived_at[r].pop(j)
                    self.start[r][j] = now
                    self.dur[r][j] = d
                    self.took[r][j] = d
                    self.track[r][j] = self.link_tracks[r][k]
                    self._started += 1
                yield Timeout(env, d)
                for r in ranks:
                    self._complete(r, j)
            else:
                ev = Event(env)
                lq.idle.append(ev)
                yield ev
