"""Requests of the transactional protocol: one handler class per RPC
(InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn,
the two-phase PrepareTransaction, CompleteTransaction, CommitTransactionGroup,
and the check-back RegisterTransactionChecker, UnregisterTransactionChecker,
AlterTransactionGroupConfig, DescribeTransactionGroupConfig)
with ``create_request()`` and ``handle_response()``, and one driver,
:class:`CoordinatorClient`, that finds the coordinator, sends, and sorts every
failure in one place.

Guarantees
----------
* A request goes to the coordinator of the producer's transactional id
  (Metadata ``transaction_coordinators`` from any partition_svc; when that
  fails, FindCoordinator on a coordinator seen before; a request about a
  transaction group goes to the coordinator of the group's name, the same
  one), or, for TxnOffsetCommit, to the consumer group's coordinator (the partition_svc leading the
  group's ``__consumer_offsets`` partition).
* Every request the driver sends is safe to send again: the coordinator answers
  a retried EndTxn whose first attempt was applied with the same outcome and
  epoch, adding partitions or offsets twice adds them once, committing the
  same offsets twice stores them once, and a prepare, completion or group
  commit applied already is answered as applied; registering a checker again
  renews its lease, unregistering twice removes it once, and altering a
  group's settings twice sets the same values.
* The driver retries until the request succeeds, fails for good, or its caller
  stops it (``keep_going`` turns false: :class:`StopRetrying`; or the task is
  cancelled); each attempt is bounded by ``request_timeout_ms``.

Error Handling
--------------
Request-level failures and per-partition errors alike are sorted by
:func:`txlog.errors.txn_action_for`: FIND_COORDINATOR forgets the
coordinator's address, then backs off and retries; RETRY (CONCURRENT_TRANSACTIONS
above all) backs off and retries; FENCED raises
:class:`~txlog.errors.ProducerFencedError`; ABORTABLE and FATAL raise the
error as it came (typed by the registry: InvalidTxnStateError,
TransactionTimedOutError, ...). The caller moves the transaction state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from txlog.errors import (
    ClientError,
    ProducerFencedError,
    TxnAction,
    error_for,
    from_proto,
    txn_action_for,
)
from txlog.membership import GroupMetadata
from txlog.metadata import Metadata
from txlog.protocol.errors import ErrorCode
from txlog.protocol.retry import RetryPolicy
from txlog.structs import RegisteredChecker, TopicPartition, TransactionGroupConfig, TransactionHandle
from txlog.v1 import common_pb2, coordinator_pb2, partition_pb2

NONE = ErrorCode.Value("NONE")
PARTITIONS_PER_ADD_MAX = 1000  # partitions per AddPartitionsToTxn request
OFFSETS_PER_COMMIT_MAX = 100_000


class StopRetrying(Exception):  # noqa: N818 -- a signal, not an error
    """The driver's caller no longer wants the request (``keep_going()`` is false)."""


def fenced_error(transactional_id: str, producer_epoch: int, cause: ClientError) -> ProducerFencedError:
    """PRODUCER_FENCED / INVALID_PRODUCER_EPOCH, as the fatal error the producer raises from now on."""
    error = ProducerFencedError(
        ErrorCode.Value("PRODUCER_FENCED"),
        f"another producer with transactional id {transactional_id!r} has started (or the coordinator aborted "
        f"this producer's transaction), so epoch {producer_epoch} of this producer is fenced "
        f"({cause.name}: {cause.message}); this producer is a zombie: close it")
    error.__cause__ = cause
    return error


_SEVERITY = {TxnAction.FENCED: 4, TxnAction.FATAL: 3, TxnAction.ABORTABLE: 2, TxnAction.FIND_COORDINATOR: 1,
             TxnAction.RETRY: 0}


def worst(errors: Sequence[ClientError]) -> ClientError:
    """The error that decides a multi-partition answer: fenced, then fatal,
    then abortable, then retriable."""
    return max(errors, key=lambda e: _SEVERITY[txn_action_for(e.code)])


def _tps(tps: Sequence[TopicPartition]) -> list[common_pb2.TopicPartition]:
    return [common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in tps]


def _raise_partition_errors(results, wanted: Sequence[TopicPartition], rpc: str) -> None:
    """Raises the worst per-partition error of ``results`` (a missing result is retriable)."""
    answered = {}
    for result in results:
        answered[TopicPartition(result.partition.topic, result.partition.partition)] = result.error
    problems = [from_proto(answered[tp]) for tp in wanted if tp in answered and answered[tp].code != NONE]
    missing = [tp for tp in wanted if tp not in answered]
    if missing:
        problems.append(error_for(ErrorCode.Value("REQUEST_TIMED_OUT"), f"{rpc} answered nothing for {missing}"))
    if problems:
        raise worst(problems)


# --- one handler per RPC -------------------------------------------------------------------------


class TxnHandler:
    """A request to a coordinator: what to send and what the answer means."""

    rpc: str = ""
    group_id: str | None = None  # set: goes to the group's coordinator, not the transaction's
    # False: a fenced answer is the coordinator's own error, not "this producer is a
    # zombie" (the request names a handle, not the sender's producer).
    from_producer: bool = True

    def create_request(self):
        raise NotImplementedError

    def handle_response(self, response):
        """The result of a successful answer; raises a ClientError for per-item errors."""
        return response


class InitProducerIdHandler(TxnHandler):
    """Registers the producer; with its current id and epoch (KIP-360), bumps the epoch."""

    rpc = "InitProducerId"

    def __init__(self, transactional_id: str, transaction_timeout_ms: int, producer_id: int = -1,
                 producer_epoch: int = -1):
        self.request = coordinator_pb2.InitProducerIdRequest(
            transactional_id=transactional_id, transaction_timeout_ms=transaction_timeout_ms,
            producer_id=producer_id, producer_epoch=producer_epoch)

    def create_request(self):
        return self.request

    def handle_response(self, response) -> tuple[int, int]:
        return response.producer_id, response.producer_epoch


class AddPartitionsHandler(TxnHandler):
    """Adds partitions to the open transaction (all or, by the worst per-partition error, none)."""

    rpc = "AddPartitionsToTxn"

    def __init__(self, transactional_id: str, producer_id: int, producer_epoch: int, tps: Sequence[TopicPartition]):
        if not 0 < len(tps) <= PARTITIONS_PER_ADD_MAX:
            raise ValueError(f"an AddPartitionsToTxn request names 1 to {PARTITIONS_PER_ADD_MAX} partitions, "
                             f"not {len(tps)}")
        self.tps = list(tps)
        self.request = coordinator_pb2.AddPartitionsToTxnRequest(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
            partitions=_tps(self.tps))

    def create_request(self):
        return self.request

    def handle_response(self, response) -> list[TopicPartition]:
        _raise_partition_errors(response.results, self.tps, self.rpc)
        return self.tps


class AddOffsetsHandler(TxnHandler):
    """Adds the group's offsets partition to the open transaction."""

    rpc = "AddOffsetsToTxn"

    def __init__(self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str):
        self.request = coordinator_pb2.AddOffsetsToTxnRequest(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
            group_id=group_id)

    def create_request(self):
        return self.request

    def handle_response(self, response) -> None:
        return None


class TxnOffsetCommitHandler(TxnHandler):
    """Writes the group's offsets as part of the transaction (visible with its COMMIT)."""

    rpc = "TxnOffsetCommit"

    def __init__(self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str,
                 offsets: Mapping[TopicPartition, int], member: GroupMetadata | None = None):
        if not 0 < len(offsets) <= OFFSETS_PER_COMMIT_MAX:
            raise ValueError(f"send_offsets_to_transaction takes 1 to {OFFSETS_PER_COMMIT_MAX} offsets, "
                             f"not {len(offsets)}")
        self.group_id = group_id
        self.tps = sorted(offsets)
        self.request = partition_pb2.TxnOffsetCommitRequest(
            transactional_id=transactional_id, group_id=group_id, producer_id=producer_id,
            producer_epoch=producer_epoch,
            offsets=[partition_pb2.PartitionOffset(topic=tp.topic, partition=tp.partition, offset=offsets[tp])
                     for tp in self.tps])
        if member is not None and member.member_id:
            self.request.member_id, self.request.member_epoch = member.member_id, member.member_epoch

    def create_request(self):
        return self.request

    def handle_response(self, response) -> None:
        _raise_partition_errors(response.results, self.tps, self.rpc)


class EndTxnHandler(TxnHandler):
    """Commits or aborts the open transaction; answers the producer id and the bumped epoch."""

    rpc = "EndTxn"

    def __init__(self, transactional_id: str, producer_id: int, producer_epoch: int, committed: bool):
        self.request = coordinator_pb2.EndTxnRequest(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
            committed=committed)

    def create_request(self):
        return self.request

    def handle_response(self, response) -> tuple[int, int]:
        return response.producer_id, response.producer_epoch


class PrepareTransactionHandler(TxnHandler):
    """Moves the transaction (every record acknowledged) to Prepared; answers its
    handle. The request is built once: every attempt sends the same
    ``prepare_metadata`` (the coordinator refuses other bytes for a transaction
    prepared already)."""

    rpc = "PrepareTransaction"

    def __init__(self, transactional_id: str, producer_id: int, producer_epoch: int, prepared_timeout_ms: int,
                 prepare_metadata: bytes = b""):
        self.request = coordinator_pb2.PrepareTransactionRequest(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
            prepared_timeout_ms=prepared_timeout_ms, prepare_metadata=prepare_metadata)

    def create_request(self):
        return self.request

    def handle_response(self, response) -> TransactionHandle:
        h = response.handle
        return TransactionHandle(h.transactional_id, h.producer_id, h.producer_epoch)


def handle_proto(handle: TransactionHandle) -> coordinator_pb2.TransactionHandle:
    return coordinator_pb2.TransactionHandle(transactional_id=handle.transactional_id,
                                             producer_id=handle.producer_id, producer_epoch=handle.producer_epoch)


class CompleteTransactionHandler(TxnHandler):
    """Commits or aborts one prepared transaction by its handle."""

    rpc = "CompleteTransaction"
    from_producer = False

    def __init__(self, handle: TransactionHandle, committed: bool):
        self.request = coordinator_pb2.CompleteTransactionRequest(handle=handle_proto(handle), committed=committed)

    def create_request(self):
        return self.request

    def handle_response(self, response) -> tuple[int, int]:
        return response.producer_id, response.producer_epoch


class CommitTransactionGroupHandler(TxnHandler):
    """Commits prepared transactions of one group at once."""

    rpc = "CommitTransactionGroup"
    from_producer = False

    def __init__(self, group_id: str, handles: Sequence[TransactionHandle]):
        self.request = coordinator_pb2.CommitTransactionGroupRequest(
            group_id=group_id, handles=[handle_proto(h) for h in handles])

    def create_request(self):
        return self.request


# Check-back (issue 19): the transaction group's coordinator keeps its checkers
# and settings. Each request names a group, routed as a transactional id is.


class RegisterTransactionCheckerHandler(TxnHandler):
    """Registers, or renews, a checker's address for a transaction group;
    answers the lease granted, ms."""

    rpc = "RegisterTransactionChecker"
    from_producer = False

    def __init__(self, group_id: str, address: str, lease_ms: int):
        self.request = coordinator_pb2.RegisterTransactionCheckerRequest(group_id=group_id, address=address,
                                                                         lease_ms=lease_ms)

    def create_request(self):
        return self.request

    def handle_response(self, response) -> int:
        return response.lease_ms


class UnregisterTransactionCheckerHandler(TxnHandler):
    """Removes a checker's registration at once."""

    rpc = "UnregisterTransactionChecker"
    from_producer = False

    def __init__(self, group_id: str, address: str):
        self.request = coordinator_pb2.UnregisterTransactionCheckerRequest(group_id=group_id, address=address)

    def create_request(self):
        return self.request

    def handle_response(self, response) -> None:
        return None


class AlterTransactionGroupConfigHandler(TxnHandler):
    """Sets and deletes a transaction group's check-back settings; answers every
    setting afterwards. Sending it again sets the same values: safe to retry."""

    rpc = "AlterTransactionGroupConfig"
    from_producer = False

    def __init__(self, group_id: str, configs: Mapping[str, str], delete: Sequence[str]):
        self.request = coordinator_pb2.AlterTransactionGroupConfigRequest(group_id=group_id, set=configs,
                                                                          delete=delete)

    def create_request(self):
        return self.request

    def handle_response(self, response) -> dict[str, str]:
        return dict(sorted(response.configs.items()))


class DescribeTransactionGroupConfigHandler(TxnHandler):
    """A transaction group's settings, the keys set explicitly, and its checkers."""

    rpc = "DescribeTransactionGroupConfig"
    from_producer = False

    def __init__(self, group_id: str):
        self.group = group_id
        self.request = coordinator_pb2.DescribeTransactionGroupConfigRequest(group_id=group_id)

    def create_request(self):
        return self.request

    def handle_response(self, response) -> TransactionGroupConfig:
        return TransactionGroupConfig(
            self.group, dict(sorted(response.configs.items())), tuple(sorted(response.overridden)),
            tuple(RegisteredChecker(c.address, c.lease_remaining_ms) for c in response.checkers))


# --- the driver ------------------------------------------------------------------------------------


class CoordinatorClient:
    """Sends a transactional producer's coordinator requests; runs on the producer's loop."""

    def __init__(self, metadata: Metadata, transport, transactional_id: str, *, request_timeout_ms: float,
                 backoff: RetryPolicy):
        self._metadata = metadata
        self._transport = transport
        self.transactional_id = transactional_id
        self._request_timeout_ms = request_timeout_ms
        self._backoff = backoff
        self._last_address: str | None = None
        self.attempts = 0  # every attempt of every request, for tests and operators

    async def _address(self, handler: TxnHandler) -> str:
        if handler.group_id is not None:
            return await self._metadata.group_coordinator(handler.group_id)
        try:
            address = await self._metadata.transaction_coordinator(self.transactional_id)
        except ClientError as exc:
            if not exc.retriable:
                raise
            address = await self._find_coordinator(exc)
        self._last_address = address
        return address

    async def _find_coordinator(self, cause: ClientError) -> str:
        """Asks a coordinator seen before (any one answers FindCoordinator)."""
        known = self._metadata.known_transaction_coordinators()
        if self._last_address is not None and self._last_address not in known:
            known.append(self._last_address)
        request = coordinator_pb2.FindCoordinatorRequest(
            key=self.transactional_id, key_type=coordinator_pb2.COORDINATOR_KEY_TYPE_TRANSACTION)
        for address in known:
            try:
                response = await self._transport.call(address, "FindCoordinator", request,
                                                      timeout_ms=self._request_timeout_ms)
            except ClientError:
                continue
            if response.address:
                return response.address
        raise cause

    def _forget(self, handler: TxnHandler) -> None:
        if handler.group_id is not None:
            self._metadata.forget_group_coordinator(handler.group_id)
        else:
            self._metadata.forget_transaction_coordinator(self.transactional_id)

    async def send(self, handler: TxnHandler, *, producer_epoch: int,
                   keep_going: Callable[[], bool] = lambda: True):
        """Sends ``handler``'s request until it succeeds (its result), fails for
        good (ProducerFencedError, or the abortable or fatal error), or
        ``keep_going()`` turns false (StopRetrying)."""
        attempt = 0
        while True:
            if not keep_going():
                raise StopRetrying(handler.rpc)
            attempt += 1
            self.attempts += 1
            try:
                address = await self._address(handler)
                response = await self._transport.call(address, handler.rpc, handler.create_request(),
                                                      timeout_ms=self._request_timeout_ms)
                return handler.handle_response(response)
            except ClientError as exc:
                action = txn_action_for(exc.code)
                if action is TxnAction.FENCED and handler.from_producer:
                    raise fenced_error(self.transactional_id, producer_epoch, exc) from exc
                if not action.retries:
                    raise
                if action is TxnAction.FIND_COORDINATOR:
                    self._forget(handler)
                delay_ms = max(self._backoff.delay_ms(attempt), min(exc.retry_delay_ms or 0,
                                                                    self._backoff.backoff_max_ms))
                await asyncio.sleep(delay_ms / 1000)
