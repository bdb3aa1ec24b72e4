"""One chaos run, end to end (``txlog chaos run``):

1. a LocalCluster in ``DIR/cluster`` (coordinators with a 5 s ZooKeeper session
   and fast checks, so that a paused or killed one is replaced within the run);
2. topics, then the workers (``worker.py``) as processes: transactional
   producers, two subscribing members of a consume-transform-produce group,
   read_committed and read_uncommitted pollers, silent owners whose
   transactions only the check-back decides, each with its seed and
   connection cuts, and the silent owners' checker (``silent.py``);
3. the nemesis (``faults.py``) for ``duration_s``, from ``random.Random(seed)``:
   kills, pauses, and replays of the producers' requests (``replay.py``),
   which the producer workers deliver on the nemesis's order;
4. healing: every process resumed or started again, the workers told to stop,
   a wait (bounded) until the check-back decided every silent owner's
   prepared transaction, the checker stopped, then a wait past the
   transaction timeout, so that a transaction still open after that is hanging;
5. the final read of every partition (both isolations), the ctp group's
   offsets, Admin.find_hanging and list_transactions (open, and Prepared);
6. the checker; ``run()`` returns one dict: every anomaly count, the run's
   figures, the faults injected, the seed.

The seed is printed first (stderr), so a run replays with ``--seed``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from services.tooling.chaos import checker, security, silent
from services.tooling.chaos.faults import FAULT_KINDS, Nemesis
from services.tooling.chaos.history import read_events
from services.tooling.chaos.proxy import PeerPaths, ZookeeperRoutes
from services.tooling.chaos.worker import CHECKER_STOP_FILE
from services.tooling.cluster import LocalCluster
from txlog import Admin, Consumer
from txlog.structs import TopicPartition

TOPICS = {"chaos-a": 3, "chaos-b": 2, "chaos-out": 2}
CTP_INPUT, CTP_OUTPUT = "chaos-a", "chaos-out"
PRODUCER_WORKERS = 3
CTP_MEMBERS = ("ctp0", "ctp1")  # subscribing members of one consume-transform-produce group
SILENT_OWNERS = 1  # workers whose transactions only the check-back decides
# The silent owners' group: checked a second after the prepare; never exhausted within a run (an exhausted check
# would abort a transaction decided commit).
SILENT_GROUP_CONFIG = {"transaction.check.interval.ms": "1000", "transaction.check.max": "1000"}
SILENT_DECIDED_TIMEOUT_S = 60.0
FIRST_ROUND_GRACE_S = 240.0  # at least this long past the duration for the nemesis to try every kind once
TXN_TIMEOUT_MS = 6000
COORDINATOR_ARGS = ["--transaction-check-interval-ms", "200", "--ownership-check-interval-ms", "300",
                    "--zookeeper-session-timeout-s", "5"]
# Three instances, every partition on all three (min.insync.replicas 2): any one may be killed, paused or wiped.
PARTITION_SESSION_S = 5
PARTITION_ARGS = ["--zookeeper-session-timeout-s", str(PARTITION_SESSION_S), "--min-insync-replicas", "2",
                  "--replica-lag-time-max-ms", "4000", "--controller-pass-interval-ms", "1000",
                  "--partition-state-refresh-ms", "2000"]
# Compaction runs every 5 s and removes a transaction's markers 30 s after it found none of its batches left:
# __consumer_offsets' markers (one per consume-transform-produce transaction) go within the run, under its faults,
# not a day later.
COMPACTION_ARGS = ["--retention-check-interval-ms", "5000", "--log-cleaner-delete-retention-ms", "30000"]
WORKER_STOP_TIMEOUT_S = 90.0
FINAL_READ_TIMEOUT_S = 60.0
OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Workers:
    """The workload's processes by name; ctp members can be replaced (kill_member)."""

    def __init__(self, directory: Path, bootstrap: str, seed: int, cut_probability: float, silent_owners: int = 0,
                 tls: dict[str, str] | None = None):
        self.directory, self.seed, self.silent_owners = directory, seed, silent_owners
        topics = ",".join(f"{name}:{count}" for name, count in TOPICS.items())
        self.common = ["--bootstrap", bootstrap, "--dir", str(directory), "--stop-file", str(directory / "stop"),
                       "--txn-timeout-ms", str(TXN_TIMEOUT_MS), "--cut-probability", str(cut_probability),
                       "--topics", topics, *security.arguments(tls or {})]
        self.processes: dict[str, subprocess.Popen] = {}
        self.spawned = 0
        self.checker: subprocess.Popen | None = None  # the silent owners' checker: it stops after them
        self.incarnations: dict[str, int] = {}  # ctp member -> how many processes it has had
        (directory / "logs").mkdir(exist_ok=True)

    def start(self) -> None:
        produced = ",".join(f"{name}:{count}" for name, count in TOPICS.items() if name != CTP_OUTPUT)
        for i in range(PRODUCER_WORKERS):
            self._spawn(f"p{i}", ["producer", "--topics", produced])
        for member in CTP_MEMBERS:
            self.respawn(member)
        self._spawn("rc0", ["poller", "--isolation", "read_committed"])
        self._spawn("ru0", ["poller", "--isolation", "read_uncommitted"])
        for i in range(self.silent_owners):
            self._spawn(f"s{i}", ["silent", "--topics", produced])
        if self.silent_owners:
            self.checker = self._spawn("chk0", ["checker"], stopped_with_the_others=False)  # stopped after them (stop_checker)

    def producer_pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.processes.items() if name.startswith("p")}

    def member_pid(self, member: str) -> int:
        return self.processes[f"{member}.{self.incarnations[member]}"].pid

    def respawn(self, member: str) -> int:
        """A new process (a new group member, its history under a new name) for ``member``'s transactional id."""
        self.incarnations[member] = self.incarnations.get(member, 0) + 1
        name = f"{member}.{self.incarnations[member]}"
        return self._spawn(name, ["ctp", "--input", CTP_INPUT, "--output", CTP_OUTPUT, "--member", member]).pid

    def command(self, name: str, spec: list[str]) -> list[str]:
        """A worker's command line: the shared arguments first, so that the
        worker's own (a producer's --topics without the ctp output) win."""
        return [sys.executable, "-m", "services.tooling.chaos.worker", *self.common, *spec, "--name", name,
                "--seed", str(self.seed * 100 + self.spawned)]

    def _spawn(self, name: str, spec: list[str], *, stopped_with_the_others: bool = True) -> subprocess.Popen:
        command = self.command(name, spec)
        self.spawned += 1  # every process its own seed
        with open(self.directory / "logs" / f"worker-{name}.log", "ab") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if stopped_with_the_others:
            self.processes[name] = process
        return process


def stop_workers(directory: Path, workers: dict[str, subprocess.Popen]) -> list[str]:
    """Asks the workers to stop; kills those still running after the timeout (their names)."""
    (directory / "stop").touch()
    deadline = time.monotonic() + WORKER_STOP_TIMEOUT_S
    stuck = []
    for name, process in workers.items():
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
        try:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stuck.append(name)
            process.kill()
            process.wait()
    return stuck


def wait_silent_decided(bootstrap: str, timeout_s: float = SILENT_DECIDED_TIMEOUT_S) -> int:
    """Until no silent owner's transaction is Prepared (the check-back decided
    them all), at most ``timeout_s``; how many are still Prepared then."""
    deadline = time.monotonic() + timeout_s
    with Admin(bootstrap) as admin:
        while True:
            try:
                left = len(admin.list_transactions(states=("Prepared",), prefix=f"{silent.GROUP}/"))
            except Exception as exc:  # noqa: BLE001 - a coordinator still settling: ask again
                log(f"listing the prepared transactions failed: {exc!r}")
                left = -1
            if left == 0 or time.monotonic() > deadline:
                return left
            time.sleep(0.5)


def stop_checker(directory: Path, process: subprocess.Popen | None) -> bool:
    """Asks the silent owners' checker to stop; False when it had to be killed."""
    if process is None:
        return True
    (directory / CHECKER_STOP_FILE).touch()
    try:
        process.wait(timeout=WORKER_STOP_TIMEOUT_S)
        return True
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return False


def read_everything(bootstrap: str, isolation: str, tls: dict[str, str]) -> tuple[list[list], list[str]]:
    """Every record of every partition, from the beginning to the end offsets
    seen at the start; the partitions that could not be read to their end."""
    from services.tooling.chaos.history import decode_uid

    tps = [TopicPartition(t, p) for t, count in TOPICS.items() for p in range(count)]
    records, stuck = [], []
    with Consumer(bootstrap, isolation_level=isolation, fetch_max_wait_ms=100, **tls) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + FINAL_READ_TIMEOUT_S
        while any(consumer.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            records += [[r.topic, r.partition, r.offset, decode_uid(r.value)] for r in consumer.poll(timeout_s=0.5)]
        stuck = [f"{tp.topic}/{tp.partition}" for tp in tps if consumer.position(tp) < ends[tp]]
    return records, stuck


def final_state(bootstrap: str, tls: dict[str, str] | None = None) -> dict:
    """What the checker needs from the cluster at the end: every record (both
    isolations), the ctp group's offsets, hanging, open and prepared
    transactions. ``tls``: the SDK's TLS options (security.options)."""
    tls = tls or {}
    read_committed, stuck_rc = read_everything(bootstrap, "read_committed", tls)
    read_uncommitted, stuck_ru = read_everything(bootstrap, "read_uncommitted", tls)
    tps = [TopicPartition(t, p) for t, count in TOPICS.items() for p in range(count)]
    with Consumer(bootstrap, isolation_level="read_committed", **tls) as consumer:
        lso = consumer.end_offsets(tps)
    with Consumer(bootstrap, isolation_level="read_uncommitted", **tls) as consumer:
        high_watermark = consumer.end_offsets(tps)
    stuck = sorted({*stuck_rc, *stuck_ru, *(f"{tp.topic}/{tp.partition} LSO {lso[tp]} < HW {high_watermark[tp]}"
                                            for tp in tps if lso[tp] < high_watermark[tp])})
    from services.tooling.chaos.worker import CTP_GROUP

    inputs = [TopicPartition(CTP_INPUT, p) for p in range(TOPICS[CTP_INPUT])]
    with Consumer(bootstrap, group_id=CTP_GROUP, **tls) as consumer:
        group_offsets = {f"{tp.topic}/{tp.partition}": consumer.committed(tp) for tp in inputs}
    with Admin(bootstrap, **tls) as admin:
        hanging = [h._asdict() for h in admin.find_hanging(list(TOPICS), max_transaction_timeout_ms=TXN_TIMEOUT_MS * 2)]
        open_txns = [t._asdict() for t in admin.list_transactions(states=OPEN_STATES)]
        prepared = [t._asdict() for t in admin.list_transactions(states=("Prepared",))]
    return {"read_committed": read_committed, "read_uncommitted": read_uncommitted, "group_offsets": group_offsets,
            "ctp_input": CTP_INPUT, "hanging": hanging, "open_transactions": open_txns, "stuck_partitions": stuck,
            "prepared_transactions": prepared}


def run(duration_s: float, *, seed: int | None = None, directory: str | Path | None = None, keep: bool = False,
        fault_interval_s: float = 10.0, cut_probability: float = 0.02, kinds: tuple[str, ...] = FAULT_KINDS,
        silent_owners: int = SILENT_OWNERS) -> dict:
    """Runs the workload for ``duration_s`` under the nemesis (``kinds``: the
    fault kinds it draws from, every one by default; ``silent_owners``: how
    many silent owner workers, 0 for none and no checker); returns the result
    (``result["anomalies"]`` is the sum of every anomaly count)."""
    if silent_owners < 0:
        raise ValueError(f"silent_owners must be >= 0, not {silent_owners}")
    kinds = tuple(kinds)
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown or not kinds:
        raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS)}")
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    log(f"seed {seed} (replay with --seed {seed})")
    directory = Path(directory or tempfile.mkdtemp(prefix="txlog-chaos-")).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "stop").unlink(missing_ok=True)
    (directory / CHECKER_STOP_FILE).unlink(missing_ok=True)
    started_s = time.monotonic()
    routes = ZookeeperRoutes()  # each process's own path to ZooKeeper, which partition_zookeeper cuts
    # the paths between processes, which partition_peers and partition_minority cut (proxied only when drawn)
    peers = PeerPaths(directory / "peer-routes") if {"partition_peers", "partition_minority"} & set(kinds) else None
    cluster = LocalCluster(directory / "cluster", zookeeper_route=routes.route,
                           peer_routes_file=peers.routes_file if peers is not None else None)
    workers: Workers | None = None
    nemesis = None
    nemesis_started_s = time.time()
    try:
        cluster.up(partition_svcs=3, service_args={"coordinator_svc": COORDINATOR_ARGS,
                                                   "partition_svc": PARTITION_ARGS + COMPACTION_ARGS})
        if peers is not None:
            peers.connect(cluster.state.services)
        cluster.wait_until_coordinators_settle()
        with Admin(cluster.state.bootstrap) as admin:
            admin.create_topics(list(TOPICS.items()))
            if silent_owners:
                admin.alter_transaction_group_config(silent.GROUP, SILENT_GROUP_CONFIG)
        workers = Workers(directory, cluster.state.bootstrap, seed, cut_probability, silent_owners)
        workers.start()
        log(f"cluster and {len(workers.processes)} workers up in {directory}; faults every ~{fault_interval_s:.0f} s "
            f"for {duration_s:.0f} s")
        nemesis = Nemesis(cluster, random.Random(seed), fault_interval_s,
                          workers.producer_pids(), members=workers,
                          producer_pause_s=TXN_TIMEOUT_MS / 1000 + 2, directory=directory, kinds=kinds,
                          leader_pause_s=PARTITION_SESSION_S + 2, topics=tuple(TOPICS), routes=routes,
                          zookeeper_cut_s=PARTITION_SESSION_S + 3, peers=peers, peer_cut_s=PARTITION_SESSION_S + 3)
        nemesis_started_s = time.time()
        nemesis.start()
        time.sleep(duration_s)
        # every kind once, however slowly faults go on a loaded machine (each waits for the cluster to heal),
        # bounded by the run's own length again
        first_round_deadline = time.monotonic() + max(duration_s, FIRST_ROUND_GRACE_S)
        while not nemesis.every_kind_injected() and time.monotonic() < first_round_deadline:
            time.sleep(0.5)
        nemesis.stop()
        restarted = nemesis.heal()
        cluster.wait_until_coordinators_settle(timeout_s=120)
        log(f"healed (started again: {restarted or 'none'}); stopping the workers")
        stuck_workers = stop_workers(directory, workers.processes)
        if silent_owners:
            left = wait_silent_decided(cluster.state.bootstrap)
            log(f"silent owners' transactions still prepared: {left}; stopping their checker")
            if not stop_checker(directory, workers.checker):
                stuck_workers.append("chk0")
        time.sleep(TXN_TIMEOUT_MS / 1000 * 2 + 2)  # past the timeout: what is still open now is hanging
        log("final read")
        final = final_state(cluster.state.bootstrap)
        (directory / "final.json").write_text(json.dumps(final))
    finally:
        for process in [*workers.processes.values(), *filter(None, [workers.checker])] if workers is not None else ():
            if process.poll() is None:
                process.kill()
                process.wait()
        if nemesis is not None:
            nemesis.stop()
        cluster.down(grace_s=5)
        routes.close()
        if peers is not None:
            peers.close()
    events = read_events(directory)
    result = checker.check(events, final)
    numbers = checker.figures(events, final)
    faults = {**nemesis.counts(), **numbers.pop("replays")}  # replays: as the workers delivered them
    faults["connection_cuts"] = numbers["connection_cuts"]
    summary = {
        "seed": seed,
        "duration_s": round(time.monotonic() - started_s, 1),
        "workload_s": duration_s,
        **result["counts"],
        "anomalies": sum(result["counts"].values()),
        **numbers,
        "faults_injected": sum(faults.values()),
        "faults": faults,
        "fault_errors": [f"{e.kind} {e.target}: {e.error}" for e in nemesis.log if e.error],
        "stuck_workers": stuck_workers,
        "dir": str(directory),
    }
    fault_log = [{"kind": e.kind, "target": e.target, "start_s": round(e.start_s - nemesis_started_s, 1),
                  "end_s": round(e.end_s - nemesis_started_s, 1), "error": e.error, "detail": e.detail}
                 for e in nemesis.log]
    (directory / "result.json").write_text(json.dumps({**summary, "examples": result["examples"],
                                                       "fault_log": fault_log}, indent=2))
    if result["examples"]:
        log(f"anomaly examples (all in {directory / 'result.json'}):\n" + json.dumps(result["examples"], indent=1)[:4000])
    if not keep and summary["anomalies"] == 0:
        shutil.rmtree(directory, ignore_errors=True)
        summary["dir"] = None
    return summary


__all__ = ["FAULT_KINDS", "SILENT_OWNERS", "run"]
