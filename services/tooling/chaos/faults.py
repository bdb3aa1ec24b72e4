"""The nemesis: faults injected into a running LocalCluster and its workload,
drawn from one seeded ``random.Random`` so that a run's schedule replays from
its seed (what the faults meet depends on timing, as in Jepsen).

Kinds (``FAULT_KINDS``):

    kill_partition      kill -9 a partition_svc, start it again (same data, same address)
    kill_leader         kill -9 the leader of a busy partition (one of the workload's), start it again
    wipe_replica        kill -9 a partition_svc, delete its data directory, start it again: it
                        rebuilds every replica it holds from the leaders
    pause_leader        SIGSTOP the leader of a busy partition past its ZooKeeper session, SIGCONT:
                        it wakes a deposed leader, fenced by the new leader epoch, its tail truncated
    kill_coordinator    kill -9 a coordinator_svc, start it again
    kill_producer_id    kill -9 the producer_id_svc, start it again
    kill_zookeeper      kill -9 ZooKeeper, start it again (its data folder survives)
    pause_coordinator   SIGSTOP a coordinator_svc past its ZooKeeper session, SIGCONT: it wakes a zombie
    pause_producer      SIGSTOP a producer worker past its transaction timeout, SIGCONT: it wakes a zombie
    kill_member         kill -9 a subscribing consume-transform-produce member mid-transaction, start a new
                        one for its transactional id: the group moves its partitions (after the session
                        timeout) while the new one fences the old one's transaction
    replay_marker       a producer worker's transaction N: its COMMIT/ABORT WriteTxnMarkers, rebuilt
                        as the coordinator sent it, delivered again to N's leaders seconds later,
                        while N+1 (the opposite outcome) is open on N's partitions
    replay_end_txn      transaction N's EndTxn delivered again to its coordinator while N+1 is open
    replay_produce      a Produce of transaction N delivered again to its leader seconds later,
                        while N is still open (a duplicate) or while N+1 is open (a stale epoch)
    partition_zookeeper a busy partition's leader, a coordinator or the controller cut off from
                        ZooKeeper (its own path there goes dark: proxy.py) past its session, while
                        clients and the other instances still reach it; then healed. The classic
                        split brain: it must stop acknowledging acks=all writes and completing
                        transactions once another instance has taken over
    partition_peers     a busy partition's leader, a coordinator or the controller cut off from the other
                        instances (every path between it and them goes dark, both ways: proxy.PeerPaths)
                        while ZooKeeper and clients still reach it; then healed. A leader cut from its
                        followers shrinks its ISR; a follower cut from its leader leaves it
    partition_minority  a minority side (one partition_svc, a busy leader or the controller, and at random a
                        coordinator) cut off from the majority's instances and from ZooKeeper past their
                        sessions, while clients still reach both sides; then healed

A replay is an order the nemesis writes for one producer worker, which captures
the request and delivers its copy itself (``replay.py``); the nemesis waits a
bounded time for the worker's answer. Its answers (errors, mostly) are what the
servers said, never anomalies; each delivered replay is a ``replay`` event in
the worker's history, and the run counts those.

Client connection cuts (a request dropped, an answer lost) are injected inside
the workers by their FaultInjection; the run adds up their counts.

Every fault is recorded (kind, target, start, end) in ``Nemesis.log``; ``heal()``
resumes and restarts whatever a fault left stopped or dead. Before a fault that
takes a replica away (the partition_svc kinds and the network partitions), the nemesis waits until
every partition is fully replicated again, so that at most one replica of each
partition is down at a time (the condition replication is built for).
"""

from __future__ import annotations

import json
import os
import posixpath
import random
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from services.tooling.chaos.proxy import PeerPaths, ZookeeperRoutes
from services.tooling.chaos.replay import REPLAY_KINDS, Order, wait_done, write_order
from services.tooling.cluster import LocalCluster, pid_alive
from txlog import Admin

PARTITION_KINDS = ("partition_zookeeper", "partition_peers", "partition_minority")  # network partitions (proxy.py)
REPLICA_KINDS = ("kill_partition", "kill_leader", "wipe_replica", "pause_leader", *PARTITION_KINDS)
FAULT_KINDS = (*REPLICA_KINDS, "kill_coordinator", "kill_producer_id", "kill_zookeeper",
               "pause_coordinator", "pause_producer", "kill_member", *REPLAY_KINDS)
REPLICATED_WAIT_S = 90.0  # how long the nemesis waits for every partition to be in sync before a replica fault
DOWN_S_RANGE = (0.5, 3.0)  # how long a killed process stays dead
REPLAY_DELAY_S_RANGE = (1.0, 2.5)  # how late a replay comes (below the workers' transaction timeout)
REPLAY_WAIT_S = 20.0  # how long the nemesis waits for the worker to deliver a replay


class Members(Protocol):
    """The workload's consume-transform-produce members (run.Workers)."""

    incarnations: dict[str, int]

    def member_pid(self, member: str) -> int: ...

    def respawn(self, member: str) -> int: ...


@dataclass
class FaultEvent:
    kind: str
    target: str
    start_s: float
    end_s: float = 0.0
    error: str = ""
    detail: str = ""  # a replay: delivered, or what became of it


@dataclass
class Nemesis:
    """Injects one fault every ``interval_s`` (each kind once, in a seeded
    order, then at random) until ``stop()``."""

    cluster: LocalCluster
    rng: random.Random
    interval_s: float
    producer_pids: dict[str, int]  # worker name -> pid, for pause_producer
    coordinator_pause_s: float = 8.0  # longer than the coordinators' ZooKeeper session
    leader_pause_s: float = 8.0  # longer than the partition_svc ZooKeeper session
    topics: tuple[str, ...] = ()  # the workload's topics, whose leaders kill_leader and pause_leader pick
    producer_pause_s: float = 8.0  # longer than the workers' transaction timeout
    directory: Path | None = None  # the run's folder, where replay orders go
    kinds: tuple[str, ...] = FAULT_KINDS  # the kinds to inject (a run limited to some)
    replay_wait_s: float = REPLAY_WAIT_S
    members: Members | None = None  # the consume-transform-produce members, for kill_member
    routes: ZookeeperRoutes | None = None  # each process's path to ZooKeeper, for partition_zookeeper
    zookeeper_cut_s: float = 8.0  # longer than the cut process's ZooKeeper session
    peers: PeerPaths | None = None  # the paths between the processes, for partition_peers and partition_minority
    peer_cut_s: float = 8.0  # the run sets it longer than the replica lag time and the cut side's ZooKeeper session
    log: list[FaultEvent] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _paused: set[int] = field(default_factory=set)

    def names(self, kind: str) -> list[str]:
        return sorted(n for n, p in self.cluster.state.services.items() if p.kind == kind)

    def every_kind_injected(self) -> bool:
        """Whether the first round (every kind once) is over: a run on a loaded
        machine goes on past its duration until it is, so that each kind of
        fault was tried (see run.run)."""
        return {e.kind for e in self.log if e.end_s} >= set(self.kinds)

    def schedule(self):
        """The fault kinds in order: every kind once (shuffled), then random ones."""
        unknown = sorted(set(self.kinds) - set(FAULT_KINDS))
        if unknown or not self.kinds:
            raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS)}")
        first = list(self.kinds)
        self.rng.shuffle(first)
        yield from first
        while True:
            yield self.rng.choice(self.kinds)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        for kind in self.schedule():
            if self._stop.wait(self.interval_s * (0.5 + self.rng.random())):
                return
            self.inject(kind)

    def inject(self, kind: str) -> FaultEvent:
        waited = self._wait_replicated() if kind in REPLICA_KINDS else ""
        target = {
            "kill_partition": lambda: self.rng.choice(self.names("partition_svc")),
            "kill_leader": self._busy_leader,
            "wipe_replica": lambda: self.rng.choice(self.names("partition_svc")),
            "pause_leader": self._busy_leader,
            "kill_coordinator": lambda: self.rng.choice(self.names("coordinator_svc")),
            "kill_producer_id": lambda: self.rng.choice(self.names("producer_id_svc")),
            "kill_zookeeper": lambda: "zookeeper",
            "pause_coordinator": lambda: self.rng.choice(self.names("coordinator_svc")),
            "pause_producer": lambda: self.rng.choice(sorted(self.producer_pids)),
            "kill_member": lambda: self.rng.choice(sorted(self._members().incarnations)),
            "replay_marker": lambda: self.rng.choice(sorted(self.producer_pids)),
            "replay_end_txn": lambda: self.rng.choice(sorted(self.producer_pids)),
            "replay_produce": lambda: self.rng.choice(sorted(self.producer_pids)),
            "partition_zookeeper": self._split_brain_target,
            "partition_peers": self._split_brain_target,
            "partition_minority": self._minority_side,
        }[kind]()
        event = FaultEvent(kind, target, time.time(), detail=waited)
        self.log.append(event)
        try:
            if kind == "kill_member":
                send_signal(self._members().member_pid(target), signal.SIGKILL)
                self._stop.wait(self.rng.uniform(*DOWN_S_RANGE))
                self._members().respawn(target)
            elif kind.startswith("kill_") or kind == "wipe_replica":
                self.cluster.kill(target, signal.SIGKILL)
                if kind == "wipe_replica":
                    shutil.rmtree(Path(self.cluster.dir) / target, ignore_errors=True)
                self._stop.wait(self.rng.uniform(*DOWN_S_RANGE))
                self.cluster.start(target)
            elif kind == "pause_leader":
                self._pause(self.cluster.state.services[target].pid, self.leader_pause_s)
            elif kind == "pause_coordinator":
                self._pause(self.cluster.state.services[target].pid, self.coordinator_pause_s)
            elif kind == "pause_producer":
                self._pause(self.producer_pids[target], self.producer_pause_s)
            elif kind in REPLAY_KINDS:
                self._replay(event)
            elif kind == "partition_zookeeper":
                self._cut_from_zookeeper(target)
            elif kind in ("partition_peers", "partition_minority"):
                self._cut_from_peers(target.split(","), from_zookeeper=kind == "partition_minority")
        except Exception as exc:  # noqa: BLE001 - recorded; heal() repairs what is left broken
            event.error = repr(exc)[:300]
        event.end_s = time.time()
        return event

    def _members(self) -> Members:
        if self.members is None:
            raise RuntimeError("kill_member needs the run's consume-transform-produce members")
        return self.members

    def _busy_leader(self) -> str:
        """The process leading one of the workload's partitions, drawn at random."""
        with Admin(self.cluster.state.bootstrap, default_api_timeout_ms=20_000) as admin:
            leaders = sorted({p.leader_id for t in admin.describe_topics(list(self.topics)) for p in t.partitions if p.leader_id >= 0})
        if not leaders:
            raise RuntimeError(f"no partition of {self.topics} has a leader")
        return f"partition_svc-{self.rng.choice(leaders)}"

    def _split_brain_target(self) -> str:
        """A busy partition's leader, a coordinator or the controller, drawn at random."""
        choice = self.rng.choice(("leader", "coordinator", "controller"))
        if choice == "coordinator":
            return self.rng.choice(self.names("coordinator_svc"))
        if choice == "controller":
            controller = self._controller()
            if controller is not None:
                return controller
        return self._busy_leader()

    def _minority_side(self) -> str:
        """One partition_svc (a busy leader or the controller) and, at random, a coordinator: comma-joined."""
        side = [(self._controller() if self.rng.random() < 0.5 else None) or self._busy_leader()]
        if self.rng.random() < 0.5:
            side.append(self.rng.choice(self.names("coordinator_svc")))
        return ",".join(side)

    def _controller(self) -> str | None:
        """The partition_svc that is the controller now (read from ZooKeeper), if any."""
        zookeeper = KazooClient(hosts=self.cluster.state.zookeeper)
        try:
            zookeeper.start(timeout=20)
            data, _ = zookeeper.get(posixpath.join(self.cluster.state.zookeeper_root, "controller"))
            return f"partition_svc-{json.loads(data)['node_id']}"
        except (NoNodeError, KazooTimeoutError):
            return None
        finally:
            zookeeper.stop()
            zookeeper.close()

    def _cut_from_zookeeper(self, target: str) -> None:
        if self.routes is None:
            raise RuntimeError("partition_zookeeper needs the run's ZooKeeper routes")
        self.routes.cut(target)
        try:
            self._stop.wait(self.zookeeper_cut_s)
        finally:
            self.routes.heal(target)

    def _cut_from_peers(self, side: list[str], *, from_zookeeper: bool) -> None:
        if self.peers is None or (from_zookeeper and self.routes is None):
            raise RuntimeError("network partitions need the run's paths between processes (and to ZooKeeper)")
        self.peers.cut(side)
        try:
            if from_zookeeper:
                for name in side:
                    self.routes.cut(name)
            self._stop.wait(self.peer_cut_s)
        finally:
            self.peers.heal()
            if from_zookeeper:
                for name in side:
                    self.routes.heal(name)

    def _wait_replicated(self) -> str:
        """Waits (bounded) until no partition is under-replicated; what it saw."""
        deadline = time.monotonic() + REPLICATED_WAIT_S
        while not self._stop.is_set():
            try:
                with Admin(self.cluster.state.bootstrap, default_api_timeout_ms=10_000) as admin:
                    under = admin.under_replicated_partitions()
            except Exception as exc:  # noqa: BLE001 - a cluster in the middle of a fault: ask again
                under = [exc]
            if not under:
                return ""
            if time.monotonic() > deadline:
                return f"{len(under)} partition(s) still under-replicated after {REPLICATED_WAIT_S:.0f} s"
            self._stop.wait(0.5)
        return ""

    def _replay(self, event: FaultEvent) -> None:
        into = "same" if event.kind == "replay_produce" and self.rng.random() < 0.5 else "next"
        order = Order(len(self.log), event.kind, round(self.rng.uniform(*REPLAY_DELAY_S_RANGE), 2), into)
        if self.directory is None:
            raise RuntimeError("replay faults need the run's directory")
        write_order(self.directory, event.target, order)
        done = wait_done(self.directory, event.target, order.seq, self.replay_wait_s, self._stop)
        if done is None:
            event.detail = f"order {order.seq} not delivered within {self.replay_wait_s:.0f} s (the worker goes on trying)"
        else:
            event.detail = f"order {order.seq} delivered: {done['delivered']}"

    def _pause(self, pid: int, pause_s: float) -> None:
        self._paused.add(pid)
        try:
            send_signal(pid, signal.SIGSTOP)
            self._stop.wait(pause_s)
        finally:
            send_signal(pid, signal.SIGCONT)
            self._paused.discard(pid)

    def heal(self) -> list[str]:
        """Resumes paused processes and starts dead cluster processes (ZooKeeper
        first); the names it started."""
        for pid in list(self._paused):
            send_signal(pid, signal.SIGCONT)
        if self.routes is not None:
            self.routes.heal()
        if self.peers is not None:
            self.peers.heal()
        started = []
        ordered = sorted(self.cluster.state.services.items(), key=lambda item: item[1].kind != "zookeeper")
        for name, info in ordered:
            send_signal(info.pid, signal.SIGCONT)
            if not pid_alive(info.pid):
                self.cluster.start(name)
                started.append(name)
        return started

    def counts(self) -> dict[str, int]:
        """Faults injected by kind; a replay counts once its worker reported it
        delivered (the run counts the workers' ``replay`` events instead: a late
        one too)."""
        return {kind: sum(1 for e in self.log if e.kind == kind and not e.error
                          and (kind not in REPLAY_KINDS or e.detail.endswith("delivered: True")))
                for kind in FAULT_KINDS}


def send_signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
