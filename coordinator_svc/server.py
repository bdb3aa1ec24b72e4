"""The gRPC face of coordinator_svc: one thin handler per RPC."""

from __future__ import annotations

import asyncio
import logging
import sys

from coordinator_svc.coordinator import TransactionCoordinator, error
from coordinator_svc.coordinator_config import CoordinatorConfig
from coordinator_svc.state_manager import ANSWERS_FROM_STATE
from coordinator_svc.transaction_state import Handle, TransactionMetadata, TransactionState
from services.coordination import coordinators
from services.coordination.peer_routes import PEER_ROUTES_SETTING, PeerRoutes
from services.coordination.producer_ids import ProducerIdSource, named_producer, previous_producer
from services.coordination.rpc import PeerClient, answer_of
from services.runtime import server
from services.runtime.config import Setting, positive_int
from txlog.protocol import PRODUCER_EPOCH_MAX, errors, names
from txlog.protocol.errors import TxlogError
from txlog.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc, partition_pb2

KIND = coordinators.COORDINATOR_KIND
KNOWN_STATES = frozenset(state.to_proto() for state in TransactionState)
SERVICE = coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"]
log = logging.getLogger(__name__)

SETTINGS = (
    Setting("listen", "0.0.0.0:7200", "host:port the gRPC server binds"),
    Setting("transaction_state_partitions", 8, "partition count of __transaction_state, set when it is first created", positive_int),
    Setting("transaction_timeout_ms_max", 900_000, "largest transaction timeout a producer may ask for, ms", positive_int),
    Setting("transactional_id_expiration_ms", 7 * 24 * 3600 * 1000, "idle transactional ids are removed after this long, ms", positive_int),
    Setting("prepared_transaction_timeout_ms", 24 * 3600 * 1000, "how long a prepared transaction may wait for its outcome before it is aborted, ms (default and largest allowed)", positive_int),
    Setting("transaction_check_interval_ms", 1_000, "how often timed-out transactions are aborted, idle ids expired and prepared transactions due a check-back checked, ms (the groups' own transaction.check.interval.ms is how long a prepared transaction waits for a check)", positive_int),
    Setting("transaction_checks_in_flight_max", 16, "most check-backs (CheckTransaction calls to applications) in flight at once on this coordinator; the due ones beyond wait", positive_int),
    Setting("ownership_check_interval_ms", 1_000, "how often partition ownership is checked against the live coordinators, ms", positive_int),
    PEER_ROUTES_SETTING,
)



def topic_partitions(partitions) -> list[tuple[str, int]]:
    return [(tp.topic, tp.partition) for tp in partitions]


def describe(meta: TransactionMetadata, check: tuple[int, int, int] = (0, 0, -1)) -> coordinator_pb2.TransactionDescription:
    """``check``: (checks done, last answer, next check time) when PREPARED (CheckBack.describe)."""
    prepared = meta.state is TransactionState.PREPARED
    checks_done, last_answer, next_check_ms = check if prepared else (0, 0, -1)
    return coordinator_pb2.TransactionDescription(
        transactional_id=meta.transactional_id,
        state=meta.state.to_proto(),
        producer_id=meta.producer_id,
        producer_epoch=meta.producer_epoch,
        transaction_timeout_ms=meta.txn_timeout_ms,
        transaction_start_time_ms=meta.txn_start_ms if meta.state in (TransactionState.ONGOING, TransactionState.PREPARED) or meta.state.is_preparing else -1,
        partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(meta.partitions)],
        prepared_time_ms=meta.prepared_ms if prepared else -1,
        prepared_timeout_ms=meta.prepared_timeout_ms if prepared else 0,
        prepare_metadata=meta.prepare_metadata if prepared else b"",
        checks_done=checks_done,
        last_check_answer=last_answer,
        next_check_time_ms=next_check_ms,
    )


def handle_of(proto: coordinator_pb2.TransactionHandle, rpc: str) -> Handle:
    return Handle(proto.transactional_id, *named_producer(proto, f"{rpc}'s handle"))


def decision_of(request, rpc: str) -> bool:
    """Commit (True) or abort: required, since a default would silently abort
    what the caller meant to commit and be answered just the same."""
    if not request.HasField("committed"):
        raise error("INVALID_REQUEST", f"{rpc} leaves out committed: say true to commit or false to abort")
    return request.committed


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServiceServicer):
    def __init__(self, coordinator: TransactionCoordinator, runtime: server.ServiceRuntime):
        self.coordinator = coordinator
        self.runtime = runtime

    @server.rpc_handler
    async def FindCoordinator(self, request, context):
        if request.key_type == coordinator_pb2.COORDINATOR_KEY_TYPE_TRANSACTION:
            names.check_transactional_id(request.key)
            await self.coordinator.state.ensure_log_topic()
            node_id, address, partition, epoch = await self.coordinator.state.owner_address(request.key)
            return coordinator_pb2.FindCoordinatorResponse(coordinator_id=node_id, address=address, partition=partition, coordinator_epoch=epoch)
        if request.key_type == coordinator_pb2.COORDINATOR_KEY_TYPE_GROUP:
            reply = await self.coordinator.client.call_any_partition_svc("Metadata", partition_pb2.MetadataRequest(group_ids=[request.key]))
            found = reply.group_coordinators[0]
            errors.check(found.error)
            return coordinator_pb2.FindCoordinatorResponse(coordinator_id=found.node_id, address=found.address)
        raise error("INVALID_REQUEST", f"unknown key_type {request.key_type}")

    @server.rpc_handler
    async def InitProducerId(self, request, context):
        previous_id, previous_epoch = previous_producer(request)
        producer_id, epoch = await self.coordinator.state.answer_as_owner(request.transactional_id, self.coordinator.handle_init_producer_id(
            request.transactional_id, request.transaction_timeout_ms, previous_id, previous_epoch
        ))
        return coordinator_pb2.InitProducerIdResponse(producer_id=producer_id, producer_epoch=epoch)

    @server.rpc_handler
    async def AddPartitionsToTxn(self, request, context):
        if not request.partitions:
            raise error("INVALID_REQUEST", "the request names no partition")
        results = await self.coordinator.state.answer_as_owner(request.transactional_id, self.coordinator.handle_add_partitions(
            request.transactional_id, *named_producer(request, "AddPartitionsToTxn"), topic_partitions(request.partitions), request.verify_only
        ))
        if any(problem is not None and problem.code in ANSWERS_FROM_STATE for problem in results.values()):
            await self.coordinator.state.confirm_ownership(request.transactional_id)
        reply = coordinator_pb2.AddPartitionsToTxnResponse()
        for (topic, partition), problem in results.items():
            result = reply.results.add(partition=common_pb2.TopicPartition(topic=topic, partition=partition))
            if problem is not None:
                result.error.CopyFrom(problem.to_proto())
        return reply

    @server.rpc_handler
    async def AddOffsetsToTxn(self, request, context):
        await self.coordinator.state.answer_as_owner(request.transactional_id, self.coordinator.handle_add_offsets(
            request.transactional_id, *named_producer(request, "AddOffsetsToTxn"), request.group_id))
        return coordinator_pb2.AddOffsetsToTxnResponse()

    @server.rpc_handler
    async def EndTxn(self, request, context):
        producer_id, epoch = await self.coordinator.state.answer_as_owner(request.transactional_id, self.coordinator.handle_end_txn(
            request.transactional_id, *named_producer(request, "EndTxn"), decision_of(request, "EndTxn")
        ))
        return coordinator_pb2.EndTxnResponse(producer_id=producer_id, producer_epoch=epoch)

    @server.rpc_handler
    async def ListTransactions(self, request, context):
        unknown = [s for s in request.state_filters if s not in KNOWN_STATES]
        if unknown or request.duration_filter_ms < 0:
            raise error("INVALID_REQUEST", "state_filters hold an unknown state" if unknown else "duration_filter_ms must not be negative")
        found = self.coordinator.state.list_local(
            {TransactionState.from_proto(s) for s in request.state_filters}, set(request.producer_id_filters), request.duration_filter_ms,
            request.transactional_id_prefix,
        )
        reply = coordinator_pb2.ListTransactionsResponse(
            transactions=[
                coordinator_pb2.TransactionListing(
                    transactional_id=m.transactional_id, producer_id=m.producer_id, state=m.state.to_proto(), producer_epoch=m.producer_epoch
                )
                for m in found
            ]
        )
        if not request.local_only:
            peers = self.coordinator.client
            local = request.__class__()
            local.CopyFrom(request)
            local.local_only = True
            for node_id, address in sorted((await peers.live(KIND)).items()):
                if node_id == self.runtime.config.node_id:
                    continue
                try:
                    other = await answer_of(lambda a=address: peers.coordinator_stub(a).ListTransactions(local))
                except TxlogError as exc:
                    raise error("COORDINATOR_NOT_AVAILABLE", f"coordinator {node_id} did not answer: {exc}") from None
                reply.transactions.extend(other.transactions)
        return reply

    @server.rpc_handler
    async def DescribeTransactions(self, request, context):
        reply = coordinator_pb2.DescribeTransactionsResponse()
        for transactional_id in request.transactional_ids:
            try:
                meta = self.coordinator.state.describe(transactional_id)
                loaded = self.coordinator.state.loaded_partition(transactional_id)
                reply.transactions.append(describe(meta, self.coordinator.check_back.describe(loaded, meta)))
            except TxlogError as exc:
                reply.transactions.add(transactional_id=transactional_id, error=exc.to_proto())
        return reply

    @server.rpc_handler
    async def AbortTransaction(self, request, context):
        tp = (request.partition.topic, request.partition.partition)
        named_producer(request, "AbortTransaction")
        if not request.HasField("coordinator_epoch") or request.coordinator_epoch < 0:
            raise error("INVALID_REQUEST", "AbortTransaction needs the coordinator_epoch DescribeProducers shows (>= 0)")
        names.check_topic_name(tp[0])
        leader = await self.coordinator.client.leader(*tp)
        # The request names the hanging transaction's own epoch (DescribeProducers shows it); a marker ends
        # only a transaction of a lower epoch, so it is written one above, as the coordinator's would be.
        marker = partition_pb2.TxnMarker(producer_id=request.producer_id, producer_epoch=min(request.producer_epoch + 1, PRODUCER_EPOCH_MAX),
                                         committed=False, coordinator_epoch=request.coordinator_epoch,
                                         partitions=[request.partition])
        # the leader went away or timed out: its error, not a stack trace
        reply = await answer_of(lambda: self.coordinator.client.stub(leader).WriteTxnMarkers(
            partition_pb2.WriteTxnMarkersRequest(markers=[marker])))
        errors.check(reply.markers[0].results[0].error)
        log.info("aborted a hanging transaction", extra={"fields": {"topic": tp[0], "partition": tp[1], "producer_id": request.producer_id}})
        return coordinator_pb2.AbortTransactionResponse()

    @server.rpc_handler
    async def PrepareTransaction(self, request, context):
        handle = await self.coordinator.state.answer_as_owner(request.transactional_id, self.coordinator.handle_prepare(
            request.transactional_id, *named_producer(request, "PrepareTransaction"), request.prepared_timeout_ms, request.prepare_metadata
        ))
        return coordinator_pb2.PrepareTransactionResponse(
            handle=coordinator_pb2.TransactionHandle(
                transactional_id=handle.transactional_id, producer_id=handle.producer_id, producer_epoch=handle.producer_epoch
            )
        )

    @server.rpc_handler
    async def CompleteTransaction(self, request, context):
        producer_id, epoch = await self.coordinator.state.answer_as_owner(
            request.handle.transactional_id,
            self.coordinator.handle_complete(handle_of(request.handle, "CompleteTransaction"), decision_of(request, "CompleteTransaction")))
        return coordinator_pb2.CompleteTransactionResponse(producer_id=producer_id, producer_epoch=epoch)

    @server.rpc_handler
    async def CommitTransactionGroup(self, request, context):
        await self.coordinator.state.answer_as_owner(
            request.group_id, self.coordinator.handle_commit_group(request.group_id, [handle_of(h, "CommitTransactionGroup") for h in request.handles]))
        return coordinator_pb2.CommitTransactionGroupResponse()

    # --- check-back (check_back.py) ------------------------------------------------------------

    @server.rpc_handler
    async def RegisterTransactionChecker(self, request, context):
        lease_ms = self.coordinator.check_back.register(request.group_id, request.address, request.lease_ms)
        return coordinator_pb2.RegisterTransactionCheckerResponse(lease_ms=lease_ms)

    @server.rpc_handler
    async def UnregisterTransactionChecker(self, request, context):
        self.coordinator.check_back.unregister(request.group_id, request.address)
        return coordinator_pb2.UnregisterTransactionCheckerResponse()

    @server.rpc_handler
    async def AlterTransactionGroupConfig(self, request, context):
        configs = await self.coordinator.alter_group_config(request.group_id, dict(request.set), list(request.delete))
        return coordinator_pb2.AlterTransactionGroupConfigResponse(configs=configs)

    @server.rpc_handler
    async def DescribeTransactionGroupConfig(self, request, context):
        config = self.coordinator.group_config(request.group_id)
        return coordinator_pb2.DescribeTransactionGroupConfigResponse(
            configs=config.configs(), overridden=sorted(config.overrides),
            checkers=[coordinator_pb2.RegisteredChecker(address=a, lease_remaining_ms=ms)
                      for a, ms in self.coordinator.check_back.checkers(request.group_id)],
        )


async def run_every(interval_ms: int, step, what: str) -> None:
    while True:
        try:
            await step()
        except TxlogError as exc:
            log.warning("%s: %s", what, exc)
        except Exception:
            log.exception("%s failed", what)
        await asyncio.sleep(interval_ms / 1000)


async def build(runtime: server.ServiceRuntime) -> CoordinatorServicer:
    cfg = runtime.config
    client = PeerClient(runtime.registry, tls_files=runtime.tls_files, routes=PeerRoutes(cfg.peer_routes_file))
    coordinator = TransactionCoordinator(
        CoordinatorConfig(
            cfg.node_id, cfg.zookeeper_root, cfg.transaction_state_partitions, cfg.transaction_timeout_ms_max,
            cfg.transactional_id_expiration_ms,
            prepared_transaction_timeout_ms=cfg.prepared_transaction_timeout_ms,
            checks_in_flight_max=cfg.transaction_checks_in_flight_max,
            ownership_lease_ms=min(3 * cfg.ownership_check_interval_ms + 1000, int(cfg.zookeeper_session_timeout_s * 1000 / 2)),
        ),
        runtime.zookeeper,
        runtime.registry,
        client,
        ProducerIdSource(client, requester_id=cfg.node_id),
        meter=runtime.metrics.meter,
    )
    servicer = CoordinatorServicer(coordinator, runtime)
    runtime.add_servicer(servicer, SERVICE)
    loops = [
        asyncio.ensure_future(run_every(cfg.ownership_check_interval_ms, coordinator.state.balance, "balancing transaction log partitions")),
        asyncio.ensure_future(run_every(cfg.transaction_check_interval_ms, coordinator.abort_timed_out, "aborting timed-out transactions")),
        asyncio.ensure_future(run_every(cfg.transaction_check_interval_ms, coordinator.check_back.check_due, "checking back prepared transactions")),
    ]

    async def close() -> None:
        for loop in loops:
            loop.cancel()
        await client.close()

    runtime.on_stop(close)
    return servicer


def main(argv=None) -> int:
    return server.run(KIND, "txlog transaction coordinator", SETTINGS, build, argv)


if __name__ == "__main__":
    sys.exit(main())
