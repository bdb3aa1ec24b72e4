"""One partition of the transaction log, ``__transaction_state``, stored on
partition_svc like any topic (keyed by transactional id, compacted).

The owning coordinator writes it as an idempotent producer whose producer id is
the partition's ``log_producer_id`` and whose producer epoch is its coordinator
epoch. So the partition leader itself fences a deposed coordinator: once the new
owner has written with a higher epoch, every write of the old one is refused
(INVALID_PRODUCER_EPOCH), and a retried write is never appended twice.

Keys are transactional ids, except the fence record (empty key), group
decisions (``#decision:<id>``) and transaction groups' check-back settings
(``#group-config:<group>``, a JSON object of the keys set; "#" is in no
transactional id).

Writes are batched: records submitted while a write is in flight go out
together in the next one (one Produce, one sync on the leader). A write whose
outcome stays unknown or that is fenced marks the partition broken: the
coordinator stops serving it and loads it again (with a new epoch), so its
memory never disagrees with the log.
"""

from __future__ import annotations

import asyncio
import json
import logging

from coordinator_svc.transaction_state import GroupDecision, TransactionMetadata, TransactionRecord
from services.coordination.rpc import PeerClient, answer_of
from services.runtime.logs import fields
from txlog.protocol import TRANSACTION_STATE_TOPIC, next_sequence
from txlog.protocol.errors import ErrorCode, TxlogError, spec_of
from txlog.protocol.retry import RetryPolicy
from txlog.v1 import common_pb2, partition_pb2

log = logging.getLogger(__name__)
RECORDS_PER_WRITE_MAX = 500
NONE = ErrorCode.Value("NONE")
ALREADY_WRITTEN = ErrorCode.Value("DUPLICATE_SEQUENCE")
FENCED = {ErrorCode.Value(c) for c in ("INVALID_PRODUCER_EPOCH", "PRODUCER_FENCED", "OUT_OF_ORDER_SEQUENCE", "UNKNOWN_PRODUCER_ID")}
FENCE_KEY = b""  # the record that opens an owner's epoch; ignored when loading
DECISION_KEY_PREFIX = b"#decision:"
GROUP_CONFIG_KEY_PREFIX = b"#group-config:"


def decision_key(decision_id: str) -> bytes:
    return DECISION_KEY_PREFIX + decision_id.encode()


class TransactionLogPartition:
    def __init__(self, client: PeerClient, partition: int, producer_id: int, producer_epoch: int, write_deadline_ms: float = 30_000):
        self.client = client
        self.partition = partition
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.next_sequence = 0
        self.broken: str | None = None
        self.retry = RetryPolicy(attempts_max=1_000, backoff_initial_ms=20, backoff_max_ms=500, deadline_ms=write_deadline_ms)
        self._pending: list[tuple[bytes, bytes | None, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None

    async def append(self, key: bytes, value: bytes | None) -> None:
        """Returns once the record is durable in the log; raises NOT_COORDINATOR otherwise."""
        if self.broken:
            raise TxlogError(ErrorCode.Value("NOT_COORDINATOR"), f"transaction log partition {self.partition} is being reloaded: {self.broken}")
        future = asyncio.get_running_loop().create_future()
        self._pending.append((key, value, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())
        await future

    async def write(self, record: TransactionRecord) -> None:
        await self.append(record.transactional_id.encode(), record.encode())

    async def write_decision_then(self, decision: GroupDecision, records: list[TransactionRecord]) -> None:
        """Writes a group decision, then its members' records: appended in this
        order (the flusher keeps it), so no member record is durable before the
        decision is."""
        await asyncio.gather(
            self.append(decision_key(decision.decision_id), decision.encode()), *(self.write(r) for r in records)
        )

    async def remove_decision(self, decision_id: str) -> None:
        await self.append(decision_key(decision_id), None)

    async def write_group_config(self, group_id: str, overrides: dict[str, str]) -> None:
        """A group's check-back settings (the keys set; none: a tombstone)."""
        value = json.dumps(overrides, sort_keys=True, separators=(",", ":")).encode() if overrides else None
        await self.append(GROUP_CONFIG_KEY_PREFIX + group_id.encode(), value)

    async def _flush(self) -> None:
        while self._pending:
            group = self._pending[:RECORDS_PER_WRITE_MAX]
            del self._pending[: len(group)]
            batch = common_pb2.RecordBatch(
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                base_sequence=self.next_sequence,
                records=[common_pb2.Record(key=k) if v is None else common_pb2.Record(key=k, value=v) for k, v, _ in group],
            )
            try:
                await self.retry.run(lambda b=batch: self._send(b), lambda exc: isinstance(exc, TxlogError) and exc.retriable)
                self.next_sequence = next_sequence(self.next_sequence, len(group))
                outcome = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # outcome unknown: stop writing; the partition is reloaded
                self.broken = str(exc)
                log.warning("transaction log write failed; partition will be reloaded", extra=fields(partition=self.partition, error=str(exc)))
                outcome = TxlogError(ErrorCode.Value("NOT_COORDINATOR"), f"transaction log partition {self.partition} lost its writer: {exc}")
            for _, _, future in group:
                if not future.done():
                    future.set_result(None) if outcome is None else future.set_exception(outcome)
            if outcome is not None:
                for _, _, future in self._pending:
                    future.set_exception(outcome)
                self._pending.clear()

    async def _send(self, batch: common_pb2.RecordBatch) -> None:
        leader = await self.client.leader(TRANSACTION_STATE_TOPIC, self.partition)
        request = partition_pb2.ProduceRequest(
            acks=-1, batches=[partition_pb2.PartitionBatch(topic=TRANSACTION_STATE_TOPIC, partition=self.partition, batch=batch)]
        )
        try:
            reply = await self.client.stub(leader).Produce(request)
        except Exception as exc:
            self.client.forget_leader(TRANSACTION_STATE_TOPIC, self.partition)
            raise TxlogError(ErrorCode.Value("REQUEST_TIMED_OUT"), f"writing the transaction log at {leader}: {exc}") from None
        error = reply.results[0].error
        if error.code in (NONE, ALREADY_WRITTEN):
            return
        if spec_of(error.code).retriable:
            self.client.forget_leader(TRANSACTION_STATE_TOPIC, self.partition)
        if error.code in FENCED:  # never retried: another owner writes this partition now
            raise TxlogError(ErrorCode.Value("TRANSACTION_COORDINATOR_FENCED"), error.message)
        raise TxlogError(error.code, error.message)

    async def read_all(self) -> tuple[dict[str, TransactionMetadata], dict[str, GroupDecision], dict[str, dict[str, str]]]:
        """Every transactional id still in the log, as metadata from its latest
        record; every group decision not removed; every group's check-back
        settings, read from the log start to its end.

        Each response's records are decoded (LogContents) as it comes, a key's
        latest value in it only: the raw records of one response at a time are
        held, not the whole log's, and an id's several records in one response
        (a record per transition, until compaction) are decoded once."""
        contents = LogContents()
        offset = 0
        while True:
            leader = await self.client.leader(TRANSACTION_STATE_TOPIC, self.partition)
            reply = await answer_of(lambda leader=leader, offset=offset: self.client.stub(leader).Fetch(
                partition_pb2.FetchRequest(
                    isolation_level=common_pb2.ISOLATION_LEVEL_READ_UNCOMMITTED,
                    partitions=[partition_pb2.FetchPartition(topic=TRANSACTION_STATE_TOPIC, partition=self.partition, fetch_offset=offset)],
                )
            ))
            result = reply.results[0]
            if result.error.code == ErrorCode.Value("OFFSET_OUT_OF_RANGE") and offset < result.log_start_offset:
                offset = result.log_start_offset
                continue
            if result.error.code != NONE:
                self.client.forget_leader(TRANSACTION_STATE_TOPIC, self.partition)
                raise TxlogError(result.error.code, f"loading transaction log partition {self.partition}: {result.error.message}")
            latest: dict[bytes, bytes | None] = {}
            for batch in result.batches:
                for record in batch.records:
                    latest[record.key] = record.value if record.HasField("value") else None
            contents.take(latest)
            if result.next_fetch_offset >= result.high_watermark:
                return contents.transactions, contents.decisions, contents.group_configs
            offset = result.next_fetch_offset


class LogContents:
    """What a transaction-log partition holds, by kind of key, as its records are taken in log order."""

    def __init__(self):
        self.transactions: dict[str, TransactionMetadata] = {}
        self.decisions: dict[str, GroupDecision] = {}
        self.group_configs: dict[str, dict[str, str]] = {}

    def take(self, latest: dict[bytes, bytes | None]) -> None:
        """The latest value of each key in a stretch of the log, after every
        stretch before it: a value replaces what its key had, a tombstone
        (None) removes it."""
        for key, value in latest.items():
            if key == FENCE_KEY:
                continue
            if key.startswith(DECISION_KEY_PREFIX):
                decision_id = key[len(DECISION_KEY_PREFIX):].decode()
                if value is None:
                    self.decisions.pop(decision_id, None)
                else:
                    self.decisions[decision_id] = GroupDecision.decode(decision_id, value)
            elif key.startswith(GROUP_CONFIG_KEY_PREFIX):
                group_id = key[len(GROUP_CONFIG_KEY_PREFIX):].decode()
                if value is None:
                    self.group_configs.pop(group_id, None)
                else:
                    self.group_configs[group_id] = json.loads(value)
            else:
                tid = key.decode()
                if value is None:
                    self.transactions.pop(tid, None)
                else:
                    self.transactions[tid] = TransactionMetadata.decode(tid, value)
