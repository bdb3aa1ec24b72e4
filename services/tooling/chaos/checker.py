"""The checker: pure functions over a chaos run's histories (``history.py``) and
its final reads, after Jepsen's Kafka workload (jepsen.tests.kafka). No I/O.

``check(events, final)`` returns ``{"counts": {kind: n}, "examples": {kind: [...]}}``
for every kind in ``ANOMALIES``; a correct system gives 0 for each.

``final`` is what the run read after healing the cluster and waiting out the
transaction timeout: ``read_committed`` and ``read_uncommitted`` (lists of
``[topic, partition, offset, uid]``, every partition read to its end),
``group_offsets`` ({"topic/partition": committed offset or None} of the
consume-transform-produce group), ``ctp_input`` (its input topic), ``hanging``
(Admin.find_hanging, as dicts), ``open_transactions`` (Admin.list_transactions
in Ongoing/Prepare* states, as dicts), ``stuck_partitions`` (partitions whose
read_committed end stayed below the high watermark), ``prepared_transactions``
(Admin.list_transactions in the Prepared state, after the run waited for the
check-back to decide the silent owners' transactions).

Transaction outcomes: ``committed`` (commit returned), ``aborted`` (it never
asked to commit), ``indefinite`` (commit raised, or no ``end``: the worker died).
An indefinite transaction may be either, but all or nothing of it.

A silent owner's transaction (``silent.py``) is decided by the check-back
alone, from the decision its owner recorded before the prepare (``decide``):
``committed`` when decided commit and prepared (the check-back must commit it:
visible exactly once, or it is a lost write, non-atomic, a duplicate),
``aborted`` when decided abort (never visible, or it is an aborted read),
``indefinite`` when decided commit but the prepare raised. Its commit counts
as requested from the first COMMIT the checker answered for it (for
read_committed_above_lso). The checker's ``check`` events are checked against
the decisions: every check answered as recorded, none of a transaction no owner
decided. A transaction checked again after a COMMIT or ABORT (a coordinator
failover, a zombie coordinator) is allowed by the check-back's contract: it is
counted (``checks_repeated``), not an anomaly; a delivery twice of its records
is (``duplicates``).

Replayed requests (``replay`` events: a copy of a marker, EndTxn or Produce of
transaction N delivered late, into N or N+1) are faults, not anomalies: what
the servers answered them is reported by ``figures`` (``replay_answers``), and
an anomaly's example about a transaction that received a replay names it
(``replays_received``), since that is where a replay that wrongly ended it shows.

Anomalies
---------
aborted_reads         a record of an aborted transaction read under read_committed (a poll or the final read)
lost_writes           a record of a committed transaction missing from the final read_committed read
duplicates            a unique id at two offsets, or an input record transformed twice into visible output
non_atomic_transactions  a committed or indefinite transaction of which some records are visible and some not
order_violations      one producer's visible records in one partition not in the order it sent them
read_committed_above_lso  a read_committed poll returned an offset at or above a record whose transaction
                      had not asked to commit yet when the poll returned (the LSO was below it)
hanging_transactions  an open transaction left after the timeout (find_hanging, list_transactions, a stuck LSO)
group_offset_mismatches  the ctp group's committed offset of an input partition disagrees with the
                      input records whose output is visible
inconsistent_offsets  two different records at one offset (acks, polls and final reads together)
non_monotonic_polls   one consumer session's offsets of a partition not increasing from poll to poll
non_monotonic_sends   one producer object's acknowledged offsets of a partition not increasing in send order
torn_transactions     a transaction's records of one partition split by another transaction of the same
                      producer (its writes spanned two transactions)
unexpected_records    a record no worker sent
check_answer_mismatches  the silent owners' checker answered a check otherwise than the decision recorded
                      for it (UNKNOWN included), or for another transactional id than the decision's
checks_of_unknown_transactions  a check of a transaction no silent owner decided
undecided_prepared_transactions  a transaction still Prepared at the end (the check-back never decided it)

Structure
---------
``parse_history`` is the one place that reads the events' dicts and the
positional ``[topic, partition, offset, uid]`` records: it makes them typed
records (``Record``, ``Begin``, ``Send``, ``Ack``, ``CommitStart``, ``End``,
``Decide``, ``Prepared``, ``Check``, ``Poll``, ``Replay``, ``Stats``).
``transactions`` gathers them into ``Txn``s. Each anomaly kind has a function
of its name yielding its ``Finding``s; ``check`` runs each on the indexes it
needs.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from services.tooling.chaos.history import REPLAY_KINDS

ANOMALIES = ("aborted_reads", "lost_writes", "duplicates", "non_atomic_transactions", "order_violations",
             "read_committed_above_lso", "hanging_transactions", "group_offset_mismatches", "inconsistent_offsets",
             "non_monotonic_polls", "non_monotonic_sends", "torn_transactions", "unexpected_records",
             "check_answer_mismatches", "checks_of_unknown_transactions", "undecided_prepared_transactions")
EXAMPLES_MAX = 5


class Finding(NamedTuple):
    """One anomaly found: its example, and how many anomalies it counts for (a lost write: its records missing)."""
    example: dict
    count: int = 1


class Findings:
    def __init__(self):
        self.counts = dict.fromkeys(ANOMALIES, 0)
        self.examples = {kind: [] for kind in ANOMALIES}

    def add(self, kind: str, example, count: int = 1) -> None:
        self.counts[kind] += count
        if len(self.examples[kind]) < EXAMPLES_MAX:
            self.examples[kind].append(example)

    def extend(self, kind: str, findings: Iterable[Finding]) -> None:
        for example, count in findings:
            self.add(kind, example, count)

    def as_dict(self) -> dict:
        return {"counts": self.counts, "examples": {k: v for k, v in self.examples.items() if v}}


def tp_of(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


# --- typed records ---------------------------------------------------------------------------------------


class Record(NamedTuple):
    """A record read: a final read's or a poll's ``[topic, partition, offset, uid]`` (uid None: no worker's value)."""
    topic: str
    partition: int
    offset: int
    uid: str | None

    @property
    def tp(self) -> str:
        return tp_of(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class Begin:
    worker: str
    txn: int
    instance: int  # the producer object's number
    intent: str  # commit | abort


@dataclass(frozen=True, slots=True)
class Send:
    worker: str
    txn: int
    idx: int
    uid: str
    topic: str
    partition: int
    src: str | None = None  # consume-transform-produce: the input record's uid (None: no worker's value)
    src_topic: str | None = None
    src_partition: int | None = None


@dataclass(frozen=True, slots=True)
class Ack:
    worker: str
    txn: int
    idx: int
    uid: str
    topic: str
    partition: int
    offset: int

    @property
    def tp(self) -> str:
        return tp_of(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class CommitStart:
    worker: str
    txn: int
    t: float


@dataclass(frozen=True, slots=True)
class End:
    worker: str
    txn: int
    outcome: str  # committed | aborted | indefinite
    error: str


@dataclass(frozen=True, slots=True)
class Decide:
    """A silent owner's decision, recorded before the prepare."""
    worker: str
    txn: int
    key: str
    transactional_id: str
    decision: str  # commit | abort


@dataclass(frozen=True, slots=True)
class Prepared:
    """A silent owner's prepare_transaction() returned."""
    worker: str
    txn: int


@dataclass(frozen=True, slots=True)
class Check:
    """A check the silent owners' checker answered."""
    worker: str
    t: float
    transactional_id: str
    key: str
    answer: str  # COMMIT | ABORT | UNKNOWN
    event: dict = field(compare=False, repr=False)  # as recorded: an example shows it whole


@dataclass(frozen=True, slots=True)
class Poll:
    worker: str
    t: float
    isolation: str
    session: int
    records: tuple[Record, ...]


@dataclass(frozen=True, slots=True)
class Replay:
    worker: str
    kind: str
    of_txn: int
    into_txn: int
    request: dict | None
    errors: tuple[str, ...]  # what the servers answered, an error code name per answer
    delivered: bool


@dataclass(frozen=True, slots=True)
class Stats:
    worker: str
    requests_dropped: int
    responses_dropped: int


Event = Begin | Send | Ack | CommitStart | End | Decide | Prepared | Check | Poll | Replay | Stats
E = TypeVar("E")


@dataclass(frozen=True)
class Run:
    """A run's histories and final reads as typed records; ``events`` in the order they were read."""
    events: tuple[Event, ...]
    read_committed: tuple[Record, ...]
    read_uncommitted: tuple[Record, ...]

    def of(self, kind: type[E]) -> list[E]:
        return [event for event in self.events if isinstance(event, kind)]


def parse_history(events: list[dict], final: dict) -> Run:
    """The events the checker reads, and the final reads, as typed records."""
    typed = (parse_event(event) for event in events)
    return Run(events=tuple(event for event in typed if event is not None),
               read_committed=records_of(final.get("read_committed", [])),
               read_uncommitted=records_of(final.get("read_uncommitted", [])))


def records_of(rows: Iterable[Sequence]) -> tuple[Record, ...]:
    return tuple(Record(*row) for row in rows)


def parse_event(event: dict) -> Event | None:
    """One history event as a typed record; None for a kind the checker does not read."""
    match event["type"]:
        case "begin":
            return Begin(event["worker"], event["txn"], event["instance"], event["intent"])
        case "send":
            return Send(event["worker"], event["txn"], event["idx"], event["uid"], event["topic"], event["partition"],
                        event.get("src"), event.get("src_topic"), event.get("src_partition"))
        case "ack":
            return Ack(event["worker"], event["txn"], event["idx"], event["uid"], event["topic"], event["partition"],
                       event["offset"])
        case "commit_start":
            return CommitStart(event["worker"], event["txn"], event["t"])
        case "end":
            return End(event["worker"], event["txn"], event["outcome"], event.get("error", ""))
        case "decide":
            return Decide(event["worker"], event["txn"], event["key"], event["transactional_id"], event["decision"])
        case "prepared":
            return Prepared(event["worker"], event["txn"])
        case "check":
            return Check(event["worker"], event["t"], event["transactional_id"], event["key"], event["answer"], event)
        case "poll":
            return Poll(event["worker"], event["t"], event["isolation"], event["session"], records_of(event["records"]))
        case "replay":
            return Replay(event["worker"], event["kind"], event["of_txn"], event["into_txn"], event.get("request"),
                          tuple(answer["error"] for answer in event.get("answers", [])), bool(event.get("delivered")))
        case "stats":
            return Stats(event["worker"], event["requests_dropped"], event["responses_dropped"])
    return None


# --- transactions ------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Txn:
    """One transaction of one worker, as its history tells it."""
    worker: str
    txn: int
    instance: int = 0
    intent: str = ""
    sends: dict[str, Send] = field(default_factory=dict)  # by uid
    outcome: str = "indefinite"
    commit_start_s: float | None = None
    error: str = ""
    replays: list[Replay] = field(default_factory=list)  # replays delivered while it was open
    decision: Decide | None = None  # a silent owner's
    prepared: bool = False  # a silent owner's prepare_transaction() returned

    def replays_received(self) -> dict:
        """For an example: the replays this transaction received, if any."""
        if not self.replays:
            return {}
        return {"replays_received": [
            {"kind": r.kind, "of_txn": f"{self.worker}#{r.of_txn}", "request": r.request,
             "answers": sorted(set(r.errors))} for r in self.replays]}

    @property
    def key(self) -> str:
        return f"{self.worker}#{self.txn}"


def transactions(events: Sequence[Event]) -> dict[tuple[str, int], Txn]:
    txns: dict[tuple[str, int], Txn] = {}

    def txn_of(event) -> Txn:
        key = (event.worker, event.txn)
        if key not in txns:
            txns[key] = Txn(*key)
        return txns[key]

    for event in events:
        match event:
            case Begin():
                txn = txn_of(event)
                txn.instance, txn.intent = event.instance, event.intent
            case Send():
                txn_of(event).sends[event.uid] = event
            case CommitStart():
                txn_of(event).commit_start_s = event.t
            case End():
                txn = txn_of(event)
                txn.outcome, txn.error = event.outcome, event.error
            case Replay(delivered=True) if (event.worker, event.into_txn) in txns:
                txns[(event.worker, event.into_txn)].replays.append(event)
            case Decide():
                txn_of(event).decision = event
            case Prepared():
                txn_of(event).prepared = True
    decided = silent_transactions(txns)
    for event in events:  # a silent transaction's commit is requested by the checker's first COMMIT for it
        txn = decided.get(event.key) if isinstance(event, Check) and event.answer == "COMMIT" else None
        if txn is not None and (txn.commit_start_s is None or event.t < txn.commit_start_s):
            txn.commit_start_s = event.t
    return txns


def silent_transactions(txns: dict[tuple[str, int], Txn]) -> dict[str, Txn]:
    """The silent owners' transactions by their decision's key."""
    return {txn.decision.key: txn for txn in txns.values() if txn.decision is not None}


# --- the check --------------------------------------------------------------------------------------------


def check(events: list[dict], final: dict) -> dict:
    run = parse_history(events, final)
    rc, ru = run.read_committed, run.read_uncommitted
    txns = transactions(run.events)
    by_uid = {uid: txn for txn in txns.values() for uid in txn.sends}
    sends = {uid: send for txn in txns.values() for uid, send in txn.sends.items()}
    visible = {record.uid for record in rc}
    polls = run.of(Poll)
    rc_polls = [poll for poll in polls if poll.isolation == "read_committed"]
    acks = [ack for ack in run.of(Ack) if ack.offset >= 0]
    checks = run.of(Check)
    decided = silent_transactions(txns)

    findings = Findings()
    findings.extend("aborted_reads", aborted_reads(rc, rc_polls, by_uid))
    findings.extend("lost_writes", lost_writes(txns, visible))
    findings.extend("duplicates", duplicates(rc, ru, sends, visible))
    findings.extend("non_atomic_transactions", non_atomic_transactions(txns, visible))
    findings.extend("order_violations", order_violations(rc, sends))
    findings.extend("read_committed_above_lso", read_committed_above_lso(rc_polls, ru, by_uid))
    findings.extend("hanging_transactions", hanging_transactions(final))
    findings.extend("group_offset_mismatches", group_offset_mismatches(final, rc, sends, visible))
    findings.extend("inconsistent_offsets", inconsistent_offsets(acks, rc, ru, polls))
    findings.extend("non_monotonic_polls", non_monotonic_polls(polls))
    findings.extend("non_monotonic_sends", non_monotonic_sends(acks, txns))
    findings.extend("torn_transactions", torn_transactions(ru, sends))
    findings.extend("unexpected_records", unexpected_records(rc, ru, polls, by_uid))
    findings.extend("check_answer_mismatches", check_answer_mismatches(checks, decided))
    findings.extend("checks_of_unknown_transactions", checks_of_unknown_transactions(checks, decided))
    findings.extend("undecided_prepared_transactions", undecided_prepared_transactions(final))
    return findings.as_dict()


def every_read(rc: Sequence[Record], ru: Sequence[Record], polls: Sequence[Poll]) -> list[tuple[Record, str]]:
    """Every record read, with who read it: the final reads, then the polls."""
    return [(r, "final read_committed") for r in rc] + [(r, "final read_uncommitted") for r in ru] + \
        [(r, f"poll of {poll.worker}") for poll in polls for r in poll.records]


def unexpected_records(rc: Sequence[Record], ru: Sequence[Record], polls: Sequence[Poll],
                       by_uid: dict[str, Txn]) -> Iterator[Finding]:
    for record, where in every_read(rc, ru, polls):
        if record.uid not in by_uid:
            yield Finding({"record": list(record), "read_by": where})


def aborted_reads(rc: Sequence[Record], rc_polls: Sequence[Poll], by_uid: dict[str, Txn]) -> Iterator[Finding]:
    """One per record and reader (the final read, a poll)."""
    reads = [(r, "final read") for r in rc] + [(r, f"poll of {poll.worker} at {poll.t:.3f}")
                                               for poll in rc_polls for r in poll.records]
    seen = set()
    for record, where in reads:
        txn = by_uid.get(record.uid)
        if txn is not None and txn.outcome == "aborted" and (record.uid, where) not in seen:
            seen.add((record.uid, where))
            yield Finding({"record": list(record), "read_by": where, "transaction": txn.key,
                           "intent": txn.intent, "error": txn.error, **txn.replays_received()})


def lost_writes(txns: dict[tuple[str, int], Txn], visible: set) -> Iterator[Finding]:
    """One example per committed transaction, counting each of its records missing."""
    for txn in txns.values():
        missing = [uid for uid in txn.sends if uid not in visible]
        if txn.outcome == "committed" and missing:
            yield Finding({"transaction": txn.key, "missing": missing[:5], "records": len(txn.sends),
                           **txn.replays_received()}, count=len(missing))


def non_atomic_transactions(txns: dict[tuple[str, int], Txn], visible: set) -> Iterator[Finding]:
    for txn in txns.values():
        seen = [uid for uid in txn.sends if uid in visible]
        missing = [uid for uid in txn.sends if uid not in visible]
        if txn.outcome != "aborted" and seen and missing:
            yield Finding({"transaction": txn.key, "outcome": txn.outcome, "visible": seen[:5],
                           "missing": missing[:5], **txn.replays_received()})


def duplicates(rc: Sequence[Record], ru: Sequence[Record], sends: dict[str, Send], visible: set) -> Iterator[Finding]:
    """A uid at two places of one final read, then an input record transformed into two visible outputs."""
    for name, reads in (("read_committed", rc), ("read_uncommitted", ru)):
        places = defaultdict(set)
        for record in reads:
            places[record.uid].add((record.tp, record.offset))
        for uid, where in places.items():
            if len(where) > 1:
                yield Finding({"uid": uid, "at": sorted(where), "read": name})
    transformed = defaultdict(list)  # input uid -> its visible outputs' uids
    for uid in visible:
        send = sends.get(uid)
        if send is not None and send.src is not None:
            transformed[send.src].append(uid)
    for src, outputs in transformed.items():
        if len(outputs) > 1:
            yield Finding({"input": src, "transformed_into": sorted(outputs)})


class Placed(NamedTuple):
    """A record read, with where its producer put it in its transactions."""
    offset: int
    txn: int
    idx: int
    uid: str


def by_producer_partition(reads: Sequence[Record], sends: dict[str, Send]) -> dict[tuple[str, str], list[Placed]]:
    """(producer worker, partition) -> its records read there, in offset order."""
    groups = defaultdict(list)
    for record in sorted(reads, key=lambda r: (r.topic, r.partition, r.offset)):
        send = sends.get(record.uid)
        if send is not None:
            groups[(send.worker, record.tp)].append(Placed(record.offset, send.txn, send.idx, record.uid))
    return groups


def order_violations(rc: Sequence[Record], sends: dict[str, Send]) -> Iterator[Finding]:
    for (worker, tp), rows in by_producer_partition(rc, sends).items():
        for before, after in itertools.pairwise(rows):
            if (after.txn, after.idx) <= (before.txn, before.idx):
                yield Finding({"producer": worker, "partition": tp, "offsets": [before.offset, after.offset],
                               "uids": [before.uid, after.uid]})


def torn_transactions(ru: Sequence[Record], sends: dict[str, Send]) -> Iterator[Finding]:
    for (worker, tp), rows in by_producer_partition(ru, sends).items():
        closed, current = set(), None
        for row in rows:
            if row.txn != current:
                if row.txn in closed:
                    yield Finding({"transaction": f"{worker}#{row.txn}", "partition": tp, "offset": row.offset,
                                   "uid": row.uid})
                if current is not None:
                    closed.add(current)
                current = row.txn


class Blocker(NamedTuple):
    """Of a partition's committed records up to an offset, the one whose commit was requested last."""
    commit_requested_s: float
    uid: str


class LsoBound(NamedTuple):
    """A read_committed poll returned at or above ``offset`` only after ``blocker``'s commit was requested."""
    offset: int
    blocker: Blocker


def lso_bounds(ru: Sequence[Record], by_uid: dict[str, Txn]) -> dict[str, list[LsoBound]]:
    """By partition, in offset order: each committed record's offset, with its blocker."""
    committed = defaultdict(list)  # tp -> [(offset, commit requested at, uid)] of committed transactions' records
    for record in ru:
        txn = by_uid.get(record.uid)
        if txn is not None and txn.outcome == "committed" and txn.commit_start_s is not None:
            committed[record.tp].append((record.offset, txn.commit_start_s, record.uid))
    bounds = {}
    for tp, rows in committed.items():
        rows.sort()
        latest, acc = Blocker(0.0, ""), []
        for offset, start_s, uid in rows:
            latest = max(latest, Blocker(start_s, uid))
            acc.append(LsoBound(offset, latest))
        bounds[tp] = acc
    return bounds


def read_committed_above_lso(rc_polls: Sequence[Poll], ru: Sequence[Record],
                             by_uid: dict[str, Txn]) -> Iterator[Finding]:
    bounds = lso_bounds(ru, by_uid)
    for poll in rc_polls:
        for record in poll.records:
            rows = bounds.get(record.tp)
            if not rows:
                continue
            index = bisect.bisect_right(rows, (record.offset, (float("inf"), ""))) - 1  # the last at or below it
            if index >= 0 and rows[index].blocker.commit_requested_s > poll.t:
                blocker = rows[index].blocker
                yield Finding({"read": list(record), "poll_returned_at": poll.t, "blocking_record": blocker.uid,
                               "its_commit_requested_at": blocker.commit_requested_s, "poller": poll.worker})


def hanging_transactions(final: dict) -> Iterator[Finding]:
    for hanging in final.get("hanging", []):
        yield Finding({"find_hanging": hanging})
    for listing in final.get("open_transactions", []):
        yield Finding({"list_transactions": listing})
    for stuck in final.get("stuck_partitions", []):
        yield Finding({"read_committed_end_below_high_watermark": stuck})


def check_answer_mismatches(checks: Sequence[Check], decided: dict[str, Txn]) -> Iterator[Finding]:
    for asked in checks:
        txn = decided.get(asked.key)
        if txn is None:
            continue
        recorded = txn.decision
        if asked.answer != recorded.decision.upper() or asked.transactional_id != recorded.transactional_id:
            yield Finding({
                "transaction": txn.key,
                "recorded": {"transactional_id": recorded.transactional_id, "decision": recorded.decision},
                "checked": asked.transactional_id, "answered": asked.answer, "checker": asked.worker})


def checks_of_unknown_transactions(checks: Sequence[Check], decided: dict[str, Txn]) -> Iterator[Finding]:
    for asked in checks:
        if asked.key not in decided:
            yield Finding({"check": asked.event})


def undecided_prepared_transactions(final: dict) -> Iterator[Finding]:
    for listing in final.get("prepared_transactions", []):
        yield Finding({"list_transactions": listing})


def group_offset_mismatches(final: dict, rc: Sequence[Record], sends: dict[str, Send],
                            visible: set) -> Iterator[Finding]:
    input_topic = final.get("ctp_input")
    if input_topic is None:
        return
    processed = defaultdict(set)  # input tp -> input uids whose output is visible
    for uid in visible:
        send = sends.get(uid)
        if send is not None and send.src_topic == input_topic:
            processed[tp_of(send.src_topic, send.src_partition)].add(send.src)
    committed_input = defaultdict(dict)  # input tp -> {offset: uid} read committed
    for record in rc:
        if record.topic == input_topic:
            committed_input[record.tp][record.offset] = record.uid
    for tp, committed_offset in (final.get("group_offsets") or {}).items():
        below = {uid for offset, uid in committed_input[tp].items()
                 if committed_offset is not None and offset < committed_offset}
        if below != processed[tp]:
            yield Finding({"partition": tp, "committed_offset": committed_offset,
                           "below_offset_not_in_output": sorted(below - processed[tp])[:5],
                           "in_output_not_below_offset": sorted(processed[tp] - below)[:5]})


def inconsistent_offsets(acks: Sequence[Ack], rc: Sequence[Record], ru: Sequence[Record],
                         polls: Sequence[Poll]) -> Iterator[Finding]:
    """Acknowledgements, polls and final reads together."""
    at = defaultdict(set)  # (tp, offset) -> uids
    for ack in acks:
        at[(ack.tp, ack.offset)].add(ack.uid)
    for record, _ in every_read(rc, ru, polls):
        at[(record.tp, record.offset)].add(record.uid)
    for (tp, offset), uids in sorted(at.items()):
        if len(uids) > 1:
            yield Finding({"partition": tp, "offset": offset, "uids": sorted(map(str, uids))})


def non_monotonic_polls(polls: Sequence[Poll]) -> Iterator[Finding]:
    last_polled: dict[tuple[str, int, str], Record] = {}  # (worker, session, tp) -> the record it polled last
    for poll in polls:
        for record in poll.records:
            key = (poll.worker, poll.session, record.tp)
            last = last_polled.get(key)
            if last is not None and record.offset <= last.offset:
                yield Finding({"consumer": f"{poll.worker} session {poll.session}", "partition": record.tp,
                               "offsets": [last.offset, record.offset], "uids": [last.uid, record.uid]})
            last_polled[key] = record


def non_monotonic_sends(acks: Sequence[Ack], txns: dict[tuple[str, int], Txn]) -> Iterator[Finding]:
    by_producer = defaultdict(list)  # (worker, producer object, tp) -> its acks
    for ack in acks:
        txn = txns.get((ack.worker, ack.txn))
        instance = txn.instance if txn is not None else 0
        by_producer[(ack.worker, instance, ack.tp)].append(ack)
    for (worker, instance, tp), rows in by_producer.items():
        rows.sort(key=lambda ack: (ack.txn, ack.idx, ack.offset, ack.uid))  # send order
        for before, after in itertools.pairwise(rows):
            if after.offset <= before.offset:
                yield Finding({"producer": f"{worker} instance {instance}", "partition": tp,
                               "offsets": [before.offset, after.offset], "uids": [before.uid, after.uid]})


# --- figures ------------------------------------------------------------------------------------------------


def replay_figures(events: list[dict]) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Delivered replays by kind (every kind, 0 included), and by kind what the
    servers answered them (error code name -> how many partitions or calls)."""
    delivered = dict.fromkeys(REPLAY_KINDS, 0)
    answers: dict[str, dict[str, int]] = {}
    for replay in parse_history(events, {}).of(Replay):
        if replay.delivered:
            delivered[replay.kind] = delivered.get(replay.kind, 0) + 1
            codes = answers.setdefault(replay.kind, {})
            for error in replay.errors:
                codes[error] = codes.get(error, 0) + 1
    return delivered, answers


def figures(events: list[dict], final: dict) -> dict:
    """The run's size: transactions by outcome, records, polls, connection cuts,
    replays (delivered, by kind) and what the servers answered them."""
    run = parse_history(events, final)
    txns = transactions(run.events)
    outcomes = defaultdict(int)
    for txn in txns.values():
        outcomes[txn.outcome] += 1
    visible = {record.uid for record in run.read_committed}
    indefinite_visible = sum(1 for t in txns.values() if t.outcome == "indefinite" and t.sends
                             and all(uid in visible for uid in t.sends))
    replays, replay_answers = replay_figures(events)
    decided = silent_transactions(txns)
    polls = run.of(Poll)
    checks = run.of(Check)
    answers = defaultdict(int)
    for asked in checks:
        answers[asked.answer] += 1
    last_stats = {stats.worker: stats for stats in run.of(Stats)}
    return {
        "transactions_attempted": len(txns),
        "committed": outcomes["committed"],
        "aborted": outcomes["aborted"],
        "indefinite": outcomes["indefinite"],
        "indefinite_found_committed": indefinite_visible,
        "records_sent": sum(len(t.sends) for t in txns.values()),
        "polls": len(polls),
        "records_polled": sum(len(poll.records) for poll in polls),
        "final_read_committed": len(run.read_committed),
        "final_read_uncommitted": len(run.read_uncommitted),
        "connection_cuts": sum(s.requests_dropped + s.responses_dropped for s in last_stats.values()),
        "replays": replays,
        "replay_answers": replay_answers,
        "silent_transactions": len(decided),
        "silent_decided_commit": sum(1 for t in decided.values() if t.decision.decision == "commit"),
        "silent_prepared": sum(1 for t in decided.values() if t.prepared),
        "silent_committed_visible": sum(1 for t in decided.values() if t.outcome == "committed" and t.sends
                                        and all(uid in visible for uid in t.sends)),
        "checks": len(checks),
        "checks_by_answer": dict(answers),
        "checks_repeated": len(checks) - len({asked.key for asked in checks}),
    }
