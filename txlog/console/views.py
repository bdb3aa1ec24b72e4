"""What each console page shows, from the Admin client's answers: plain
dicts and lists the templates render, no HTML here and no I/O beyond the
Admin calls. Each function takes an Admin (or anything with its methods)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable

from txlog.protocol import CONSUMER_OFFSETS_TOPIC
from txlog.protocol.errors import TxlogError
from txlog.structs import TopicPartition

OPEN_STATES = ("Ongoing", "Prepared", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")
# A Prepared transaction waiting longer than this is marked on the transactions page (its check-back may be stuck).
LONG_PREPARED_MS = 60_000
# An open transaction older than this that no coordinator will end is hanging: the coordinators' largest timeout
# (transaction_timeout_ms_max), as Kafka's find-hanging assumes.
HANGING_AFTER_MS = 900_000
DESCRIBED_PER_CALL = 1000


SECONDARY_TIMEOUT_S = 5.0  # a page's secondary asks (hanging transactions, producer states) wait this long at most
NOT_FOUND = {"UNKNOWN_TOPIC_OR_PARTITION", "TRANSACTIONAL_ID_NOT_FOUND"}


class NotFound(Exception):
    """What a page is about does not exist (the app answers 404 with ``code``)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def looked_up(ask):
    """``ask()``'s answer; a not-found answer of the cluster as NotFound."""
    try:
        return ask()
    except TxlogError as exc:
        if getattr(exc, "name", "") in NOT_FOUND:
            raise NotFound(exc.name, str(exc)) from None
        raise


def partly(ask, default):
    """``ask()``'s answer, or ``(default, the error)`` when the cluster could not answer it in time: a page shows
    what it has (a partition without a leader makes the hanging-transaction scan fail, for one) and says what not."""
    try:
        return ask(), ""
    except TxlogError as exc:
        return default, str(exc)


def now_ms() -> int:
    return int(time.time() * 1000)


def age_ms(since_ms: int, now: int) -> int | None:
    return now - since_ms if since_ms >= 0 else None


def offline(p) -> bool:
    """No live leader: none elected, or the one ZooKeeper names is down (until the controller elects another)."""
    return p.leader_id < 0 or p.error == "LEADER_NOT_AVAILABLE"


def partition_rows(admin, topics) -> list[dict]:
    """One row per partition of ``topics`` (TopicDescriptions): its replicas and offsets; the last stable
    offset's lag is how many offsets an open transaction holds back from read_committed consumers."""
    tps = [TopicPartition(t.name, p.partition) for t in topics for p in t.partitions if not offline(p)]

    def offsets(spec):
        return partly(lambda: admin.list_offsets({tp: spec for tp in tps}, timeout_s=SECONDARY_TIMEOUT_S) if tps else {},
                      {})[0]

    latest, stable, earliest = offsets("latest"), offsets("last_stable"), offsets("earliest")
    rows = []
    for topic in topics:
        for p in topic.partitions:
            tp = TopicPartition(topic.name, p.partition)
            high = latest[tp].offset if tp in latest else None
            lso = stable[tp].offset if tp in stable else None
            rows.append({
                "topic": topic.name, "partition": p.partition, "leader": p.leader_id, "leader_epoch": p.leader_epoch,
                "replicas": list(p.replicas), "isr": list(p.isr), "error": p.error,
                "offline": offline(p), "under_replicated": len(p.isr) < len(p.replicas),
                "log_start": earliest[tp].offset if tp in earliest else None,
                "high_watermark": high, "last_stable": lso,
                "lso_lag": high - lso if high is not None and lso is not None else None,
            })
    return rows


ROLES_OF_KIND = {"coordinator_svc": "transaction coordinator", "producer_id_svc": "producer id blocks"}


def led(partitions) -> tuple[Counter, Counter]:
    """How many partitions each live leader leads, and how many of them are __consumer_offsets partitions
    (whose leaders are the group coordinators)."""
    leads = Counter(p.leader_id for _, p in partitions if not offline(p))
    groups = Counter(p.leader_id for t, p in partitions if not offline(p) and t.name == CONSUMER_OFFSETS_TOPIC)
    return leads, groups


def instance_rows(cluster, partitions, leads: Counter, groups: Counter) -> list[dict]:
    """Every instance of every service with its roles: the controller, what a
    partition_svc leads (group coordination is leading __consumer_offsets
    partitions), and a partition_svc that replicas name but that is not live."""
    rows = []
    for i in cluster.instances:
        roles = [ROLES_OF_KIND[i.kind]] if i.kind in ROLES_OF_KIND else []
        if i.kind == "partition_svc":
            roles = (["controller"] if i.node_id == cluster.controller_id else []) + [f"leads {leads[i.node_id]}"]
            if groups[i.node_id]:
                roles.append(f"group coordinator ({groups[i.node_id]} of {CONSUMER_OFFSETS_TOPIC})")
        rows.append({**i._asdict(), "live": True, "roles": roles})
    registered = {i.node_id for i in cluster.instances if i.kind == "partition_svc"}
    # down: named by replicas, not registered (the registrations are the one source: Metadata's live list is cached)
    for n in sorted({r for _, p in partitions for r in p.replicas} - registered):
        rows.append({"kind": "partition_svc", "node_id": n, "address": "", "version": "", "rack": "", "metrics_address": "",
                     "live": False, "roles": []})
    return rows


def overview(admin, hanging_after_ms: int = HANGING_AFTER_MS) -> dict:
    """The cluster at a glance: live instances, partitions not fully served, open and hanging transactions
    (open longer than ``hanging_after_ms`` with no coordinator to end them: Admin.find_hanging)."""
    topics = admin.describe_topics()
    partitions = [(t, p) for t in topics for p in t.partitions]
    transactions = admin.list_transactions(states=OPEN_STATES)
    hanging, hanging_error = partly(lambda: admin.find_hanging(max_transaction_timeout_ms=hanging_after_ms,
                                                               timeout_s=SECONDARY_TIMEOUT_S), [])
    leads, groups = led(partitions)
    cluster, cluster_error = partly(lambda: admin.describe_cluster(timeout_s=SECONDARY_TIMEOUT_S), None)
    nodes = []
    if cluster is None:  # what Metadata alone says, without the cluster's description
        live = set(admin.live_partition_nodes())
        nodes = [{"id": n, "live": n in live, "leads": leads[n]} for n in sorted(live | {r for _, p in partitions for r in p.replicas})]
    return {
        "nodes": nodes,
        "instances": instance_rows(cluster, partitions, leads, groups) if cluster else [],
        "controller_id": cluster.controller_id if cluster else None,
        "controller_epoch": cluster.controller_epoch if cluster else None,
        "cluster_error": cluster_error,
        "topics": len(topics),
        "internal_topics": len([t for t in topics if t.is_internal]),
        "partitions": len(partitions),
        "offline": [f"{t.name}-{p.partition}" for t, p in partitions if offline(p)],
        "under_replicated": [f"{t.name}-{p.partition}" for t, p in partitions if not offline(p) and len(p.isr) < len(p.replicas)],
        "open_transactions": len(transactions),
        "prepared": len([t for t in transactions if t.state == "Prepared"]),
        "hanging": [h._asdict() for h in hanging],
        "hanging_error": hanging_error,
    }


def topic_list(admin) -> list[dict]:
    rows = []
    for topic in sorted(admin.describe_topics(), key=lambda t: (t.is_internal, t.name)):
        rows.append({"name": topic.name, "internal": topic.is_internal, "partitions": len(topic.partitions),
                     "replication_factor": max((len(p.replicas) for p in topic.partitions), default=0),
                     "under_replicated": sum(1 for p in topic.partitions if len(p.isr) < len(p.replicas)),
                     "offline": sum(1 for p in topic.partitions if offline(p))})
    return rows


def topic_detail(admin, name: str) -> dict:
    """A topic's partitions and configs; UNKNOWN_TOPIC_OR_PARTITION (raised by the Admin) when there is none."""
    (topic,) = looked_up(lambda: admin.describe_topics([name]))
    return {"name": topic.name, "internal": topic.is_internal, "configs": dict(sorted(topic.configs.items())),
            "partitions": partition_rows(admin, [topic])}


def transaction_list(admin, states: Iterable[str] = (), hanging_after_ms: int = HANGING_AFTER_MS) -> dict:
    """The coordinators' transactions (``states``: only those), described, ages from now; hanging and
    long-prepared ones marked."""
    listings = admin.list_transactions(states=list(states) or None)
    hanging, hanging_error = partly(lambda: admin.find_hanging(max_transaction_timeout_ms=hanging_after_ms,
                                                               timeout_s=SECONDARY_TIMEOUT_S), [])
    hanging_ids = {h.producer_id for h in hanging}
    described = {}
    ids = [t.transactional_id for t in listings]
    for start in range(0, len(ids), DESCRIBED_PER_CALL):
        chunk = ids[start:start + DESCRIBED_PER_CALL]
        try:
            described.update({d.transactional_id: d for d in admin.describe_transactions(chunk)})
        except TxlogError:  # one of them expired since it was listed: the others one by one
            for transactional_id in chunk:
                found, _ = partly(lambda t=transactional_id: admin.describe_transactions([t]), [])
                described.update({d.transactional_id: d for d in found})
    now = now_ms()
    rows = []
    for listing in listings:
        d = described.get(listing.transactional_id)
        prepared_age = age_ms(d.prepared_time_ms, now) if d is not None else None
        rows.append({
            "transactional_id": listing.transactional_id, "state": listing.state, "producer_id": listing.producer_id,
            "producer_epoch": listing.producer_epoch,
            "age_ms": age_ms(d.transaction_start_time_ms, now) if d is not None else None,
            "partitions": len(d.partitions) if d is not None else 0,
            "timeout_ms": d.transaction_timeout_ms if d is not None else None,
            "hanging": listing.producer_id in hanging_ids,
            "long_prepared": listing.state == "Prepared" and prepared_age is not None and prepared_age > LONG_PREPARED_MS,
            "checks_done": d.checks_done if d is not None else 0,
            "last_check_answer": d.last_check_answer if d is not None else "",
        })
    return {"rows": rows, "states": list(states), "hanging_error": hanging_error}


def transaction_detail(admin, transactional_id: str) -> dict:
    """One transactional id: its state and, on each of its partitions, what the leader knows of its producer."""
    (d,) = looked_up(lambda: admin.describe_transactions([transactional_id]))
    now = now_ms()
    producers, producers_error = partly(
        lambda: admin.describe_producers(d.partitions, timeout_s=SECONDARY_TIMEOUT_S) if d.partitions else {}, {})
    partitions = []
    for tp in d.partitions:
        mine = [p for p in producers.get(tp, []) if p.producer_id == d.producer_id]
        partitions.append({"topic": tp.topic, "partition": tp.partition,
                           "producer": mine[0]._asdict() if mine else None})
    return {
        "transactional_id": d.transactional_id, "state": d.state, "producer_id": d.producer_id,
        "producer_epoch": d.producer_epoch, "timeout_ms": d.transaction_timeout_ms,
        "age_ms": age_ms(d.transaction_start_time_ms, now), "partitions": partitions,
        "prepared_age_ms": age_ms(d.prepared_time_ms, now), "prepared_timeout_ms": d.prepared_timeout_ms,
        "checks_done": d.checks_done, "last_check_answer": d.last_check_answer,
        "next_check_in_ms": d.next_check_time_ms - now if d.next_check_time_ms >= 0 else None,
        "handle": (d.transactional_id, d.producer_id, d.producer_epoch) if d.state == "Prepared" else None,
        "producers_error": producers_error,
    }


def group_list(admin) -> list[dict]:
    """Each consumer group: its members and, per partition it committed, the committed offset and the lag."""
    groups = []
    for listing in sorted(admin.list_groups()):
        described = admin.describe_group(listing.group_id)
        committed = admin.list_group_offsets(listing.group_id)
        # the lag as `txlog groups describe` gives it: up to the last stable offset, what read_committed can read
        ends, _ = partly(lambda c=committed: admin.list_offsets({tp: "last_stable" for tp in c},
                                                                timeout_s=SECONDARY_TIMEOUT_S) if c else {}, {})
        offsets = []
        for tp in sorted(committed):
            offset = committed[tp]
            offset = getattr(offset, "offset", offset)
            end = ends[tp].offset if tp in ends else None
            offsets.append({"topic": tp.topic, "partition": tp.partition, "committed": offset, "end": end,
                            "lag": end - offset if end is not None and offset is not None and offset >= 0 else None,
                            "owner": described.owner(tp)})
        groups.append({"group_id": listing.group_id, "state": described.state, "epoch": described.group_epoch,
                       "members": [{"member_id": m.member_id, "state": m.state,
                                    "assigned": sorted(f"{tp.topic}-{tp.partition}" for tp in m.assigned)}
                                   for m in described.members],
                       "offsets": offsets})
    return groups


def security(admin) -> dict:
    """The ACL bindings and the client quotas, as the cluster keeps them. Either may be refused to the
    console's principal (no Describe on the Cluster): then that part says so with the cluster's code."""
    shown: dict = {}
    for part, ask in (("acls", lambda: sorted((vars(b) for b in admin.describe_acls()), key=lambda b: sorted(b.items()))),
                      ("quotas", admin.describe_client_quotas)):
        try:
            shown[part] = ask()
        except TxlogError as exc:
            disabled = getattr(exc, "name", "") == "SECURITY_DISABLED"  # no authorizer: no ACL, every call let through
            shown[part] = [] if disabled else None
            shown[f"{part}_disabled" if disabled else f"{part}_error"] = str(exc)
    return shown
