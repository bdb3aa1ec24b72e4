"""Loading a transaction-log partition: each key's latest value in a response, decoded once, taken in log order."""

from __future__ import annotations

import json

from coordinator_svc.transaction_state import GroupDecision, Handle, TransactionMetadata, TransactionRecord
from coordinator_svc.txn_log import FENCE_KEY, GROUP_CONFIG_KEY_PREFIX, LogContents, decision_key
from txlog.protocol import TransactionState as S


def record(tid: str, state: S, epoch: int, **changes) -> TransactionRecord:
    fields = dict(transactional_id=tid, producer_id=7, previous_producer_id=-1, producer_epoch=epoch, last_producer_epoch=-1,
                  txn_timeout_ms=60_000, state=state, partitions=frozenset(), txn_start_ms=1, last_update_ms=2)
    return TransactionRecord(**{**fields, **changes})


def test_each_id_loads_from_its_latest_record_and_a_tombstone_removes_it():
    log = [(b"a", record("a", S.EMPTY, 0).encode()),
           (b"b", record("b", S.EMPTY, 0).encode()),
           (b"a", record("a", S.ONGOING, 0, partitions=frozenset({("t", 1)})).encode()),
           (FENCE_KEY, b"3"),
           (b"b", None),
           (b"a", record("a", S.PREPARED, 1, prepared_ms=5, prepared_timeout_ms=9, prepare_metadata=b"\x00k").encode())]
    latest: dict[bytes, bytes | None] = {}
    for key, value in log:
        latest[key] = value
    contents = loaded_from([latest])
    assert list(contents.transactions) == ["a"] and (contents.decisions, contents.group_configs) == ({}, {})
    loaded = contents.transactions["a"]
    assert isinstance(loaded, TransactionMetadata) and loaded.pending_state is None
    assert loaded.record() == record("a", S.PREPARED, 1, prepared_ms=5, prepared_timeout_ms=9, prepare_metadata=b"\x00k")


def test_decisions_and_group_settings_load_by_their_key_prefix_and_leave_with_a_tombstone():
    kept = GroupDecision("d1", "g", (Handle("a", 7, 1),), 10)
    latest = {decision_key("d1"): kept.encode(),
              decision_key("d2"): None,
              GROUP_CONFIG_KEY_PREFIX + b"g": json.dumps({"transaction.check.max": "3"}).encode(),
              GROUP_CONFIG_KEY_PREFIX + b"h": None}
    contents = loaded_from([latest])
    assert contents.transactions == {}
    assert contents.decisions == {"d1": kept}
    assert contents.group_configs == {"g": {"transaction.check.max": "3"}}


def test_a_later_response_replaces_or_removes_what_an_earlier_one_loaded():
    decision = GroupDecision("d1", "g", (Handle("b", 7, 1),), 10)
    first = {b"a": record("a", S.ONGOING, 0).encode(), b"b": record("b", S.EMPTY, 0).encode(),
             decision_key("d1"): decision.encode(), GROUP_CONFIG_KEY_PREFIX + b"g": b'{"transaction.check.max": "3"}'}
    second = {b"a": record("a", S.COMPLETE_COMMIT, 1).encode(), b"b": None, decision_key("d1"): None,
              GROUP_CONFIG_KEY_PREFIX + b"g": None}
    contents = loaded_from([first, second])
    assert list(contents.transactions) == ["a"] and contents.transactions["a"].state is S.COMPLETE_COMMIT
    assert (contents.decisions, contents.group_configs) == ({}, {})


def loaded_from(responses: list[dict[bytes, bytes | None]]) -> LogContents:
    contents = LogContents()
    for latest in responses:
        contents.take(latest)
    return contents


def test_metadata_decoded_directly_equals_the_record_path():
    stored = record("x", S.COMPLETE_COMMIT, 4, partitions=frozenset({("t", 0), ("u", 2)}), checks_done=2, last_check_ms=8)
    direct = TransactionMetadata.decode("x", stored.encode())
    assert direct == TransactionMetadata.from_record(TransactionRecord.decode("x", stored.encode()))
    assert direct.record() == stored
