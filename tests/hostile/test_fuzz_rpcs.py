"""Hostile input: every RPC of ProducerIdService, CoordinatorService and
PartitionService fuzzed with malformed and extreme requests against one real
cluster, and the names of topics, transactional ids and groups checked.

Guarantees checked
------------------
- Every answer is OK or a gRPC status that errors.proto maps one of our codes
  to, never UNKNOWN or INTERNAL, carrying our ErrorInfo (a known code, its own
  gRPC status, a message); per-item ``Error``s in answers hold known codes with
  a message. A request that does not parse (invalid UTF-8, garbage, groups
  nested past the parser's limit) answers INVALID_REQUEST.
- Long polls are bounded: the cluster cuts Fetch waits at FETCH_WAIT_MS_MAX,
  so no call, whatever ``max_wait_ms`` it asks for, reaches the client deadline.
- After each RPC's fuzzing every service process is alive and SERVING, and the
  baseline stored before any fuzzing reads back unchanged: its topic, both
  partitions read fully read_uncommitted and read_committed (it holds an aborted
  and a committed transaction), offsets, producers, its committed group offsets,
  its transactional id, and the topic list (which may only have grown by topics
  a CreateTopics answered NONE for).

How requests are aimed
----------------------
Every field gets generic hostile values (proto_strategies); the fields that
name things draw from pools: the baseline's names only for read-only RPCs, a
scratch topic and group that mutating RPCs may change, fresh valid names that
do not exist, and hostile strings. Mutating RPCs may name the baseline's
transactional id, but only with a wrong producer id or epoch
(:meth:`Hostile.off_limits` says exactly which requests could legitimately
change the baseline; they are not sent). Hypothesis runs derandomized: the same
requests every run.

Secured
-------
Everything runs twice: on a plaintext cluster, and on one with mutual TLS and
the ACL authorizer (what ``txlog cluster up --tls`` starts), where the
baseline is stored and read back as the super user but the fuzzing runs as
``User:fuzzer``, whom ACLs allow everything on the scratch names and the
fresh ``fz-`` ones, only reading and describing on the baseline's, with a
Deny among them. There every answer must still be one of ours, the refusals
*_AUTHORIZATION_FAILED, and the baseline unchanged.

Known bugs
----------
:data:`KNOWN_BUGS` are server bugs this suite found and that are not fixed yet:
the requests that trigger them are not sent (each entry says which), so the
suite stays green and each entry is removed with its fix.
"""

from __future__ import annotations

import collections
import functools
import importlib
import os
import pkgutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from proto_strategies import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    NAME_CHARS,
    MessageStrategies,
    RawPayload,
    assign,
    edge_integers,
    hostile_text,
    message_class,
    mostly,
    raw_payloads,
    weighted,
)

from services.security import certs
from services.tooling.cluster import LocalCluster
from txlog import v1 as stubs_v1
from txlog.protocol import acls, batch_format, compression, errors
from txlog.protocol.acls import (
    ALLOW,
    CLUSTER,
    CLUSTER_NAME,
    DENY,
    GROUP,
    LITERAL,
    PREFIXED,
    TOPIC,
    TRANSACTIONAL_ID,
    AclBinding,
)
from txlog.protocol.errors import ERROR_TABLE, ErrorCode
from txlog.two_phase import wait_until
from txlog.v1 import common_pb2, coordinator_pb2, errors_pb2, partition_pb2, partition_pb2_grpc

EXAMPLES_PER_RPC = int(os.environ.get("TXLOG_HOSTILE_EXAMPLES_PER_RPC", "200"))  # more for a deeper local run
SECURED_EXAMPLES_PER_RPC = max(EXAMPLES_PER_RPC // 4, 10)
FUZZER = "fuzzer"  # the principal the secured run fuzzes as
CALL_TIMEOUT_S = 30.0
FETCH_WAIT_MS_MAX = 100  # the cluster's --fetch-wait-ms-max: every long poll is cut to this
RETRY_WAIT_S = 30.0
ACCEPTED_SHOWN = 20
RECENT_TIMESTAMP_MS = 1_750_000_000_000  # a fixed one: the same requests every run
INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]

NONE = ErrorCode.Value("NONE")
UNKNOWN_SERVER_ERROR = ErrorCode.Value("UNKNOWN_SERVER_ERROR")
INVALID_REQUEST = ErrorCode.Value("INVALID_REQUEST")
# The gRPC codes our error table answers with (UNKNOWN_SERVER_ERROR's INTERNAL is a server bug here).
ALLOWED_STATUS = {spec.grpc_status for spec in ERROR_TABLE.values() if spec.code not in (NONE, UNKNOWN_SERVER_ERROR)}


# --- the RPCs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One RPC as one kind of service process serves it."""

    service: ServiceDescriptor
    method: MethodDescriptor
    kind: str  # the service process kind that answers it

    @property
    def path(self) -> str:
        return f"/{self.service.full_name}/{self.method.name}"

    @property
    def name(self) -> str:
        return self.method.name

    def __str__(self) -> str:
        return f"{self.service.name}.{self.method.name}@{self.kind}"


def proto_services() -> list[ServiceDescriptor]:
    """Every service the generated stubs of protos/txlog/v1 define."""
    found = []
    for info in pkgutil.iter_modules(stubs_v1.__path__):
        if info.name.endswith("_pb2"):
            module = importlib.import_module(f"{stubs_v1.__name__}.{info.name}")
            found.extend(module.DESCRIPTOR.services_by_name.values())
    return sorted(found, key=lambda s: s.full_name)


# The process kind serving each service; every RPC of a service listed here is fuzzed.
SERVED_BY = {"ProducerIdService": "producer_id_svc", "CoordinatorService": "coordinator_svc", "PartitionService": "partition_svc",
             "ReplicationService": "partition_svc"}
# partition_svc answers InitProducerId for idempotent producers and FindCoordinator
# too (its transactional CoordinatorService methods answer NOT_COORDINATOR, by design).
# Services applications serve and txlog only calls (no txlog process answers them): TransactionCheckService
# (check-back) is called by the coordinators; the SDK's server of it is tested in tests/unit/test_transaction_checker.py.
SERVED_BY_APPLICATIONS = ("TransactionCheckService",)
ALSO_SERVED = (("CoordinatorService", "InitProducerId", "partition_svc"), ("CoordinatorService", "FindCoordinator", "partition_svc"))
SERVICES = {s.name: s for s in proto_services() if s.name in SERVED_BY}
TARGETS = [Target(service, method, SERVED_BY[name]) for name, service in SERVICES.items() for method in service.methods] + [
    Target(SERVICES[name], SERVICES[name].methods_by_name[method], kind) for name, method, kind in ALSO_SERVED
]
# RPCs that change nothing the baseline holds; every other RPC (a new one too) is
# treated as mutating: it never names the baseline's topic or group.
READ_ONLY = {
    "AllocateProducerIds", "Metadata", "Fetch", "FetchStream", "ListOffsets", "OffsetFetch", "DescribeProducers",
    "FindCoordinator", "ListTransactions", "DescribeTransactions",
}


def walk_strings(message: Message, names: set[str] | None = None, depth_max: int = 8) -> Iterator[tuple[str, str]]:
    """(field name, value) of every string in the message as the server reads
    it: defaults included ("" for an unset string, an unset message's fields),
    nested and repeated ones too; only the fields named in ``names`` when given."""
    if depth_max == 0:
        return
    for fd in message.DESCRIPTOR.fields:
        value = getattr(message, fd.name)
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            if fd.message_type.GetOptions().map_entry:
                for key, item in value.items():
                    for part in (key, item):
                        if isinstance(part, str) and (names is None or fd.name in names):
                            yield fd.name, part
                continue
            for item in value if fd.is_repeated else [value]:
                yield from walk_strings(item, names, depth_max - 1)
        elif fd.type == FieldDescriptor.TYPE_STRING and (names is None or fd.name in names):
            yield from ((fd.name, v) for v in (value if fd.is_repeated else [value]))


def walk_errors(message: Message) -> Iterator[errors_pb2.Error]:
    """Every txlog.v1.Error in an answer."""
    for fd, value in message.ListFields():
        if fd.type != FieldDescriptor.TYPE_MESSAGE or fd.message_type.GetOptions().map_entry:
            continue
        for item in value if fd.is_repeated else [value]:
            if fd.message_type.full_name == errors_pb2.Error.DESCRIPTOR.full_name:
                yield item
            else:
                yield from walk_errors(item)


# --- known bugs -------------------------------------------------------------------------


@dataclass(frozen=True)
class KnownBug:
    """A server bug found by this suite and not fixed yet; ``triggered_by``
    (RPC name, request) says which requests are left out because of it."""

    summary: str
    triggered_by: Callable[[str, Message], bool]


KNOWN_BUGS: dict = {}  # every bug this suite found so far is fixed; its cases are sent again


def known_bugs_hit(rpc: str, request: Message) -> list[str]:
    return [name for name, bug in KNOWN_BUGS.items() if bug.triggered_by(rpc, request)]


# --- the cluster, its baseline and the checks ---------------------------------------------


@dataclass(frozen=True)
class Baseline:
    topic: str = "hostile-baseline"
    partitions: int = 2
    group: str = "hostile-baseline-group"
    transactional_id: str = "hostile-baseline-txn"
    scratch_topic: str = "hostile-scratch"
    # the compressed-batches checks aim here, at a topic no fuzzed request names: on the plaintext
    # cluster a fuzzed LeaderAndIsr may legitimately tell an instance that another leads the scratch topic
    compressed_topic: str = "hostile-compressed"
    scratch_group: str = "hostile-scratch-group"
    scratch_transactional_id: str = "hostile-scratch-txn"
    producer_id: int = -1  # the transactional producer's, after its last commit
    producer_epoch: int = -1
    idempotent_producer_id: int = -1


def retrying(call: Callable[[], Message]) -> Message:
    """``call()`` again while it fails with a retriable error (a coordinator or
    leader moving, a partition loading), as a status or as a per-item error that
    ``errors.check`` raised."""
    deadline = time.monotonic() + RETRY_WAIT_S
    while True:
        try:
            return call()
        except (grpc.RpcError, errors.TxlogError) as exc:
            error = errors.from_rpc_error(exc) if isinstance(exc, grpc.RpcError) else exc
            if not error.retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@dataclass
class Hostile:
    """The cluster under fire: channels, the baseline and what the fuzzing changed."""

    cluster: LocalCluster
    baseline: Baseline = field(default_factory=Baseline)
    created_topics: set[str] = field(default_factory=set)
    # the last mutating requests answered OK, shown when the baseline changed
    accepted: collections.deque = field(default_factory=lambda: collections.deque(maxlen=ACCEPTED_SHOWN))
    # per target: the answers (OK or the error's name) and the kinds of request sent
    outcomes: dict[str, collections.Counter] = field(default_factory=lambda: collections.defaultdict(collections.Counter))
    kinds: dict[str, collections.Counter] = field(default_factory=lambda: collections.defaultdict(collections.Counter))
    _channels: dict[tuple[str, bool], grpc.Channel] = field(default_factory=dict)

    @property
    def secured(self) -> bool:
        return bool(self.cluster.state.tls)

    def addresses(self, kind: str) -> list[str]:
        return [p.address for p in self.cluster.state.services.values() if p.kind == kind]

    def channel(self, address: str, *, as_fuzzer: bool = False) -> grpc.Channel:
        """A channel as the super user (secured) or plaintext; ``as_fuzzer``: as User:fuzzer."""
        key = (address, as_fuzzer and self.secured)
        if key not in self._channels:
            if not self.secured:
                self._channels[key] = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
            else:
                tls = self.cluster.state.tls
                name = FUZZER if key[1] else "admin"
                read = lambda path: Path(path).read_bytes()  # noqa: E731
                credentials = grpc.ssl_channel_credentials(read(tls["ca"]), read(Path(tls["dir"]) / f"{name}-key.pem"),
                                                           read(Path(tls["dir"]) / f"{name}.pem"))
                self._channels[key] = grpc.secure_channel(address, credentials, options=CHANNEL_OPTIONS)
        return self._channels[key]

    def call(self, address: str, service: str, method: str, request: Message, response_class: type[Message]) -> Message:
        rpc = self.channel(address).unary_unary(
            f"/txlog.v1.{service}/{method}", request_serializer=lambda m: m.SerializeToString(), response_deserializer=response_class.FromString
        )
        return rpc(request, timeout=CALL_TIMEOUT_S)

    def partition(self, method: str, request: Message, address: str | None = None) -> Message:
        descriptor = partition_pb2.DESCRIPTOR.services_by_name["PartitionService"].methods_by_name[method]
        address = address or self.addresses("partition_svc")[0]
        return self.call(address, "PartitionService", method, request, message_class(descriptor.output_type))

    def coordinator(self, method: str, request: Message, address: str) -> Message:
        descriptor = coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].methods_by_name[method]
        return self.call(address, "CoordinatorService", method, request, message_class(descriptor.output_type))

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()

    # --- lookups -----------------------------------------------------------------------

    def leader(self, topic: str, index: int) -> str:
        reply = self.partition("Metadata", partition_pb2.MetadataRequest(topics=[topic]))
        return {p.partition: p.leader_address for p in reply.topics[0].partitions}[index]

    def transaction_coordinator(self, transactional_id: str) -> str:
        def find() -> str:
            reply = self.partition("Metadata", partition_pb2.MetadataRequest(transactional_ids=[transactional_id]))
            errors.check(reply.transaction_coordinators[0].error)
            return reply.transaction_coordinators[0].address

        return retrying(find)

    def group_coordinator(self, group_id: str) -> str:
        reply = self.partition("Metadata", partition_pb2.MetadataRequest(group_ids=[group_id]))
        errors.check(reply.group_coordinators[0].error)
        return reply.group_coordinators[0].address

    def describe_transaction(self, transactional_id: str) -> coordinator_pb2.TransactionDescription:
        def describe() -> coordinator_pb2.TransactionDescription:
            reply = self.coordinator(
                "DescribeTransactions",
                coordinator_pb2.DescribeTransactionsRequest(transactional_ids=[transactional_id]),
                self.transaction_coordinator(transactional_id),
            )
            errors.check(reply.transactions[0].error)
            return reply.transactions[0]

        return retrying(describe)

    # --- the baseline ------------------------------------------------------------------

    def produce(self, topic: str, index: int, batch: common_pb2.RecordBatch, transactional_id: str = "") -> None:
        def send() -> None:
            reply = self.partition("Produce", partition_pb2.ProduceRequest(
                acks=-1, transactional_id=transactional_id,
                batches=[partition_pb2.PartitionBatch(topic=topic, partition=index, leader_epoch=-1, batch=batch)],
            ), self.leader(topic, index))
            errors.check(reply.results[0].error)

        retrying(send)

    def store_baseline(self) -> None:
        """A topic with plain, idempotent, aborted and committed transactional
        batches; a committed group offset; a scratch topic, group and id."""
        b = self.baseline
        reply = self.partition("CreateTopics", partition_pb2.CreateTopicsRequest(topics=[
            partition_pb2.CreatableTopic(name=b.topic, partition_count=b.partitions, configs={"retention.ms": "604800000"}),
            partition_pb2.CreatableTopic(name=b.scratch_topic, partition_count=2),
            partition_pb2.CreatableTopic(name=b.compressed_topic, partition_count=1),
        ]))
        assert [r.error.code for r in reply.results] == [NONE, NONE, NONE], reply
        for index in range(b.partitions):
            self.produce(b.topic, index, records_batch(-1, -1, -1, [f"plain-{index}-{i}" for i in range(3)]))
        idempotent = self.coordinator(  # partition_svc answers InitProducerId for idempotent producers
            "InitProducerId", coordinator_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1), self.addresses("partition_svc")[0])
        self.produce(b.topic, 0, records_batch(idempotent.producer_id, 0, 0, ["idempotent-0", "idempotent-1"]))

        tid = b.transactional_id

        def at_coordinator(method: str, request: Message) -> Message:
            return retrying(lambda: self.coordinator(method, request, self.transaction_coordinator(tid)))

        init = at_coordinator("InitProducerId", coordinator_pb2.InitProducerIdRequest(
            transactional_id=tid, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1))
        producer_id, epoch = init.producer_id, init.producer_epoch
        for committed in (False, True):  # an aborted transaction, then a committed one, over both partitions
            added = at_coordinator("AddPartitionsToTxn", coordinator_pb2.AddPartitionsToTxnRequest(
                transactional_id=tid, producer_id=producer_id, producer_epoch=epoch,
                partitions=[common_pb2.TopicPartition(topic=b.topic, partition=p) for p in range(b.partitions)]))
            assert all(r.error.code == NONE for r in added.results), added
            for index in range(b.partitions):
                word = "committed" if committed else "aborted"
                batch = records_batch(producer_id, epoch, 0, [f"{word}-{index}-{i}" for i in range(2)], is_transactional=True)
                self.produce(b.topic, index, batch, transactional_id=tid)
            ended = at_coordinator("EndTxn", coordinator_pb2.EndTxnRequest(
                transactional_id=tid, producer_id=producer_id, producer_epoch=epoch, committed=committed))
            producer_id, epoch = ended.producer_id, ended.producer_epoch
        for index in range(b.partitions):
            self.produce(b.topic, index, records_batch(-1, -1, -1, [f"after-{index}"]))
        deadline = time.monotonic() + RETRY_WAIT_S
        while self.describe_transaction(tid).state != coordinator_pb2.TRANSACTION_STATE_COMPLETE_COMMIT:
            assert time.monotonic() < deadline, "the baseline transaction did not complete"
            time.sleep(0.1)

        group_offsets = [partition_pb2.PartitionOffset(topic=b.topic, partition=p, offset=2 + p, metadata=f"baseline-{p}") for p in range(b.partitions)]
        committed_offsets = retrying(lambda: self.partition(
            "OffsetCommit", partition_pb2.OffsetCommitRequest(group_id=b.group, offsets=group_offsets), self.group_coordinator(b.group)))
        assert all(r.error.code == NONE for r in committed_offsets.results), committed_offsets
        retrying(lambda: self.coordinator("InitProducerId", coordinator_pb2.InitProducerIdRequest(
            transactional_id=b.scratch_transactional_id, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1),
            self.transaction_coordinator(b.scratch_transactional_id)))
        self.baseline = Baseline(producer_id=producer_id, producer_epoch=epoch, idempotent_producer_id=idempotent.producer_id)

    # --- reading everything back --------------------------------------------------------

    def read_partition(self, topic: str, index: int, isolation: int) -> list[bytes]:
        """Every batch of the partition from offset 0, serialized."""
        batches, offset = [], 0
        leader = self.leader(topic, index)
        while True:
            result = self.partition("Fetch", partition_pb2.FetchRequest(
                isolation_level=isolation, max_wait_ms=0,
                partitions=[partition_pb2.FetchPartition(topic=topic, partition=index, fetch_offset=offset, leader_epoch=-1)],
            ), leader).results[0]
            assert result.error.code == NONE, result.error
            batches.extend(batch.SerializeToString(deterministic=True) for batch in result.batches)
            upper = result.last_stable_offset if isolation == common_pb2.ISOLATION_LEVEL_READ_COMMITTED else result.high_watermark
            if result.next_fetch_offset >= upper or result.next_fetch_offset == offset:
                return batches
            offset = result.next_fetch_offset

    def snapshot(self) -> dict:
        """What the baseline is, as comparable values."""
        b = self.baseline
        topics = self.partition("Metadata", partition_pb2.MetadataRequest(all_topics=True)).topics
        described = {t.name: t for t in topics}
        state = {
            "topic_names": sorted(described),
            "topic": placement(described[b.topic]),
        }
        for index in range(b.partitions):
            leader = self.leader(b.topic, index)
            state[f"read_uncommitted-{index}"] = self.read_partition(b.topic, index, common_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED)
            state[f"read_committed-{index}"] = self.read_partition(b.topic, index, common_pb2.ISOLATION_LEVEL_READ_COMMITTED)
            offsets = self.partition("ListOffsets", partition_pb2.ListOffsetsRequest(partitions=[
                partition_pb2.ListOffsetsPartition(topic=b.topic, partition=index, spec=spec)
                for spec in (partition_pb2.OFFSET_SPEC_EARLIEST, partition_pb2.OFFSET_SPEC_LATEST, partition_pb2.OFFSET_SPEC_LAST_STABLE)
            ]), leader)
            state[f"offsets-{index}"] = [(r.error.code, r.offset) for r in offsets.results]
            producers = self.partition("DescribeProducers", partition_pb2.DescribeProducersRequest(
                partitions=[common_pb2.TopicPartition(topic=b.topic, partition=index)]), leader)
            state[f"producers-{index}"] = producers.SerializeToString(deterministic=True)
        coordinator = self.group_coordinator(b.group)
        for name, wanted in (("group_offsets", [common_pb2.TopicPartition(topic=b.topic, partition=p) for p in range(b.partitions)]), ("group_all", [])):
            reply = self.partition("OffsetFetch", partition_pb2.OffsetFetchRequest(group_id=b.group, partitions=wanted), coordinator)
            state[name] = sorted((o.topic, o.partition, o.error.code, o.offset, o.metadata) for o in reply.offsets)
        state["transaction"] = self.describe_transaction(b.transactional_id).SerializeToString(deterministic=True)
        return state

    def wait_for_fuzzer_grants(self) -> None:
        """Until every partition_svc lets the fuzzer describe the scratch topic (the ACLs reached every cache)."""
        for address in self.addresses("partition_svc"):
            def allowed(address=address) -> bool:
                reply = partition_pb2_grpc.PartitionServiceStub(self.channel(address, as_fuzzer=True)).Metadata(
                    partition_pb2.MetadataRequest(topics=[self.baseline.scratch_topic]), timeout=CALL_TIMEOUT_S)
                return reply.topics[0].error.code == NONE
            wait_until(allowed, RETRY_WAIT_S, f"the fuzzer's ACLs reaching {address}")

    def wait_until_in_sync(self) -> None:
        """Until every replica of the baseline's topic is in its ISR again: on a
        loaded machine a follower falls behind and drops out for a while (what
        the snapshot compares is where the topic's replicas are, not who leads)."""
        def in_sync() -> bool:
            (topic,) = self.partition("Metadata", partition_pb2.MetadataRequest(topics=[self.baseline.topic])).topics
            return all(sorted(p.isr) == sorted(p.replicas) for p in topic.partitions)

        wait_until(in_sync, RETRY_WAIT_S, f"every replica of {self.baseline.topic} back in its ISR")

    def assert_alive_and_serving(self) -> None:
        for name, status in self.cluster.status().items():
            assert status["alive"], f"{name} died; see {self.cluster.state.services[name].log}"
            if status["kind"] == "zookeeper":
                continue
            reply = health_pb2_grpc.HealthStub(self.channel(status["address"])).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, f"{name} is {reply.status}"

    def assert_baseline_unchanged(self, before: dict) -> None:
        self.wait_until_in_sync()
        after = self.snapshot()
        accepted = "\n".join(f"{target}: {call}" for target, call in self.accepted)
        new_topics = set(after["topic_names"]) - set(before["topic_names"])
        assert set(before["topic_names"]) <= set(after["topic_names"]), "a topic disappeared"
        assert new_topics <= self.created_topics, f"topics appeared that no CreateTopics answered NONE for: {sorted(new_topics - self.created_topics)}"
        assert self.created_topics <= set(after["topic_names"]), f"CreateTopics answered NONE but these do not exist: {sorted(self.created_topics - set(after['topic_names']))}"
        for key in before:
            if key != "topic_names":
                assert after[key] == before[key], f"the baseline's {key} changed; mutating requests answered OK lately:\n{accepted}"

    # --- one fuzzed call ---------------------------------------------------------------

    def off_limits(self, target: Target, request: Message) -> str | None:
        """Why the request is left out, if it is: it triggers a known bug, or it
        could legitimately change the baseline (a valid mutation of the
        baseline's topic, group or transactional id)."""
        bugs = known_bugs_hit(target.name, request)
        if bugs:
            return f"known bug {bugs[0]}"
        if target.name in READ_ONLY:
            return None
        b = self.baseline
        # creating an existing topic changes nothing (the snapshot says so)
        if target.name != "CreateTopics" and any(v in (b.topic, b.group) for _, v in walk_strings(request)):
            return "names the baseline's topic or group"
        if target.name == "DeleteTopics" and b.scratch_topic in request.topics:
            return "deletes the scratch topic the other mutating RPCs aim at"
        if getattr(request, "transactional_id", None) == b.transactional_id and hasattr(request, "producer_epoch"):
            producer_id, epoch = request.producer_id, request.producer_epoch
            if target.name == "InitProducerId" and not request.HasField("producer_id"):
                producer_id = epoch = -1  # left out: a new incarnation (the safe default, not producer 0)
            if target.name == "InitProducerId":  # a new incarnation, or KIP-360's bump with the current or last epoch
                legit = producer_id < 0 or (producer_id == b.producer_id and epoch in (b.producer_epoch, b.producer_epoch - 1))
            else:
                legit = producer_id == b.producer_id and epoch == b.producer_epoch
            if legit:
                return "the baseline producer's own id and epoch"
        return None

    def check(self, target: Target, call: FuzzCall) -> None:
        self.kinds[str(target)][call.kind] += 1
        channel = self.channel(call.address, as_fuzzer=True)
        streamed = target.method.server_streaming  # its answers, each checked as a unary answer is
        rpc = (channel.unary_stream if streamed else channel.unary_unary)(target.path, request_serializer=None, response_deserializer=None)
        try:
            answers = list(rpc(call.payload, timeout=CALL_TIMEOUT_S)) if streamed else [rpc(call.payload, timeout=CALL_TIMEOUT_S)]
        except grpc.RpcError as exc:
            self.check_error(target, call, exc)
            return
        assert call.request is not None, f"{target}: a request that does not parse ({call}) was answered OK"
        assert answers, f"{target}: {call} answered no response"
        for answer in answers:
            response = message_class(target.method.output_type).FromString(answer)
            for item in walk_errors(response):
                assert item.code in ERROR_TABLE and item.code != UNKNOWN_SERVER_ERROR, f"{target}: {call} answered an item error {item}"
                assert item.code == NONE or item.message.strip(), f"{target}: {call} answered an item error without a message: {item}"
        self.outcomes[str(target)]["OK"] += 1
        if target.name not in READ_ONLY:
            self.accepted.append((target, call))
        if target.name == "CreateTopics" and not call.request.validate_only:
            self.created_topics.update(r.name for r in response.results if r.error.code == NONE)
        if target.name == "DeleteTopics":  # only topics the fuzzing created can go (off_limits keeps the others); one
            # not gone by the request's timeout is already unknown to Metadata, its deletion going on
            gone = (NONE, ErrorCode.Value("REQUEST_TIMED_OUT"))
            self.created_topics.difference_update(r.topic for r in response.results if r.error.code in gone)

    def check_error(self, target: Target, call: FuzzCall, exc: grpc.RpcError) -> None:
        code = exc.code()

        def said() -> str:  # built only for a failure: a request can print to megabytes
            return f"{target}: {call} answered {code.name}: {exc.details()!r}"

        assert code in ALLOWED_STATUS, said()
        info, _ = errors.details_of(exc)
        assert info is not None and info.domain == errors.ERROR_DOMAIN, f"{said()} without our ErrorInfo"
        error = errors.from_rpc_error(exc)
        assert error.code in ERROR_TABLE and error.code not in (NONE, UNKNOWN_SERVER_ERROR), said()
        assert error.spec.grpc_status == code, f"{said()}: {error.name} belongs with {error.spec.grpc_status.name}"
        assert error.message.strip(), f"{said()} without a message"
        if call.request is None:
            assert error.code == INVALID_REQUEST, f"{said()}: a request that does not parse must answer INVALID_REQUEST"
        self.outcomes[str(target)][error.name] += 1


@dataclass(frozen=True)
class FuzzCall:
    address: str
    kind: str  # "message", or how raw bytes were made (proto_strategies.RawPayload.kind)
    payload: bytes
    request: Message | None  # None when the payload does not parse

    def __str__(self) -> str:
        shown = repr(self.request)[:600] if self.request is not None else repr(self.payload[:200])
        return f"[{self.kind} to {self.address}, {len(self.payload)} bytes] {shown}"

    __repr__ = __str__

    def _repr_pretty_(self, printer, cycle) -> None:  # how Hypothesis shows a failing example
        printer.text(str(self))


def placement(topic: partition_pb2.TopicMetadata) -> bytes:
    """A topic's description without who leads and who is in sync, which the
    cluster changes by itself (an ISR shrinks and grows with a follower's lag;
    a leader whose ZooKeeper session lapses under load is replaced)."""
    kept = partition_pb2.TopicMetadata()
    kept.CopyFrom(topic)
    for partition in kept.partitions:
        for name in ("leader_id", "leader_address", "leader_epoch", "isr"):
            partition.ClearField(name)
    return kept.SerializeToString(deterministic=True)


def records_batch(producer_id: int, epoch: int, sequence: int, values: list[str], **fields) -> common_pb2.RecordBatch:
    return common_pb2.RecordBatch(
        producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
        records=[common_pb2.Record(key=f"k{i}".encode(), value=v.encode(), headers=[common_pb2.Header(key="h", value=b"v")])
                 for i, v in enumerate(values)],
        **fields,
    )


def fuzzer_acls(b: Baseline) -> list[AclBinding]:
    """All on the scratch names and fresh fz- ones; reading and describing the
    baseline's; a Deny that overrides an Allow; IdempotentWrite."""
    def binding(resource_type, name, operation, pattern=LITERAL, permission=ALLOW):
        return AclBinding(resource_type, pattern, name, f"User:{FUZZER}", "*", operation, permission)
    return [
        *(binding(TOPIC, name, "All") for name in (b.scratch_topic,)),
        binding(TOPIC, "fz-", "All", PREFIXED), binding(GROUP, "fz-", "All", PREFIXED), binding(TRANSACTIONAL_ID, "fz-", "All", PREFIXED),
        binding(GROUP, b.scratch_group, "All"), binding(TRANSACTIONAL_ID, b.scratch_transactional_id, "All"),
        binding(TOPIC, b.topic, "Read"), binding(TOPIC, b.topic, "All"), binding(TOPIC, b.topic, "Write", permission=DENY),
        binding(TOPIC, b.topic, "Create", permission=DENY), binding(TOPIC, b.topic, "Delete", permission=DENY),
        binding(TOPIC, b.topic, "Alter", permission=DENY),
        binding(GROUP, b.group, "Describe"), binding(TRANSACTIONAL_ID, b.transactional_id, "Describe"),
        binding(CLUSTER, CLUSTER_NAME, "IdempotentWrite"),
    ]


@pytest.fixture(scope="module", params=["plaintext", "mtls-acl"])
def hostile(request, tmp_path_factory):
    secured = request.param == "mtls-acl"
    cluster = LocalCluster(tmp_path_factory.mktemp("hostile") / "cluster")
    cluster.up(tls=secured, service_args={
        "partition_svc": ["--fetch-wait-ms-max", str(FETCH_WAIT_MS_MAX)],
        "coordinator_svc": ["--transaction-check-interval-ms", "200", "--ownership-check-interval-ms", "300"],
    })
    state = Hostile(cluster)
    try:
        cluster.wait_until_coordinators_settle()
        state.store_baseline()
        if secured:
            certs.issue(Path(cluster.state.tls["dir"]), FUZZER)
            wanted = fuzzer_acls(state.baseline)
            state.partition("CreateAcls", partition_pb2.CreateAclsRequest(bindings=[acls.binding_to_proto(b) for b in wanted]))
            state.wait_for_fuzzer_grants()
        yield state
    finally:
        state.close()
        cluster.down(grace_s=5)


@pytest.fixture(scope="module")
def baseline_snapshot(hostile):
    """The baseline as first read back; it holds what the checks need to mean something."""
    snapshot = hostile.snapshot()
    for index in range(hostile.baseline.partitions):
        uncommitted, committed = snapshot[f"read_uncommitted-{index}"], snapshot[f"read_committed-{index}"]
        assert any(b"aborted" in batch for batch in uncommitted) and not any(b"aborted" in batch for batch in committed)
        assert any(b"committed" in batch for batch in committed)
    assert len(snapshot["group_offsets"]) == hostile.baseline.partitions
    return snapshot


# --- the strategies ---------------------------------------------------------------------


def request_strategies(target: Target, hostile: Hostile) -> st.SearchStrategy[FuzzCall]:
    """Hostile requests for one RPC, as messages (3 in 4) or raw bytes."""
    b = hostile.baseline
    read_only = target.name in READ_ONLY
    fresh = st.text(alphabet=NAME_CHARS, min_size=1, max_size=20).map(lambda s: "fz-" + s)

    def pool(known: list[str], avoid: tuple[str, ...] = ()) -> Callable[[bool], st.SearchStrategy[str]]:
        return lambda small: weighted(
            (2, st.sampled_from(known)), (1, fresh), (1, hostile_text(small=small).filter(lambda s: s not in avoid))
        )

    own = (b.topic, b.group) if not read_only else ()
    topics = pool([b.scratch_topic, *([b.topic, *INTERNAL_TOPICS] if read_only else [])], (*own, *INTERNAL_TOPICS))
    groups = pool([b.scratch_group, *([b.group] if read_only else [])], own)
    transactional_ids = pool(["", b.transactional_id, b.scratch_transactional_id], own)  # "": an idempotent producer
    partitions = mostly(st.sampled_from([0, 1]), edge_integers(INT32_MIN, INT32_MAX))
    producer_ids = mostly(
        st.sampled_from([-1, 0, b.producer_id, b.producer_id + 1, b.idempotent_producer_id]), edge_integers(INT64_MIN, INT64_MAX)
    )
    epochs = mostly(st.sampled_from([-1, 0, b.producer_epoch - 1, b.producer_epoch, b.producer_epoch + 1]), edge_integers(INT32_MIN, INT32_MAX))
    offsets = mostly(st.sampled_from([0, 1, 2, 5, 100]), edge_integers(INT64_MIN, INT64_MAX))
    strategies = MessageStrategies(
        {
            "topic": topics,
            "txlog.v1.MetadataRequest.topics": topics,
            # deletions: of internal topics (refused), fresh names (unknown) and topics the fuzzing created
            "txlog.v1.DeleteTopicsRequest.topics": pool([*INTERNAL_TOPICS, *sorted(hostile.created_topics)], own),
            "txlog.v1.CreatableTopic.name": pool([b.topic, b.scratch_topic, *INTERNAL_TOPICS]),
            "txlog.v1.CreatableTopic.partition_count": mostly(st.sampled_from([1, 2]), st.sampled_from([1000, 1001]) | edge_integers(INT32_MIN, INT32_MAX)),
            "transactional_id": transactional_ids,
            "transactional_ids": transactional_ids,
            "group_id": groups,
            "group_ids": groups,
            "txlog.v1.FindCoordinatorRequest.key": lambda small: st.one_of(transactional_ids(small), groups(small)),
            "producer_id": producer_ids,
            "producer_id_filters": producer_ids,
            "producer_epoch": epochs,
            **{f"txlog.v1.{m}.partition": partitions for m in ("TopicPartition", "PartitionBatch", "FetchPartition", "ListOffsetsPartition", "PartitionOffset")},
            "fetch_offset": offsets,
            "txlog.v1.PartitionOffset.offset": offsets,
            "txlog.v1.InitProducerIdRequest.transaction_timeout_ms": mostly(st.sampled_from([60_000, 1, 900_000]), edge_integers(INT32_MIN, INT32_MAX, extra=(900_001,))),
            # long polls: mostly short, and the extremes, which the cluster cuts to FETCH_WAIT_MS_MAX
            "txlog.v1.FetchRequest.max_wait_ms": mostly(st.integers(0, 20), st.sampled_from([-1, INT32_MIN, INT32_MAX, 30_001])),
            "txlog.v1.Record.timestamp_ms": mostly(st.sampled_from([0, RECENT_TIMESTAMP_MS]), st.sampled_from([2**53, 2**53 + 1, -1]) | edge_integers(INT64_MIN, INT64_MAX)),
            "txlog.v1.ProduceRequest.acks": mostly(st.sampled_from([-1, 0, 1]), edge_integers(INT32_MIN, INT32_MAX)),
        },
        # every valid topic of a CreateTopics is a ZooKeeper round trip: a shorter "long" list keeps the run short
        long_lists={"txlog.v1.CreateTopicsRequest.topics": (101,)},
    )
    record_batch = common_pb2.RecordBatch.DESCRIPTOR

    def batches(small: bool) -> st.SearchStrategy[common_pb2.RecordBatch]:
        """Generic batches, and well-framed plain ones (so hostile records reach the log)."""
        plain = strategies.field(record_batch.fields_by_name["records"], small=small, depth=2).map(
            lambda records: common_pb2.RecordBatch(producer_id=-1, producer_epoch=-1, base_sequence=-1, records=records)
        )
        return mostly(plain, strategies.message(record_batch, small=small, depth=2))

    strategies.overrides["txlog.v1.PartitionBatch.batch"] = batches

    def encoded_batches() -> st.SearchStrategy[bytes]:
        """Encoded batches with a good CRC around hostile records and header fields, some bytes of them
        flipped, and arbitrary bytes: a leader stores only what the format and the producer rules allow.
        Small records only: their sizes are the message form's concern, and two large forms in one
        PartitionBatch made each example take seconds to generate."""
        records = strategies.field(record_batch.fields_by_name["records"], small=True, depth=2)
        header_ints = st.fixed_dictionaries({
            "producer_id": st.sampled_from([-1, -1, 5, -2]), "producer_epoch": st.sampled_from([-1, 0, 32767, -32768]),
            "base_sequence": st.sampled_from([-1, 0, 2**31 - 1]), "codec": st.sampled_from([0, 0, 1, 7]),
            "max_timestamp_ms": st.sampled_from([0, RECENT_TIMESTAMP_MS, 2**53 + 1, -1]), "untimed": st.booleans(),
            "transactional": st.booleans(), "count_delta": st.sampled_from([0, 0, 0, 1, -1])})

        def build(recs, fields) -> bytes:
            header = {name: value for name, value in fields.items() if name != "count_delta"}
            return batch_format.encode(common_pb2.RecordBatch(records=recs).SerializeToString(),
                                       len(recs) + fields["count_delta"], **header)

        framed = st.builds(build, records, header_ints)
        flipped = st.tuples(framed, st.integers(0, 2**16), st.integers(1, 255)).map(
            lambda t: t[0][: t[1] % len(t[0])] + bytes([t[0][t[1] % len(t[0])] ^ t[2]]) + t[0][t[1] % len(t[0]) + 1:])
        return mostly(framed, st.one_of(flipped, st.binary(max_size=200)))

    partition_batch = partition_pb2.PartitionBatch.DESCRIPTOR
    encoded = encoded_batches()

    def partition_batches(small: bool) -> st.SearchStrategy[partition_pb2.PartitionBatch]:
        """A PartitionBatch in one form or the other, and now and then in both (refused: set exactly one)."""
        fields = {name: strategies.field(partition_batch.fields_by_name[name], small=small, depth=1)
                  for name in ("topic", "partition", "leader_epoch", "batch")}

        def build(values: dict, form: str, encoded_batch: bytes) -> partition_pb2.PartitionBatch:
            item = partition_pb2.PartitionBatch()
            for name, value in values.items():
                assign(item, partition_batch.fields_by_name[name], value)
            if form != "message":
                item.encoded_batch = encoded_batch
            if form == "encoded":
                item.ClearField("batch")
            return item

        forms = weighted((5, st.just("message")), (4, st.just("encoded")), (1, st.just("both")))
        return st.builds(build, st.fixed_dictionaries(fields), forms, encoded)

    strategies.overrides["txlog.v1.PartitionBatch"] = partition_batches
    request_type = target.method.input_type
    cls = message_class(request_type)
    messages = strategies.message(request_type)
    addresses = st.sampled_from(sorted(hostile.addresses(target.kind)))

    def from_raw(address: str, raw: RawPayload) -> FuzzCall:
        try:
            request = cls.FromString(raw.data)
        except DecodeError:
            request = None
        return FuzzCall(address, raw.kind, raw.data, request)

    raw = raw_payloads(request_type, messages)

    @st.composite
    def calls(draw) -> FuzzCall:
        address = draw(addresses)
        if draw(st.sampled_from([True, True, True, False])):
            message = draw(messages)
            return FuzzCall(address, "message", message.SerializeToString(), message)
        return from_raw(address, draw(raw))

    return calls()


# --- the tests ----------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS, ids=str)
def test_rpc_answers_hostile_requests_with_clear_errors_and_keeps_the_baseline(target, hostile, baseline_snapshot):
    calls = request_strategies(target, hostile)

    @settings(
        derandomize=True,
        database=None,
        max_examples=SECURED_EXAMPLES_PER_RPC if hostile.secured else EXAMPLES_PER_RPC,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much, HealthCheck.large_base_example],
    )
    @given(call=calls)
    def fuzz(call: FuzzCall) -> None:
        if call.kind == "invalid-utf8":
            assert call.request is None, f"the strategy made invalid UTF-8 that parses: {call}"
        reason = None if call.request is None else hostile.off_limits(target, call.request)
        if reason is not None:
            hostile.outcomes[str(target)][f"left out: {reason}"] += 1
        assume(reason is None)
        hostile.check(target, call)

    fuzz()
    print(f"{target}: sent {dict(hostile.kinds[str(target)])}, answered {dict(hostile.outcomes[str(target)])}")
    hostile.assert_alive_and_serving()
    hostile.assert_baseline_unchanged(baseline_snapshot)


def test_every_service_in_protos_is_fuzzed():
    assert {s.name for s in proto_services()} == set(SERVED_BY) | set(SERVED_BY_APPLICATIONS), \
        "a new service: say in SERVED_BY which process serves it"
    served = [s for s in proto_services() if s.name not in SERVED_BY_APPLICATIONS]
    assert len(TARGETS) == sum(len(s.methods) for s in served) + len(ALSO_SERVED)


# --- names: length and charset, clear errors, nothing created ------------------------------

TOPIC_RULE = "1 to 249 characters of [a-zA-Z0-9._-]"
TRANSACTIONAL_ID_RULE = "1 to 255 characters of [a-zA-Z0-9._:-]"
GROUP_ID_RULE = "1 to 255 characters of [a-zA-Z0-9._-]"
BAD_NAMES = {
    "trailing-newline": "name\n",  # "$" would match before it: txlog/protocol/names.py uses fullmatch
    "space": "has space",
    "empty group": "/b",  # "/" separates a group from the rest; the group may not be empty
    "trailing slash": "a/",
    "backslash": "a\\b",
    "accented": "café",
    "cjk": "名前",
    "emoji": "😀",
    "nul": "a\x00b",
    "tab": "a\tb",
    "newline-inside": "a\nb",
    "star": "a*",
    "semicolon": "a;b",
}
BAD_TOPIC_NAMES = {
    **BAD_NAMES,
    "empty": "",
    "too-long-250": "t" * 250,
    "dot": ".",
    "dot-dot": "..",
    "colon": "a:b",
}
BAD_TRANSACTIONAL_IDS = {**BAD_NAMES, "empty": "", "too-long-256": "x" * 256}
BAD_GROUP_IDS = {**BAD_NAMES, "empty": "", "too-long-256": "g" * 256, "colon": "a:b"}


def says_what_is_wrong(message: str, name: str, rule: str | None) -> bool:
    """The message names the value (as the servers quote it) and, when given, the rule it breaks."""
    return repr(name) in message and (rule is None or rule in message)


def coordinator_error(hostile: Hostile, method: str, request: Message) -> errors.TxlogError:
    with pytest.raises(grpc.RpcError) as info:
        hostile.coordinator(method, request, hostile.addresses("coordinator_svc")[0])
    return errors.from_rpc_error(info.value)


def partition_error(hostile: Hostile, method: str, request: Message) -> errors.TxlogError:
    with pytest.raises(grpc.RpcError) as info:
        hostile.partition(method, request)
    return errors.from_rpc_error(info.value)


def transactional_ids(hostile: Hostile) -> set[str]:
    reply = retrying(lambda: hostile.coordinator(
        "ListTransactions", coordinator_pb2.ListTransactionsRequest(), hostile.addresses("coordinator_svc")[0]))
    return {t.transactional_id for t in reply.transactions}


def consumer_offsets_ends(hostile: Hostile) -> list[int]:
    """The high watermark of every __consumer_offsets partition: a stored offset commit moves one."""
    topic = hostile.partition("Metadata", partition_pb2.MetadataRequest(topics=["__consumer_offsets"])).topics[0]
    ends = []
    for p in topic.partitions:
        reply = hostile.partition("ListOffsets", partition_pb2.ListOffsetsRequest(partitions=[partition_pb2.ListOffsetsPartition(
            topic="__consumer_offsets", partition=p.partition, spec=partition_pb2.OFFSET_SPEC_LATEST)]), p.leader_address)
        ends.append(reply.results[0].offset)
    return ends


def topic_names(hostile: Hostile) -> set[str]:
    return {t.name for t in hostile.partition("Metadata", partition_pb2.MetadataRequest(all_topics=True)).topics}


@pytest.mark.parametrize("name", BAD_TOPIC_NAMES.values(), ids=BAD_TOPIC_NAMES.keys())
def test_bad_topic_names_get_invalid_topic_saying_why_and_create_nothing(name, hostile):
    b = hostile.baseline
    before, offsets_before = topic_names(hostile), consumer_offsets_ends(hostile)
    for validate_only in (True, False):
        reply = hostile.partition("CreateTopics", partition_pb2.CreateTopicsRequest(
            topics=[partition_pb2.CreatableTopic(name=name, partition_count=1)], validate_only=validate_only))
        error = reply.results[0].error
        assert ErrorCode.Name(error.code) == "INVALID_TOPIC", reply
        assert says_what_is_wrong(error.message, name, TOPIC_RULE), error.message
    committed = retrying(lambda: hostile.partition("OffsetCommit", partition_pb2.OffsetCommitRequest(
        group_id=b.scratch_group, offsets=[partition_pb2.PartitionOffset(topic=name, partition=0, offset=0)]),
        hostile.group_coordinator(b.scratch_group)))
    error = committed.results[0].error
    assert ErrorCode.Name(error.code) == "INVALID_TOPIC", committed
    assert says_what_is_wrong(error.message, name, TOPIC_RULE), error.message
    assert topic_names(hostile) == before
    assert consumer_offsets_ends(hostile) == offsets_before


def test_internal_topic_names_cannot_be_created_by_clients(hostile):
    before = topic_names(hostile)
    for name in ("__mine", "__", "__consumer_offsets_2"):
        reply = hostile.partition("CreateTopics", partition_pb2.CreateTopicsRequest(
            topics=[partition_pb2.CreatableTopic(name=name, partition_count=1)]))
        error = reply.results[0].error
        assert ErrorCode.Name(error.code) == "INVALID_TOPIC" and "'__'" in error.message and "internal" in error.message, reply
    assert topic_names(hostile) == before


@pytest.mark.parametrize("name", BAD_TRANSACTIONAL_IDS.values(), ids=BAD_TRANSACTIONAL_IDS.keys())
def test_bad_transactional_ids_get_invalid_transactional_id_saying_why_and_create_nothing(name, hostile):
    b = hostile.baseline
    before = transactional_ids(hostile)
    requests = {
        "FindCoordinator": coordinator_pb2.FindCoordinatorRequest(key=name, key_type=coordinator_pb2.COORDINATOR_KEY_TYPE_TRANSACTION),
        "AddPartitionsToTxn": coordinator_pb2.AddPartitionsToTxnRequest(
            transactional_id=name, producer_id=0, producer_epoch=0, partitions=[common_pb2.TopicPartition(topic=b.scratch_topic, partition=0)]),
        "AddOffsetsToTxn": coordinator_pb2.AddOffsetsToTxnRequest(transactional_id=name, producer_id=0, producer_epoch=0, group_id=b.scratch_group),
        "EndTxn": coordinator_pb2.EndTxnRequest(transactional_id=name, producer_id=0, producer_epoch=0, committed=True),
    }
    if name:  # an empty transactional id asks for an idempotent producer, which is no error
        requests["InitProducerId"] = coordinator_pb2.InitProducerIdRequest(
            transactional_id=name, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1)
    for method, request in requests.items():
        error = coordinator_error(hostile, method, request)
        assert error.name == "INVALID_TRANSACTIONAL_ID", (method, error)
        assert says_what_is_wrong(error.message, name, TRANSACTIONAL_ID_RULE), (method, error.message)
    described = hostile.coordinator("DescribeTransactions", coordinator_pb2.DescribeTransactionsRequest(
        transactional_ids=[name]), hostile.addresses("coordinator_svc")[0]).transactions[0]
    assert ErrorCode.Name(described.error.code) == "INVALID_TRANSACTIONAL_ID", described
    assert says_what_is_wrong(described.error.message, name, TRANSACTIONAL_ID_RULE), described.error.message
    assert transactional_ids(hostile) == before


@pytest.mark.parametrize("name", BAD_GROUP_IDS.values(), ids=BAD_GROUP_IDS.keys())
def test_bad_group_ids_get_invalid_group_id_saying_why_and_create_nothing(name, hostile):
    b = hostile.baseline
    offsets_before = consumer_offsets_ends(hostile)
    scratch_before = hostile.describe_transaction(b.scratch_transactional_id)
    offsets = [partition_pb2.PartitionOffset(topic=b.scratch_topic, partition=0, offset=0)]
    for method, request in {
        "OffsetCommit": partition_pb2.OffsetCommitRequest(group_id=name, offsets=offsets),
        "OffsetFetch": partition_pb2.OffsetFetchRequest(group_id=name),
        "TxnOffsetCommit": partition_pb2.TxnOffsetCommitRequest(
            transactional_id=b.scratch_transactional_id, group_id=name, producer_id=scratch_before.producer_id,
            producer_epoch=scratch_before.producer_epoch, offsets=offsets),
    }.items():
        error = partition_error(hostile, method, request)
        assert error.name == "INVALID_GROUP_ID", (method, error)
        assert says_what_is_wrong(error.message, name, GROUP_ID_RULE), (method, error.message)
    found = hostile.partition("Metadata", partition_pb2.MetadataRequest(group_ids=[name])).group_coordinators[0]
    assert ErrorCode.Name(found.error.code) == "INVALID_GROUP_ID", found
    assert says_what_is_wrong(found.error.message, name, GROUP_ID_RULE), found.error.message
    error = coordinator_error(hostile, "FindCoordinator", coordinator_pb2.FindCoordinatorRequest(
        key=name, key_type=coordinator_pb2.COORDINATOR_KEY_TYPE_GROUP))
    assert error.name == "INVALID_GROUP_ID" and says_what_is_wrong(error.message, name, GROUP_ID_RULE), error
    error = coordinator_error(hostile, "AddOffsetsToTxn", coordinator_pb2.AddOffsetsToTxnRequest(
        transactional_id=b.scratch_transactional_id, producer_id=scratch_before.producer_id,
        producer_epoch=scratch_before.producer_epoch, group_id=name))
    # the coordinator's message names the group but not the rule (see the report): only the name is checked
    assert error.name == "INVALID_GROUP_ID" and says_what_is_wrong(error.message, name, None), error
    assert consumer_offsets_ends(hostile) == offsets_before
    assert hostile.describe_transaction(b.scratch_transactional_id) == scratch_before


def test_names_at_the_length_limits_are_accepted(hostile):
    topic, transactional_id, group = "t" * 249, "x:" * 127 + "x", "g" * 255
    reply = hostile.partition("CreateTopics", partition_pb2.CreateTopicsRequest(
        topics=[partition_pb2.CreatableTopic(name=topic, partition_count=1)]))
    assert reply.results[0].error.code == NONE, reply
    hostile.created_topics.add(topic)
    assert topic in topic_names(hostile)
    found = hostile.coordinator("FindCoordinator", coordinator_pb2.FindCoordinatorRequest(
        key=transactional_id, key_type=coordinator_pb2.COORDINATOR_KEY_TYPE_TRANSACTION), hostile.addresses("coordinator_svc")[0])
    assert found.address in hostile.addresses("coordinator_svc")
    coordinator = hostile.partition("Metadata", partition_pb2.MetadataRequest(group_ids=[group])).group_coordinators[0]
    assert coordinator.error.code == NONE and coordinator.address in hostile.addresses("partition_svc"), coordinator


def test_the_authorizer_refused_only_where_it_is_on(hostile):
    """Runs after the fuzzing (file order): on the secured cluster the
    fuzzer was refused (the internal RPCs, the baseline's writes) and let
    through (the scratch names); on the plaintext one nothing was refused for
    authorization and the ACL RPCs said the authorizer is off."""
    answered = collections.Counter()
    for outcomes in hostile.outcomes.values():
        answered.update(outcomes)
    refused = sum(n for name, n in answered.items() if name.endswith("_AUTHORIZATION_FAILED"))
    assert answered["OK"] > 0, answered
    if hostile.secured:
        assert refused > 0 and answered["CLUSTER_AUTHORIZATION_FAILED"] > 0, answered
        assert hostile.outcomes["ReplicationService.ReplicaFetch@partition_svc"].keys() <= {"CLUSTER_AUTHORIZATION_FAILED", "INVALID_REQUEST"}
    else:
        assert refused == 0, answered
        assert "SECURITY_DISABLED" in hostile.outcomes["PartitionService.CreateAcls@partition_svc"], answered



@functools.cache
def hostile_compressed_records() -> dict[str, common_pb2.RecordBatch]:
    """Compressed batches no leader may store: garbage, truncated, a bomb far past batch_bytes_max (16 MiB),
    a codec number that does not exist, records on both sides, and compressed bytes that are not records."""
    cases = {}
    for codec in sorted(compression.CODECS):
        name = compression.NAME_BY_CODEC[codec]
        whole = compression.compress_records(codec, [common_pb2.Record(value=b"v" * 100)] * 10)
        cases[f"{name}-garbage"] = common_pb2.RecordBatch(compression=codec, compressed_records=os.urandom(64))
        cases[f"{name}-truncated"] = common_pb2.RecordBatch(compression=codec, compressed_records=whole[: len(whole) // 2])
        cases[f"{name}-bomb"] = common_pb2.RecordBatch(compression=codec, compressed_records=compression.compress(codec, bytes(64 << 20)))
        cases[f"{name}-not-records"] = common_pb2.RecordBatch(compression=codec, compressed_records=compression.compress(codec, b"\xff" * 50))
    cases["unknown-codec"] = common_pb2.RecordBatch(compression=77, compressed_records=b"x")
    cases["none-with-bytes"] = common_pb2.RecordBatch(compressed_records=b"x")
    cases["records-and-compressed"] = common_pb2.RecordBatch(
        compression=common_pb2.COMPRESSION_GZIP, records=[common_pb2.Record(value=b"v")],
        compressed_records=compression.compress_records(common_pb2.COMPRESSION_GZIP, [common_pb2.Record()]))
    return cases


def hostile_encoded_batches() -> dict[str, bytes]:
    """Encoded batches no leader may store, each wrong in one way (docs/guides/batch-format.md): the format, the CRC, the
    attributes, the record count, the records section, the producer fields, the timestamps and the size."""
    def records(n=2, value=b"v"):
        return common_pb2.RecordBatch(records=[common_pb2.Record(value=value)] * n).SerializeToString()

    good = batch_format.encode(records(), 2)
    flipped_record = bytearray(good)
    flipped_record[-1] ^= 1
    bad_magic = bytearray(good)
    bad_magic[20] = 1

    def with_attributes(attributes: int) -> bytes:  # a CRC that matches the bad attributes: only the rule refuses them
        body = bytearray(good[batch_format.CRC_END:])
        body[0:2] = attributes.to_bytes(2, "big")
        return good[:21] + crc32c.crc32c(bytes(body)).to_bytes(4, "big") + bytes(body)

    return {
        "empty": b"",
        "header-only": good[:batch_format.HEADER_BYTES],
        "bad-magic": bytes(bad_magic),
        "crc-mismatch": bytes(flipped_record),
        "unknown-attribute-bit": with_attributes(0x40),
        "control-bit": with_attributes(0x20),
        "unknown-codec": with_attributes(0x07),
        "more-records-than-said": batch_format.encode(records(3), 2),
        "fewer-records-than-said": batch_format.encode(records(1), 2),
        "no-records": batch_format.encode(b"", 0),
        "section-not-records": batch_format.encode(b"\xff" * 20, 1),
        "section-with-other-fields": batch_format.encode(common_pb2.RecordBatch(
            producer_id=3, records=[common_pb2.Record(value=b"v")]).SerializeToString(), 1),
        "epoch-without-producer": batch_format.encode(records(), 2, producer_epoch=0),
        "transactional-without-producer": batch_format.encode(records(), 2, transactional=True),
        "epoch-out-of-range": batch_format.encode(records(), 2, producer_id=7, producer_epoch=-2, base_sequence=0),
        "sequence-out-of-range": batch_format.encode(records(), 2, producer_id=7, producer_epoch=0, base_sequence=-5),
        "timestamp-out-of-range": batch_format.encode(records(), 2, max_timestamp_ms=2**53 + 1),
        "gzip-garbage": batch_format.encode(os.urandom(64), 2, codec=common_pb2.COMPRESSION_GZIP),
        "zstd-bomb": batch_format.encode(compression.compress(common_pb2.COMPRESSION_ZSTD, bytes(64 << 20)), 1,
                                         codec=common_pb2.COMPRESSION_ZSTD),
    }


def refused_batch(hostile: Hostile, topic: str, **item) -> tuple[str, str]:
    """(code name, message) of a Produce of one PartitionBatch (``item``'s batch fields) to partition 0 of
    ``topic``, after checking that it stored nothing."""
    leader = hostile.leader(topic, 0)
    before = latest_offset(hostile, topic, leader)
    reply = hostile.partition("Produce", partition_pb2.ProduceRequest(acks=-1, batches=[
        partition_pb2.PartitionBatch(topic=topic, partition=0, leader_epoch=-1, **item)]), leader)
    assert latest_offset(hostile, topic, leader) == before, reply
    return ErrorCode.Name(reply.results[0].error.code), reply.results[0].error.message


AUTHORIZATION_FAILED = ("TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED")


@pytest.mark.parametrize("case", sorted(hostile_encoded_batches()))
def test_hostile_encoded_batches_get_a_clear_per_partition_error_and_store_nothing(case, hostile):
    code, message = refused_batch(hostile, hostile.baseline.compressed_topic, encoded_batch=hostile_encoded_batches()[case])
    expected = ("CORRUPT_MESSAGE",) if case == "crc-mismatch" else ("INVALID_RECORD", "INVALID_REQUEST", "INVALID_TIMESTAMP")
    assert code in expected + AUTHORIZATION_FAILED and message, (code, message)


def test_a_batch_in_both_forms_and_encoded_batches_to_internal_topics_are_refused(hostile):
    encoded = batch_format.encode(common_pb2.RecordBatch(records=[common_pb2.Record(value=b"v")]).SerializeToString(), 1)
    plain = common_pb2.RecordBatch(records=[common_pb2.Record(value=b"v")])
    for topic, item in ((hostile.baseline.compressed_topic, {"batch": plain, "encoded_batch": encoded}),
                        ("__consumer_offsets", {"encoded_batch": encoded})):
        code, message = refused_batch(hostile, topic, **item)
        if code not in AUTHORIZATION_FAILED:
            assert code == "INVALID_REQUEST" and ("exactly one" in message or "RecordBatch messages" in message), message


def latest_offset(hostile: Hostile, topic: str, leader: str) -> int:
    return hostile.partition("ListOffsets", partition_pb2.ListOffsetsRequest(partitions=[partition_pb2.ListOffsetsPartition(
        topic=topic, partition=0, spec=partition_pb2.OFFSET_SPEC_LATEST)]), leader).results[0].offset


@pytest.mark.parametrize("case", sorted(hostile_compressed_records()))
def test_hostile_compressed_batches_get_a_clear_per_partition_error_and_store_nothing(case, hostile):
    for topic in (hostile.baseline.compressed_topic, "__consumer_offsets"):
        code, message = refused_batch(hostile, topic, batch=hostile_compressed_records()[case])
        if code not in AUTHORIZATION_FAILED:
            assert code in ("INVALID_RECORD", "INVALID_REQUEST") and "compress" in message, (code, message)
