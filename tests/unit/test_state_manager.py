"""The coordinator's state manager (coordinator_svc/state_manager.py) without
ZooKeeper or a log: which partition serves an id, and the ownership lease,
on an injected monotonic clock. The transaction log is a stand-in holding only
the ``broken`` flag the manager reads (the log itself is not under test)."""

from dataclasses import dataclass

import pytest

from coordinator_svc.coordinator_config import CoordinatorConfig
from coordinator_svc.state_manager import LoadedPartition, TransactionStateManager
from coordinator_svc.transaction_state import TransactionMetadata
from services.coordination import coordinators
from txlog.protocol import TransactionState as S
from txlog.protocol.errors import TxlogError

CONFIG = CoordinatorConfig(node_id=1, zookeeper_root="/txlog", transaction_state_partitions=4, transaction_timeout_ms_max=60_000,
                           transactional_id_expiration_ms=10**9, ownership_lease_ms=3_000)
TID = "app-1"


@dataclass
class LogStandIn:
    broken: str | None = None


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def manager(clock):
    state = TransactionStateManager(CONFIG, None, None, None, None, on_loaded=None, clock_ms=lambda: 1_000,
                                    monotonic=clock)  # nothing is loaded here
    state.partition_count = 4
    return state


def serve(manager, clock, *, loaded=True) -> LoadedPartition:
    index = coordinators.transaction_log_partition(TID, 4)
    partition = LoadedPartition(index, coordinators.PartitionOwner(1, 5, 900), LogStandIn(), loaded=loaded, confirmed_s=clock.now)
    manager.partitions[index] = partition
    return partition


def code(call) -> str:
    with pytest.raises(TxlogError) as info:
        call()
    return info.value.name


def test_an_id_is_served_only_by_its_loaded_confirmed_partition(manager, clock):
    assert code(lambda: manager.loaded_partition(TID)) == "NOT_COORDINATOR"  # not ours
    partition = serve(manager, clock, loaded=False)
    assert code(lambda: manager.loaded_partition(TID)) == "COORDINATOR_LOAD_IN_PROGRESS"
    partition.loaded = True
    assert manager.loaded_partition(TID) is partition
    partition.log.broken = "a write failed"
    assert code(lambda: manager.loaded_partition(TID)) == "NOT_COORDINATOR"


def test_the_lease_ends_when_zookeeper_has_not_confirmed_ownership_for_its_length(manager, clock):
    partition = serve(manager, clock)
    clock.now += 2.9
    assert manager.loaded_partition(TID) is partition
    clock.now += 0.2  # 3.1 s since the last confirmation: a paused coordinator stops answering
    assert code(lambda: manager.loaded_partition(TID)) == "NOT_COORDINATOR"
    partition.confirmed_s = clock.now  # a balance round confirmed it again
    assert manager.loaded_partition(TID) is partition


def test_without_the_log_topic_nothing_is_served_and_loading_partitions_block_listings(manager, clock):
    manager.partition_count = None
    assert code(lambda: manager.partition_of(TID)) == "COORDINATOR_NOT_AVAILABLE"
    manager.partition_count = 4
    partition = serve(manager, clock, loaded=False)
    assert code(lambda: manager.list_local(set(), set(), 0)) == "COORDINATOR_LOAD_IN_PROGRESS"
    partition.loaded = True
    partition.transactions[TID] = TransactionMetadata(TID, 7, 0, 60_000, state=S.ONGOING, txn_start_ms=0)
    partition.transactions["other"] = TransactionMetadata("other", 8, 0, 60_000)
    assert [m.transactional_id for m in manager.list_local({S.ONGOING}, set(), 0)] == [TID]
    assert [m.transactional_id for m in manager.list_local(set(), {8}, 0)] == ["other"]
    assert manager.describe(TID).producer_id == 7
    neighbour = next(f"app-{n}" for n in range(2, 100) if coordinators.transaction_log_partition(f"app-{n}", 4) == partition.index)
    assert code(lambda: manager.describe(neighbour)) == "TRANSACTIONAL_ID_NOT_FOUND"  # served here, never seen
