"""The chaos checker on small synthetic histories: a clean one reports every
count 0, and each anomaly kind, planted once, is reported with its count and
an example."""

import pytest

from services.tooling.chaos.checker import ANOMALIES, check, figures


class Scenario:
    """Builds a history and the final reads it should lead to."""

    def __init__(self):
        self.events = []
        self.now = 1000.0
        self.rc, self.ru = [], []
        self.final = {"group_offsets": {}, "hanging": [], "open_transactions": [], "stuck_partitions": []}

    def event(self, event_type, worker, **fields):
        self.now += 1
        self.events.append({"type": event_type, "worker": worker, "t": self.now, **fields})

    def txn(self, worker, txn, writes, outcome="committed", instance=1, src=None):
        """``writes``: [(topic, partition, offset)]; returns the uids. ``outcome`` None: no end event."""
        intent = "abort" if outcome == "aborted" else "commit"
        self.event("begin", worker, txn=txn, instance=instance, intent=intent)
        uids = []
        for idx, (topic, partition, offset) in enumerate(writes):
            uid = f"{worker}/{txn}/{idx}"
            uids.append(uid)
            extra = {} if src is None else src[idx]
            self.event("send", worker, txn=txn, idx=idx, uid=uid, topic=topic, partition=partition, **extra)
            self.event("ack", worker, txn=txn, idx=idx, uid=uid, topic=topic, partition=partition, offset=offset)
        self.event("commit_start" if intent == "commit" else "abort_start", worker, txn=txn)
        if outcome is not None:
            self.event("end", worker, txn=txn, outcome=outcome)
        return uids

    def appear(self, uids_at, committed=True):
        """The records (topic, partition, offset, uid) in the final reads."""
        for record in uids_at:
            self.ru.append(list(record))
            if committed:
                self.rc.append(list(record))

    def poll(self, worker, isolation, records, session=1):
        self.event("poll", worker, isolation=isolation, session=session, t0=self.now, records=[list(r) for r in records])

    def check(self):
        return check(self.events, {**self.final, "read_committed": self.rc, "read_uncommitted": self.ru})


def clean() -> Scenario:
    """Two producers, a committed, an aborted and an indefinite (found committed) transaction, a poller."""
    s = Scenario()
    a = s.txn("p0", 1, [("a", 0, 0), ("b", 0, 0)])
    s.appear([("a", 0, 0, a[0]), ("b", 0, 0, a[1])])
    b = s.txn("p0", 2, [("a", 0, 1)], outcome="aborted")
    s.appear([("a", 0, 1, b[0])], committed=False)
    c = s.txn("p1", 1, [("a", 0, 3), ("a", 0, 4)], outcome="indefinite")
    s.appear([("a", 0, 3, c[0]), ("a", 0, 4, c[1])])
    s.poll("rc0", "read_committed", [("a", 0, 0, a[0]), ("a", 0, 3, c[0])])
    s.poll("ru0", "read_uncommitted", [("a", 0, 0, a[0]), ("a", 0, 1, b[0])])
    return s


def assert_only(result, kind, count=1):
    assert result["counts"][kind] == count, result
    assert result["examples"][kind], result
    assert {k: v for k, v in result["counts"].items() if v} == {kind: count}


def test_a_clean_history_reports_zero_of_every_anomaly():
    s = clean()
    result = s.check()
    assert set(result["counts"]) == set(ANOMALIES)
    assert all(count == 0 for count in result["counts"].values()), result
    assert result["examples"] == {}
    numbers = figures(s.events, {"read_committed": s.rc, "read_uncommitted": s.ru})
    assert (numbers["committed"], numbers["aborted"], numbers["indefinite"]) == (1, 1, 1)
    assert numbers["indefinite_found_committed"] == 1


def test_an_indefinite_transaction_may_be_aborted_all_of_it():
    s = clean()
    d = s.txn("p2", 1, [("b", 1, 0), ("b", 1, 1)], outcome=None)  # the worker died before the answer
    s.appear([("b", 1, 0, d[0]), ("b", 1, 1, d[1])], committed=False)
    assert sum(s.check()["counts"].values()) == 0


@pytest.mark.parametrize("where", ["final", "poll"])
def test_a_record_of_an_aborted_transaction_read_committed_is_an_aborted_read(where):
    s = clean()
    uid = "p0/2/0"
    if where == "final":
        s.rc.append(["a", 0, 1, uid])
    else:
        s.poll("rc0", "read_committed", [("a", 0, 1, uid)], session=2)
    result = s.check()
    assert_only(result, "aborted_reads")
    assert result["examples"]["aborted_reads"][0]["transaction"] == "p0#2"


def test_a_committed_record_never_read_is_a_lost_write_and_non_atomic():
    s = clean()
    s.rc = [r for r in s.rc if r[3] != "p0/1/1"]
    s.ru = [r for r in s.ru if r[3] != "p0/1/1"]
    result = s.check()
    assert result["counts"]["lost_writes"] == 1
    assert result["examples"]["lost_writes"][0]["missing"] == ["p0/1/1"]
    assert result["counts"]["non_atomic_transactions"] == 1
    assert sum(result["counts"].values()) == 2


def test_an_indefinite_transaction_seen_in_part_is_non_atomic():
    s = clean()
    s.rc = [r for r in s.rc if r[3] != "p1/1/1"]  # visible uncommitted only: aborted, but its sibling committed
    result = s.check()
    assert_only(result, "non_atomic_transactions")
    assert result["examples"]["non_atomic_transactions"][0]["outcome"] == "indefinite"


def test_a_record_at_two_offsets_is_a_duplicate():
    s = clean()
    s.ru.append(["c", 0, 0, "p0/1/0"])
    assert_only(s.check(), "duplicates")


def test_an_input_record_transformed_twice_is_a_duplicate():
    s = clean()
    src = {"src": "p0/1/0", "src_topic": "a", "src_partition": 0, "src_offset": 0}
    x = s.txn("ctp0", 1, [("out", 0, 0)], src=[src])
    y = s.txn("ctp0", 2, [("out", 0, 1)], src=[src])
    s.appear([("out", 0, 0, x[0]), ("out", 0, 1, y[0])])
    result = s.check()
    assert_only(result, "duplicates")
    assert result["examples"]["duplicates"][0]["input"] == "p0/1/0"


def test_records_of_one_producer_out_of_send_order_are_an_order_violation():
    s = Scenario()
    a = s.txn("p0", 1, [("a", 0, 0)])
    b = s.txn("p0", 2, [("a", 0, 1)])
    s.appear([("a", 0, 0, b[0]), ("a", 0, 1, a[0])])  # the log holds them the other way round
    result = check(s.events, {"read_committed": s.rc, "read_uncommitted": s.ru})
    assert result["counts"]["order_violations"] == 1
    assert result["examples"]["order_violations"][0]["producer"] == "p0"


def test_a_read_committed_poll_past_a_transaction_not_yet_committing_is_above_the_lso():
    s = Scenario()
    s.event("begin", "p0", txn=1, instance=1, intent="commit")
    s.event("send", "p0", txn=1, idx=0, uid="p0/1/0", topic="a", partition=0)
    s.event("send", "p1", txn=1, idx=0, uid="p1/1/0", topic="a", partition=0)
    s.event("begin", "p1", txn=1, instance=1, intent="commit")
    s.event("commit_start", "p1", txn=1)
    s.event("end", "p1", txn=1, outcome="committed")
    s.poll("rc0", "read_committed", [("a", 0, 1, "p1/1/0")])  # p0's transaction at offset 0 is still open
    s.event("commit_start", "p0", txn=1)
    s.event("end", "p0", txn=1, outcome="committed")
    s.appear([("a", 0, 0, "p0/1/0"), ("a", 0, 1, "p1/1/0")])
    result = s.check()
    assert_only(result, "read_committed_above_lso")
    assert result["examples"]["read_committed_above_lso"][0]["blocking_record"] == "p0/1/0"


@pytest.mark.parametrize("source", ["hanging", "open_transactions", "stuck_partitions"])
def test_a_transaction_open_after_the_timeout_is_hanging(source):
    s = clean()
    s.final[source] = [{"topic": "a", "partition": 0, "producer_id": 7}]
    assert_only(s.check(), "hanging_transactions")


def test_group_offsets_past_input_without_output_disagree_with_the_output():
    s = clean()
    s.final["ctp_input"] = "a"
    src = {"src": "p0/1/0", "src_topic": "a", "src_partition": 0, "src_offset": 0}
    x = s.txn("ctp0", 1, [("out", 0, 0)], src=[src])
    s.appear([("out", 0, 0, x[0])])
    s.final["group_offsets"] = {"a/0": 1}
    assert sum(s.check()["counts"].values()) == 0  # offset 1: input offset 0 processed, exactly
    s.final["group_offsets"] = {"a/0": 5}  # also claims offsets 3 and 4, whose output is nowhere
    result = s.check()
    assert_only(result, "group_offset_mismatches")
    assert result["examples"]["group_offset_mismatches"][0]["below_offset_not_in_output"] == ["p1/1/0", "p1/1/1"]


def test_two_records_at_one_offset_are_inconsistent_offsets():
    s = clean()
    s.poll("ru0", "read_uncommitted", [("a", 0, 4, "p0/1/0")], session=2)  # the final read has p1/1/1 there
    result = s.check()
    assert_only(result, "inconsistent_offsets")
    assert result["examples"]["inconsistent_offsets"][0] == {"partition": "a/0", "offset": 4,
                                                             "uids": ["p0/1/0", "p1/1/1"]}


def test_a_consumer_going_back_in_one_session_is_a_non_monotonic_poll():
    s = clean()
    s.poll("rc0", "read_committed", [("a", 0, 0, "p0/1/0")])  # session 1 read offset 3 already
    assert_only(s.check(), "non_monotonic_polls")


def test_a_later_send_acknowledged_at_a_lower_offset_is_a_non_monotonic_send():
    s = Scenario()
    a = s.txn("p0", 1, [("a", 0, 5), ("a", 0, 4)])
    s.appear([("a", 0, 5, a[0]), ("a", 0, 4, a[1])])
    result = s.check()
    assert result["counts"]["non_monotonic_sends"] == 1
    assert result["examples"]["non_monotonic_sends"][0]["offsets"] == [5, 4]


def test_a_transaction_split_by_another_of_its_producer_is_torn():
    s = Scenario()
    a = s.txn("p0", 1, [("a", 0, 0), ("a", 0, 2)], outcome="aborted")
    b = s.txn("p0", 2, [("a", 0, 1)], outcome="aborted", instance=2)  # a new producer object: no send order
    s.appear([("a", 0, 0, a[0]), ("a", 0, 1, b[0]), ("a", 0, 2, a[1])], committed=False)
    result = s.check()
    assert_only(result, "torn_transactions")
    assert result["examples"]["torn_transactions"][0]["transaction"] == "p0#1"


def test_a_record_no_worker_sent_is_unexpected():
    s = clean()
    s.ru.append(["b", 1, 0, None])
    assert_only(s.check(), "unexpected_records")


def replay(s, worker, of_txn, into_txn, kind="replay_marker", errors=("INVALID_TXN_STATE",), delivered=True):
    s.event("replay", worker, kind=kind, seq=0, of_txn=of_txn, into_txn=into_txn, delay_s=1.0, into="next",
            request={"producer_id": 7, "producer_epoch": of_txn + 1, "committed": True, "partitions": ["a/0"]},
            answers=[{"address": "127.0.0.1:1", "partition": "a/0", "error": e} for e in errors],
            delivered=delivered)


def test_replays_refused_are_faults_counted_by_kind_not_anomalies():
    s = clean()
    replay(s, "p0", 1, 2)
    replay(s, "p0", 1, 2, kind="replay_end_txn", errors=("PRODUCER_FENCED",))
    replay(s, "p1", 1, 1, kind="replay_produce", errors=("NONE",))  # a duplicate, answered its offsets
    replay(s, "p1", 1, 2, kind="replay_produce", errors=("UNAVAILABLE",), delivered=False)
    result = s.check()
    assert all(count == 0 for count in result["counts"].values()), result
    numbers = figures(s.events, {"read_committed": s.rc, "read_uncommitted": s.ru})
    assert numbers["replays"] == {"replay_marker": 1, "replay_end_txn": 1, "replay_produce": 1}
    assert numbers["replay_answers"] == {"replay_marker": {"INVALID_TXN_STATE": 1},
                                         "replay_end_txn": {"PRODUCER_FENCED": 1}, "replay_produce": {"NONE": 1}}


def test_no_replay_counts_every_replay_kind_zero():
    numbers = figures(clean().events, {})
    assert numbers["replays"] == {"replay_marker": 0, "replay_end_txn": 0, "replay_produce": 0}
    assert numbers["replay_answers"] == {}


def test_an_aborted_transaction_made_visible_by_a_replayed_commit_marker_is_an_aborted_read_naming_it():
    """Transaction N commits; its COMMIT marker, replayed while N+1 is open, ends N+1 on a/0: N+1's
    record stays visible after N+1 aborts."""
    s = Scenario()
    n = s.txn("p0", 1, [("a", 0, 0)])
    s.appear([("a", 0, 0, n[0])])
    s.event("begin", "p0", txn=2, instance=1, intent="abort")
    s.event("send", "p0", txn=2, idx=0, uid="p0/2/0", topic="a", partition=0)
    s.event("ack", "p0", txn=2, idx=0, uid="p0/2/0", topic="a", partition=0, offset=2)
    replay(s, "p0", 1, 2, errors=("NONE",))
    s.event("abort_start", "p0", txn=2)
    s.event("end", "p0", txn=2, outcome="aborted")
    s.appear([("a", 0, 2, "p0/2/0")])
    result = s.check()
    assert_only(result, "aborted_reads")
    example = result["examples"]["aborted_reads"][0]
    assert example["transaction"] == "p0#2"
    assert [(r["kind"], r["of_txn"], r["answers"]) for r in example["replays_received"]] == \
        [("replay_marker", "p0#1", ["NONE"])]


def test_a_committed_transaction_hidden_by_a_replayed_abort_marker_is_lost_naming_it():
    s = Scenario()
    s.txn("p0", 1, [("a", 0, 0)], outcome="aborted")
    s.appear([("a", 0, 0, "p0/1/0")], committed=False)
    s.event("begin", "p0", txn=2, instance=1, intent="commit")
    for idx, (partition, offset) in enumerate([(0, 2), (1, 0)]):
        s.event("send", "p0", txn=2, idx=idx, uid=f"p0/2/{idx}", topic="a", partition=partition)
        s.event("ack", "p0", txn=2, idx=idx, uid=f"p0/2/{idx}", topic="a", partition=partition, offset=offset)
    replay(s, "p0", 1, 2, errors=("NONE",))
    s.event("commit_start", "p0", txn=2)
    s.event("end", "p0", txn=2, outcome="committed")
    s.appear([("a", 0, 2, "p0/2/0")], committed=False)  # ended by the replayed ABORT on a/0
    s.appear([("a", 1, 0, "p0/2/1")])
    result = s.check()
    assert {k: v for k, v in result["counts"].items() if v} == {"lost_writes": 1, "non_atomic_transactions": 1}
    for kind in ("lost_writes", "non_atomic_transactions"):
        assert result["examples"][kind][0]["replays_received"][0]["of_txn"] == "p0#1"


def test_a_replay_not_delivered_is_not_named():
    s = clean()
    s.rc.append(["a", 0, 1, "p0/2/0"])  # p0#2 aborted, read committed
    replay(s, "p0", 1, 2, errors=("UNAVAILABLE",), delivered=False)
    result = s.check()
    assert_only(result, "aborted_reads")
    assert "replays_received" not in result["examples"]["aborted_reads"][0]


# --- silent owners: transactions decided only by the check-back ----------------------------------------


def silent_txn(s, worker, txn, writes, decision, prepared=True):
    """A silent owner's transaction as worker.run_silent_owner records it; returns (key, uids)."""
    key, transactional_id = f"{worker}/{txn}", f"chaos-silent/{worker}-{txn}"
    s.event("begin", worker, txn=txn, instance=txn, intent=decision, transactional_id=transactional_id)
    uids = []
    for idx, (topic, partition, offset) in enumerate(writes):
        uids.append(f"{worker}/{txn}/{idx}")
        s.event("send", worker, txn=txn, idx=idx, uid=uids[-1], topic=topic, partition=partition)
        s.event("ack", worker, txn=txn, idx=idx, uid=uids[-1], topic=topic, partition=partition, offset=offset)
    s.event("decide", worker, txn=txn, key=key, transactional_id=transactional_id, decision=decision)
    if prepared:
        s.event("prepared", worker, txn=txn, producer_id=40 + txn, producer_epoch=0)
        s.event("end", worker, txn=txn, outcome="committed" if decision == "commit" else "aborted", via="check-back")
    else:
        s.event("end", worker, txn=txn, outcome="indefinite" if decision == "commit" else "aborted", error="timed out")
    return key, uids


def checked(s, key, answer, transactional_id=None, checker="chk0"):
    worker, txn = key.rsplit("/", 1)
    s.event("check", checker, transactional_id=transactional_id or f"chaos-silent/{worker}-{txn}", key=key,
            answer=answer, received=s.now, found=answer != "UNKNOWN")


def silent_clean() -> Scenario:
    """clean() plus a silent owner: s0#1 decided commit (checked, visible), s0#2 decided abort (checked, not
    visible), s0#3 decided commit but its prepare raised (never prepared: aborted at its timeout)."""
    s = clean()
    key, uids = silent_txn(s, "s0", 1, [("a", 0, 5), ("b", 0, 1)], "commit")
    checked(s, key, "COMMIT")
    s.appear([("a", 0, 5, uids[0]), ("b", 0, 1, uids[1])])
    key, uids = silent_txn(s, "s0", 2, [("a", 0, 6)], "abort")
    checked(s, key, "ABORT")
    s.appear([("a", 0, 6, uids[0])], committed=False)
    _, uids = silent_txn(s, "s0", 3, [("a", 0, 7)], "commit", prepared=False)
    s.appear([("a", 0, 7, uids[0])], committed=False)
    s.final["prepared_transactions"] = []
    return s


def test_silent_transactions_decided_as_recorded_report_zero_of_every_anomaly():
    s = silent_clean()
    checked(s, "s0/1", "COMMIT")  # asked again after a coordinator failover: the same answer, not an anomaly
    result = s.check()
    assert all(count == 0 for count in result["counts"].values()), result
    numbers = figures(s.events, {"read_committed": s.rc, "read_uncommitted": s.ru})
    assert (numbers["silent_transactions"], numbers["silent_decided_commit"], numbers["silent_prepared"]) == (3, 2, 2)
    assert numbers["silent_committed_visible"] == 1
    assert (numbers["checks"], numbers["checks_by_answer"], numbers["checks_repeated"]) == (3, {"COMMIT": 2, "ABORT": 1}, 1)


def test_a_silent_transaction_decided_commit_and_never_visible_is_a_lost_write():
    s = silent_clean()
    s.rc = [r for r in s.rc if not r[3].startswith("s0/1/")]
    result = s.check()
    assert_only(result, "lost_writes", count=2)
    assert result["examples"]["lost_writes"][0]["transaction"] == "s0#1"


def test_a_silent_transaction_decided_abort_and_visible_is_an_aborted_read():
    s = silent_clean()
    s.rc.append(["a", 0, 6, "s0/2/0"])
    result = s.check()
    assert_only(result, "aborted_reads")
    assert result["examples"]["aborted_reads"][0]["transaction"] == "s0#2"


def test_a_silent_transaction_visible_twice_is_a_duplicate():
    s = silent_clean()
    s.rc.append(["a", 1, 0, "s0/1/0"])
    s.ru.append(["a", 1, 0, "s0/1/0"])
    assert_only(s.check(), "duplicates", count=2)  # in both reads


@pytest.mark.parametrize("answer, transactional_id", [
    ("ABORT", None),  # against the recorded commit
    ("UNKNOWN", None),  # the store lost a decision made before the prepare
    ("COMMIT", "chaos-silent/s0-9"),  # the decision of another transaction
])
def test_a_check_answered_otherwise_than_the_recorded_decision_is_a_mismatch(answer, transactional_id):
    s = silent_clean()
    checked(s, "s0/1", answer, transactional_id)
    result = s.check()
    assert_only(result, "check_answer_mismatches")
    example = result["examples"]["check_answer_mismatches"][0]
    assert example["transaction"] == "s0#1" and example["recorded"]["decision"] == "commit"


def test_a_check_of_a_transaction_no_owner_decided_is_a_check_of_an_unknown_transaction():
    s = silent_clean()
    checked(s, "s7/1", "UNKNOWN")
    result = s.check()
    assert_only(result, "checks_of_unknown_transactions")
    assert result["examples"]["checks_of_unknown_transactions"][0]["check"]["key"] == "s7/1"


def test_a_transaction_still_prepared_at_the_end_is_undecided():
    s = silent_clean()
    s.final["prepared_transactions"] = [{"transactional_id": "chaos-silent/s0-1", "producer_id": 41, "state": "Prepared",
                                         "producer_epoch": 0}]
    assert_only(s.check(), "undecided_prepared_transactions")


def test_a_read_committed_poll_of_a_silent_commit_before_the_checker_answered_is_above_the_lso():
    s = Scenario()
    key, uids = silent_txn(s, "s0", 1, [("a", 0, 0)], "commit")
    s.appear([("a", 0, 0, uids[0])])
    s.poll("rc0", "read_committed", [("a", 0, 0, uids[0])])  # before any COMMIT answer
    checked(s, key, "COMMIT")
    assert_only(s.check(), "read_committed_above_lso")


def test_a_producer_worker_is_told_only_its_own_topics(tmp_path):
    """Found writing the silent owner: the shared arguments came after a worker's own, so the shared
    --topics (every topic) won and producer workers wrote into the ctp output topic too."""
    from services.tooling.chaos import worker
    from services.tooling.chaos.run import CTP_OUTPUT, Workers

    workers = Workers(tmp_path, "127.0.0.1:1", seed=7, cut_probability=0.0)
    command = workers.command("p0", ["producer", "--topics", "chaos-a:3,chaos-b:2"])
    parsed = worker.parse_args(command[command.index("services.tooling.chaos.worker") + 1:])
    assert parsed.kind == "producer" and parsed.topics == "chaos-a:3,chaos-b:2" and CTP_OUTPUT not in parsed.topics
    assert parsed.name == "p0" and parsed.seed == 700


def test_every_worker_gets_the_workloads_tls_files(tmp_path):
    """Against a cluster that requires client certificates (the chart's
    default) each worker must dial with them, or it is refused at the handshake."""
    from services.tooling.chaos import security, worker
    from services.tooling.chaos.run import Workers

    tls = {}
    for option, file in (("tls_ca", "ca.crt"), ("tls_cert", "tls.crt"), ("tls_key", "tls.key")):
        (tmp_path / file).write_text("PEM")  # only their paths travel here; the handshake reads them
        tls[option] = str(tmp_path / file)
    workers = Workers(tmp_path, "127.0.0.1:1", seed=7, cut_probability=0.0, tls=tls)
    for name, spec in (("p0", ["producer", "--topics", "chaos-a:3"]), ("rc0", ["poller", "--isolation", "read_committed"])):
        command = workers.command(name, spec)
        parsed = worker.parse_args(command[command.index("services.tooling.chaos.worker") + 1:])
        assert security.options(parsed) == tls
        assert worker.Worker(parsed).tls_files() is not None
    plain = Workers(tmp_path, "127.0.0.1:1", seed=7, cut_probability=0.0).command("p0", ["producer", "--topics", "chaos-a:3"])
    assert security.options(worker.parse_args(plain[plain.index("services.tooling.chaos.worker") + 1:])) == {}
