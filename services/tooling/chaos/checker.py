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
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict

from services.tooling.chaos.history import REPLAY_KINDS

ANOMALIES = ("aborted_reads", "lost_writes", "duplicates", "non_atomic_transactions", "order_violations",
             "read_committed_above_lso", "hanging_transactions", "group_offset_mismatches", "inconsistent_offsets",
             "non_monotonic_polls", "non_monotonic_sends", "torn_transactions", "unexpected_records",
             "check_answer_mismatches", "checks_of_unknown_transactions", "undecided_prepared_transactions")
EXAMPLES_MAX = 5


class Findings:
    def __init__(self):
        self.counts = dict.fromkeys(ANOMALIES, 0)
        self.examples = {kind: [] for kind in ANOMALIES}

    def add(self, kind: str, example, count: int = 1) -> None:
        self.counts[kind] += count
        if len(self.examples[kind]) < EXAMPLES_MAX:
            self.examples[kind].append(example)

    def as_dict(self) -> dict:
        return {"counts": self.counts, "examples": {k: v for k, v in self.examples.items() if v}}


class Txn:
    """One transaction of one worker, as its history tells it."""

    def __init__(self, worker: str, txn: int):
        self.worker, self.txn = worker, txn
        self.instance = 0
        self.intent = ""
        self.sends: dict[str, dict] = {}  # uid -> send event
        self.outcome = "indefinite"
        self.commit_start_s: float | None = None
        self.error = ""
        self.replays: list[dict] = []  # replays delivered while it was open
        self.decision: dict | None = None  # a silent owner's ``decide`` event
        self.prepared = False  # a silent owner's prepare_transaction() returned

    def replays_received(self) -> dict:
        """For an example: the replays this transaction received, if any."""
        if not self.replays:
            return {}
        return {"replays_received": [
            {"kind": r["kind"], "of_txn": f"{self.worker}#{r['of_txn']}", "request": r.get("request"),
             "answers": sorted({a["error"] for a in r.get("answers", [])})} for r in self.replays]}

    @property
    def key(self) -> str:
        return f"{self.worker}#{self.txn}"


def transactions(events: list[dict]) -> dict[tuple[str, int], Txn]:
    txns: dict[tuple[str, int], Txn] = {}

    def txn_of(event) -> Txn:
        key = (event["worker"], event["txn"])
        if key not in txns:
            txns[key] = Txn(*key)
        return txns[key]

    for event in events:
        kind = event["type"]
        if kind == "begin":
            txn = txn_of(event)
            txn.instance, txn.intent = event["instance"], event["intent"]
        elif kind == "send":
            txn_of(event).sends[event["uid"]] = event
        elif kind == "commit_start":
            txn_of(event).commit_start_s = event["t"]
        elif kind == "end":
            txn = txn_of(event)
            txn.outcome, txn.error = event["outcome"], event.get("error", "")
        elif kind == "replay" and event.get("delivered") and (event["worker"], event["into_txn"]) in txns:
            txns[(event["worker"], event["into_txn"])].replays.append(event)
        elif kind == "decide":
            txn_of(event).decision = event
        elif kind == "prepared":
            txn_of(event).prepared = True
    decided = silent_transactions(txns)
    for event in events:  # a silent transaction's commit is requested by the checker's first COMMIT for it
        txn = decided.get(event.get("key")) if event["type"] == "check" and event["answer"] == "COMMIT" else None
        if txn is not None and (txn.commit_start_s is None or event["t"] < txn.commit_start_s):
            txn.commit_start_s = event["t"]
    return txns


def silent_transactions(txns: dict[tuple[str, int], Txn]) -> dict[str, Txn]:
    """The silent owners' transactions by their decision's key."""
    return {txn.decision["key"]: txn for txn in txns.values() if txn.decision is not None}


def tp_of(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def check(events: list[dict], final: dict) -> dict:
    findings = Findings()
    txns = transactions(events)
    by_uid = {uid: txn for txn in txns.values() for uid in txn.sends}
    sends = {uid: event for txn in txns.values() for uid, event in txn.sends.items()}
    rc_final = final.get("read_committed", [])
    ru_final = final.get("read_uncommitted", [])
    polls = [e for e in events if e["type"] == "poll"]
    rc_polls = [e for e in polls if e["isolation"] == "read_committed"]

    # --- unexpected records, aborted reads -----------------------------------------------------------
    all_reads = [(r, "final read_committed") for r in rc_final] + [(r, "final read_uncommitted") for r in ru_final] + \
        [(r, f"poll of {e['worker']}") for e in polls for r in e["records"]]
    for record, where in all_reads:
        if record[3] not in by_uid:
            findings.add("unexpected_records", {"record": record, "read_by": where})
    rc_reads = [(r, "final read") for r in rc_final] + [(r, f"poll of {e['worker']} at {e['t']:.3f}")
                                                         for e in rc_polls for r in e["records"]]
    seen_aborted = set()
    for record, where in rc_reads:
        txn = by_uid.get(record[3])
        if txn is not None and txn.outcome == "aborted" and (record[3], where) not in seen_aborted:
            seen_aborted.add((record[3], where))
            findings.add("aborted_reads", {"record": record, "read_by": where, "transaction": txn.key,
                                           "intent": txn.intent, "error": txn.error, **txn.replays_received()})

    # --- lost writes, non-atomic transactions --------------------------------------------------------------
    visible = {r[3] for r in rc_final}
    for txn in txns.values():
        seen = [uid for uid in txn.sends if uid in visible]
        missing = [uid for uid in txn.sends if uid not in visible]
        if txn.outcome == "committed" and missing:
            findings.add("lost_writes", {"transaction": txn.key, "missing": missing[:5],
                                         "records": len(txn.sends), **txn.replays_received()}, count=len(missing))
        if txn.outcome != "aborted" and seen and missing:
            findings.add("non_atomic_transactions", {"transaction": txn.key, "outcome": txn.outcome,
                                                     "visible": seen[:5], "missing": missing[:5],
                                                     **txn.replays_received()})

    # --- duplicates --------------------------------------------------------------------------------------------
    for name, reads in (("read_committed", rc_final), ("read_uncommitted", ru_final)):
        places = defaultdict(set)
        for topic, partition, offset, uid in reads:
            places[uid].add((tp_of(topic, partition), offset))
        for uid, where in places.items():
            if len(where) > 1:
                findings.add("duplicates", {"uid": uid, "at": sorted(where), "read": name})
    transformed = defaultdict(list)
    for uid in visible:
        src = sends.get(uid, {}).get("src")
        if src is not None:
            transformed[src].append(uid)
    for src, outputs in transformed.items():
        if len(outputs) > 1:
            findings.add("duplicates", {"input": src, "transformed_into": sorted(outputs)})

    # --- order violations, torn transactions -----------------------------------------------------------
    def by_producer_partition(reads):
        groups = defaultdict(list)
        for topic, partition, offset, uid in sorted(reads, key=lambda r: (r[0], r[1], r[2])):
            send = sends.get(uid)
            if send is not None:
                groups[(send["worker"], tp_of(topic, partition))].append((offset, send["txn"], send["idx"], uid))
        return groups

    for (worker, tp), rows in by_producer_partition(rc_final).items():
        for before, after in itertools.pairwise(rows):
            if (after[1], after[2]) <= (before[1], before[2]):
                findings.add("order_violations", {"producer": worker, "partition": tp,
                                                  "offsets": [before[0], after[0]], "uids": [before[3], after[3]]})
    for (worker, tp), rows in by_producer_partition(ru_final).items():
        closed, current = set(), None
        for offset, txn, _, uid in rows:
            if txn != current:
                if txn in closed:
                    findings.add("torn_transactions", {"transaction": f"{worker}#{txn}", "partition": tp,
                                                       "offset": offset, "uid": uid})
                if current is not None:
                    closed.add(current)
                current = txn

    # --- read_committed above the LSO ---------------------------------------------------------------------
    decided = defaultdict(list)  # tp -> [(offset, commit requested at)] of committed transactions' records
    for topic, partition, offset, uid in ru_final:
        txn = by_uid.get(uid)
        if txn is not None and txn.outcome == "committed" and txn.commit_start_s is not None:
            decided[tp_of(topic, partition)].append((offset, txn.commit_start_s, uid))
    prefix = {}
    for tp, rows in decided.items():
        rows.sort()
        latest, acc = (0.0, ""), []
        for offset, start_s, uid in rows:
            latest = max(latest, (start_s, uid))
            acc.append((offset, latest))
        prefix[tp] = acc
    for poll in rc_polls:
        for topic, partition, offset, uid in poll["records"]:
            rows = prefix.get(tp_of(topic, partition))
            if not rows:
                continue
            index = bisect.bisect_right(rows, (offset, (float("inf"), ""))) - 1
            if index >= 0 and rows[index][1][0] > poll["t"]:
                findings.add("read_committed_above_lso", {
                    "read": [topic, partition, offset, uid], "poll_returned_at": poll["t"],
                    "blocking_record": rows[index][1][1], "its_commit_requested_at": rows[index][1][0],
                    "poller": poll["worker"]})

    # --- hanging transactions ---------------------------------------------------------------------------
    for hanging in final.get("hanging", []):
        findings.add("hanging_transactions", {"find_hanging": hanging})
    for listing in final.get("open_transactions", []):
        findings.add("hanging_transactions", {"list_transactions": listing})
    for stuck in final.get("stuck_partitions", []):
        findings.add("hanging_transactions", {"read_committed_end_below_high_watermark": stuck})

    # --- the check-back: the checker's answers, what it left undecided ---------------------------------
    decided = silent_transactions(txns)
    for event in events:
        if event["type"] != "check":
            continue
        txn = decided.get(event["key"])
        if txn is None:
            findings.add("checks_of_unknown_transactions", {"check": event})
            continue
        recorded = txn.decision
        if event["answer"] != recorded["decision"].upper() or event["transactional_id"] != recorded["transactional_id"]:
            findings.add("check_answer_mismatches", {
                "transaction": txn.key, "recorded": {k: recorded[k] for k in ("transactional_id", "decision")},
                "checked": event["transactional_id"], "answered": event["answer"], "checker": event["worker"]})
    for listing in final.get("prepared_transactions", []):
        findings.add("undecided_prepared_transactions", {"list_transactions": listing})

    # --- consumer-group offsets against the output ----------------------------------------------------
    input_topic = final.get("ctp_input")
    if input_topic is not None:
        processed = defaultdict(set)  # input tp -> input uids whose output is visible
        for uid in visible:
            send = sends.get(uid, {})
            if send.get("src_topic") == input_topic:
                processed[tp_of(send["src_topic"], send["src_partition"])].add(send["src"])
        committed_input = defaultdict(dict)
        for topic, partition, offset, uid in rc_final:
            if topic == input_topic:
                committed_input[tp_of(topic, partition)][offset] = uid
        for tp, committed_offset in (final.get("group_offsets") or {}).items():
            below = {uid for offset, uid in committed_input[tp].items()
                     if committed_offset is not None and offset < committed_offset}
            if below != processed[tp]:
                findings.add("group_offset_mismatches", {
                    "partition": tp, "committed_offset": committed_offset,
                    "below_offset_not_in_output": sorted(below - processed[tp])[:5],
                    "in_output_not_below_offset": sorted(processed[tp] - below)[:5]})

    # --- inconsistent offsets ---------------------------------------------------------------------------
    at = defaultdict(set)
    for event in events:
        if event["type"] == "ack" and event["offset"] >= 0:
            at[(tp_of(event["topic"], event["partition"]), event["offset"])].add(event["uid"])
    for record, _ in all_reads:
        at[(tp_of(record[0], record[1]), record[2])].add(record[3])
    for (tp, offset), uids in sorted(at.items()):
        if len(uids) > 1:
            findings.add("inconsistent_offsets", {"partition": tp, "offset": offset, "uids": sorted(map(str, uids))})

    # --- non-monotonic polls and sends -------------------------------------------------------------------
    last_polled = {}
    for poll in polls:
        for topic, partition, offset, uid in poll["records"]:
            key = (poll["worker"], poll["session"], tp_of(topic, partition))
            if key in last_polled and offset <= last_polled[key][0]:
                findings.add("non_monotonic_polls", {"consumer": f"{poll['worker']} session {poll['session']}",
                                                     "partition": key[2], "offsets": [last_polled[key][0], offset],
                                                     "uids": [last_polled[key][1], uid]})
            last_polled[key] = (offset, uid)
    acks = defaultdict(list)
    for event in events:
        if event["type"] == "ack" and event["offset"] >= 0:
            txn = txns.get((event["worker"], event["txn"]))
            instance = txn.instance if txn else 0
            acks[(event["worker"], instance, tp_of(event["topic"], event["partition"]))].append(
                (event["txn"], event["idx"], event["offset"], event["uid"]))
    for (worker, instance, tp), rows in acks.items():
        rows.sort()
        for before, after in itertools.pairwise(rows):
            if after[2] <= before[2]:
                findings.add("non_monotonic_sends", {"producer": f"{worker} instance {instance}", "partition": tp,
                                                     "offsets": [before[2], after[2]], "uids": [before[3], after[3]]})
    return findings.as_dict()


def replay_figures(events: list[dict]) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Delivered replays by kind (every kind, 0 included), and by kind what the
    servers answered them (error code name -> how many partitions or calls)."""
    delivered = dict.fromkeys(REPLAY_KINDS, 0)
    answers: dict[str, dict[str, int]] = {}
    for event in events:
        if event["type"] == "replay" and event.get("delivered"):
            delivered[event["kind"]] = delivered.get(event["kind"], 0) + 1
            codes = answers.setdefault(event["kind"], {})
            for answer in event.get("answers", []):
                codes[answer["error"]] = codes.get(answer["error"], 0) + 1
    return delivered, answers


def figures(events: list[dict], final: dict) -> dict:
    """The run's size: transactions by outcome, records, polls, connection cuts,
    replays (delivered, by kind) and what the servers answered them."""
    txns = transactions(events)
    outcomes = defaultdict(int)
    for txn in txns.values():
        outcomes[txn.outcome] += 1
    visible = {r[3] for r in final.get("read_committed", [])}
    indefinite_visible = sum(1 for t in txns.values() if t.outcome == "indefinite" and t.sends
                             and all(uid in visible for uid in t.sends))
    replays, replay_answers = replay_figures(events)
    decided = silent_transactions(txns)
    checks = [e for e in events if e["type"] == "check"]
    answers = defaultdict(int)
    for check_event in checks:
        answers[check_event["answer"]] += 1
    last_stats = {}
    for event in events:
        if event["type"] == "stats":
            last_stats[event["worker"]] = event
    return {
        "transactions_attempted": len(txns),
        "committed": outcomes["committed"],
        "aborted": outcomes["aborted"],
        "indefinite": outcomes["indefinite"],
        "indefinite_found_committed": indefinite_visible,
        "records_sent": sum(len(t.sends) for t in txns.values()),
        "polls": sum(1 for e in events if e["type"] == "poll"),
        "records_polled": sum(len(e["records"]) for e in events if e["type"] == "poll"),
        "final_read_committed": len(final.get("read_committed", [])),
        "final_read_uncommitted": len(final.get("read_uncommitted", [])),
        "connection_cuts": sum(s["requests_dropped"] + s["responses_dropped"] for s in last_stats.values()),
        "replays": replays,
        "replay_answers": replay_answers,
        "silent_transactions": len(decided),
        "silent_decided_commit": sum(1 for t in decided.values() if t.decision["decision"] == "commit"),
        "silent_prepared": sum(1 for t in decided.values() if t.prepared),
        "silent_committed_visible": sum(1 for t in decided.values() if t.outcome == "committed" and t.sends
                                        and all(uid in visible for uid in t.sends)),
        "checks": len(checks),
        "checks_by_answer": dict(answers),
        "checks_repeated": len(checks) - len({e["key"] for e in checks}),
    }
