"""The producer fields a request names (services.coordination.producer_ids): proto3
optional so that absence shows; absent or contradictory is INVALID_REQUEST,
never producer 0 at epoch 0."""

import pytest

from services.coordination.producer_ids import named_producer, previous_producer
from txlog.protocol import PRODUCER_EPOCH_MAX
from txlog.protocol.errors import TxlogError
from txlog.v1 import coordinator_pb2, partition_pb2


@pytest.mark.parametrize("message", [coordinator_pb2.EndTxnRequest, coordinator_pb2.AddPartitionsToTxnRequest,
                                     coordinator_pb2.TransactionHandle, partition_pb2.TxnOffsetCommitRequest])
def test_a_transactional_request_names_its_producer_or_is_refused(message):
    assert named_producer(message(producer_id=0, producer_epoch=0), "X") == (0, 0)  # set to 0 is producer 0, present
    assert named_producer(message(producer_id=9, producer_epoch=PRODUCER_EPOCH_MAX), "X") == (9, PRODUCER_EPOCH_MAX)
    for fields, says in (({}, "producer_id and producer_epoch"), ({"producer_id": 9}, "producer_epoch"),
                         ({"producer_epoch": 1}, "producer_id"), ({"producer_id": -1, "producer_epoch": 0}, ">= 0"),
                         ({"producer_id": 1, "producer_epoch": PRODUCER_EPOCH_MAX + 1}, "0..")):
        with pytest.raises(TxlogError) as info:
            named_producer(message(**fields), "X")
        assert info.value.name == "INVALID_REQUEST" and says in info.value.message and info.value.message.startswith("X"), fields


def test_an_init_names_a_previous_producer_with_both_fields_or_neither():
    init = coordinator_pb2.InitProducerIdRequest
    assert previous_producer(init()) == (-1, -1)
    assert previous_producer(init(producer_id=-1, producer_epoch=-1)) == (-1, -1)
    assert previous_producer(init(producer_id=0, producer_epoch=0)) == (0, 0)
    for fields in ({"producer_id": 3}, {"producer_epoch": 3}, {"producer_id": -1, "producer_epoch": 2},
                   {"producer_id": 3, "producer_epoch": PRODUCER_EPOCH_MAX + 1}, {"producer_id": -2, "producer_epoch": -1}):
        with pytest.raises(TxlogError) as info:
            previous_producer(init(**fields))
        assert info.value.name == "INVALID_REQUEST", fields
