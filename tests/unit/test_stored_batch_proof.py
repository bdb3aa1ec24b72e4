"""Reads of the log skip RocksDB's checksums (log_store.LogStore.batches_holding):
a batch in the encoded format proves itself by its CRC32C and by a stored header that
agrees with its own; any other value is read again with RocksDB's checksums. Damage on
disk is still CORRUPT_MESSAGE, whichever the form; a follower stores no damaged batch.

Real RocksDB files throughout; the damage is a byte flipped in the blob file."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_partition_replication import CONFIGS, FOLLOWER

from partition_svc import log_format
from partition_svc.log_format import DamagedBatch, decode_header, prove_encoded
from partition_svc.log_store import GroupCommitWriter, LogStore
from partition_svc.partition import Partition
from partition_svc.replication import ReplicationServicer
from txlog.protocol import batch_format
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.protocol.leader_epochs import LeaderEpochCache
from txlog.v1 import common_pb2, replication_pb2

NOW = 1_700_000_000_000
PRODUCER, EPOCH = 7, 2


def records(marker: bytes, count: int = 5) -> common_pb2.RecordBatch:
    """``count`` records of 1 KB carrying ``marker`` (found again in the blob file): past the store's blob threshold."""
    return common_pb2.RecordBatch(records=[common_pb2.Record(value=marker + bytes([i]) * 1000, timestamp_ms=NOW) for i in range(count)])


def encoded_value(base: int, marker: bytes = b"ENCODED-MARK", count: int = 5, transactional: bool = False) -> bytes:
    data = batch_format.encode(records(marker, count).SerializeToString(), count, producer_id=PRODUCER, producer_epoch=EPOCH,
                               base_sequence=0, transactional=transactional, max_timestamp_ms=NOW, base_offset=base,
                               log_append_time_ms=NOW)
    flags = log_format.FLAG_ENCODED | (log_format.FLAG_TRANSACTIONAL if transactional else 0)
    return log_format.encode_batch_parts(base + count - 1, NOW, PRODUCER, EPOCH, flags, count, [data])


def message_value(base: int, marker: bytes = b"MESSAGE-MARK", count: int = 5) -> bytes:
    return log_format.encode_batch(base + count - 1, NOW, -1, -1, 0, count, records(marker, count).SerializeToString())


def flipped(value: bytes, at: int) -> bytes:
    return value[:at] + bytes([value[at] ^ 0x40]) + value[at + 1:]


# --- the proof itself ----------------------------------------------------------------------------

def check_encoded(base_offset: int, value: bytes) -> None:
    prove_encoded(decode_header(base_offset, value), value)


def test_an_encoded_value_as_stored_proves_itself():
    check_encoded(10, encoded_value(10))
    check_encoded(10, encoded_value(10, transactional=True))


@pytest.mark.parametrize(("what", "damage", "said"), [
    ("a record byte", lambda v: flipped(v, len(v) - 300), "CRC32C"),
    ("the producer's epoch in the batch", lambda v: flipped(v, log_format.BATCH_HEADER.size + 47), "CRC32C"),
    ("the stored last offset", lambda v: flipped(v, 7), "its stored header says"),
    ("the stored record count", lambda v: flipped(v, log_format.BATCH_HEADER.size - 1), "its stored header says"),
    ("the base offset the leader wrote (outside the CRC)", lambda v: flipped(v, log_format.BATCH_HEADER.size + 7),
     "its stored header says"),
])
def test_damage_anywhere_a_reader_relies_on_is_found(what, damage, said):
    with pytest.raises(DamagedBatch, match=said):
        check_encoded(10, damage(encoded_value(10)))


def test_a_value_read_under_another_key_is_found():
    with pytest.raises(DamagedBatch, match="its stored header says"):
        check_encoded(15, encoded_value(10))


# --- through the store, damaged on disk -----------------------------------------------------------

def stored_then_damaged(path: Path, damaged: set[bytes]) -> tuple[LogStore, bytes]:
    """A store holding an encoded batch at 0 and a message batch at 5, its values in a blob
    file on disk, and a byte flipped inside the values whose marker is in ``damaged``."""
    pkey = log_format.partition_key("t", 0)
    store = LogStore(str(path))
    store.write([(log_format.log_key(pkey, 0), encoded_value(0)), (log_format.log_key(pkey, 5), message_value(5))])
    store.db.flush()
    store.close()
    blobs = list(path.glob("*.blob"))
    assert len(blobs) == 1, blobs
    data = bytearray(blobs[0].read_bytes())
    for marker in damaged:
        at = data.index(marker) + len(marker) + 500
        data[at] ^= 0x40
    blobs[0].write_bytes(bytes(data))
    return LogStore(str(path)), pkey


def test_an_undamaged_store_reads_both_forms(tmp_path):
    store, pkey = stored_then_damaged(tmp_path / "db", set())
    try:
        assert list(store.batches_holding(pkey, 0)) == [(0, encoded_value(0)), (5, message_value(5))]
    finally:
        store.close()


@pytest.mark.parametrize("marker", [b"ENCODED-MARK", b"MESSAGE-MARK"])
def test_a_batch_damaged_on_disk_is_corrupt_message_in_either_form(tmp_path, marker):
    store, pkey = stored_then_damaged(tmp_path / "db", {marker})
    try:
        start = 0 if marker == b"ENCODED-MARK" else 5
        with pytest.raises(TxlogError) as failure:
            list(store.batches_holding(pkey, start))
        assert failure.value.code == ErrorCode.Value("CORRUPT_MESSAGE")
        assert f"the batch stored at offset {start} is damaged" in failure.value.message
    finally:
        store.close()


def test_a_follower_stores_no_damaged_batch(tmp_path):
    async def scenario():
        store = LogStore(str(tmp_path / "follower"))
        follower = Partition("t", 0, CONFIGS, store, GroupCommitWriter(store), node_id=FOLLOWER, sole_replica=False)
        try:
            with pytest.raises(DamagedBatch):
                follower.append_replicated([(0, 0, flipped(encoded_value(0), 4000))], 5)
            assert follower.next_offset == 0 and list(store.batches_holding(follower.pkey, 0)) == []
            with pytest.raises(DamagedBatch):  # the second of two damaged: the first is not taken either
                follower.append_replicated([(0, 0, encoded_value(0)), (5, 0, flipped(encoded_value(5), 4000))], 10)
            assert follower.next_offset == 0 and follower.size_bytes == 0 and list(store.batches_holding(follower.pkey, 0)) == []
            written = follower.append_replicated([(0, 0, encoded_value(0))], 5)
            await written
            assert follower.next_offset == 5
        finally:
            await follower.queue.writer.drain()
            store.close()

    asyncio.run(scenario())


def test_a_damaged_batch_is_its_partitions_answer_in_a_replica_fetch_not_the_whole_fetchs(tmp_path):
    """The leader's side of a follower's fetch: a partition whose batch does not prove itself (damaged
    before RocksDB stored it, so RocksDB's checksums hold) answers CORRUPT_MESSAGE; the other
    partition of the same fetch is answered its batches. The partitions are stand-ins over a real
    store (what the replica fetch reads of them: the store, the offsets, the epochs)."""
    store = LogStore(str(tmp_path / "leader"))
    good, bad = log_format.partition_key("t", 0), log_format.partition_key("t", 1)
    store.write([(log_format.log_key(good, 0), encoded_value(0)), (log_format.log_key(bad, 0), flipped(encoded_value(0), 4000))])

    def partition(pkey: bytes, index: int) -> SimpleNamespace:
        return SimpleNamespace(store=store, pkey=pkey, topic="t", index=index, written_end=5, high_watermark=5, marker_end=5,
                               log_start_offset=0, epochs=LeaderEpochCache([(0, 0)]))

    try:
        leading = [(replication_pb2.ReplicaFetchPartition(topic="t", partition=i, fetch_offset=0), partition(pkey, i), None)
                   for i, pkey in ((0, good), (1, bad))]
        reply, answered = ReplicationServicer(None, 0)._collect(leading, 0)
        results = {r.partition: r for r in replication_pb2.ReplicaFetchResponse.FromString(reply).results}
        assert answered and [b.value for b in results[0].batches] == [encoded_value(0)] and not results[0].HasField("error")
        assert ErrorCode.Name(results[1].error.code) == "CORRUPT_MESSAGE" and not results[1].batches
        assert "the batch stored at offset 0 is damaged" in results[1].error.message
    finally:
        store.close()
