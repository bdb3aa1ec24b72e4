import pytest

from producer_id_svc.core import (
    PRODUCER_ID_MAX,
    REQUESTER_ID_MAX,
    ProducerIdBlock,
    check_requester_id,
    next_block,
)
from txlog.protocol.errors import ErrorCode, TxlogError


def test_first_block_starts_at_zero_and_holds_block_size_ids():
    block = next_block(None, requester_id=3, block_size=1000)
    assert (block.block_start, block.block_end, block.size, block.requester_id) == (0, 999, 1000, 3)


def test_each_block_starts_right_after_the_latest():
    latest = ProducerIdBlock(1, 5000, 5999)
    block = next_block(latest, requester_id=2, block_size=1000)
    assert (block.block_start, block.block_end) == (6000, 6999)


def test_exhaustion_is_a_clear_error():
    latest = ProducerIdBlock(1, PRODUCER_ID_MAX - 1500, PRODUCER_ID_MAX - 501)
    with pytest.raises(TxlogError) as info:
        next_block(latest, requester_id=1, block_size=1000)
    assert info.value.code == ErrorCode.Value("PRODUCER_IDS_EXHAUSTED")
    assert "used up" in info.value.message


def test_the_last_block_may_end_exactly_at_the_maximum():
    latest = ProducerIdBlock(1, 0, PRODUCER_ID_MAX - 1000)
    assert next_block(latest, 1, 1000).block_end == PRODUCER_ID_MAX


def test_node_encoding_round_trips():
    block = ProducerIdBlock(7, 123000, 123999)
    assert ProducerIdBlock.decode(block.encode()) == block


@pytest.mark.parametrize(
    "data",
    [b"", b"not json", b"[]", b'{"version": 2, "requester": 1, "block_start": 0, "block_end": 9}',
     b'{"version": 1, "requester": 1, "block_start": 0}', b'{"version": 1, "requester": 1, "block_start": 10, "block_end": 9}',
     b"\xff\xfe"],
)
def test_a_node_that_is_not_a_block_is_rejected(data):
    with pytest.raises(ValueError):
        ProducerIdBlock.decode(data)


@pytest.mark.parametrize("requester_id", [-1, REQUESTER_ID_MAX + 1, 2**62])
def test_requester_ids_out_of_range_are_invalid(requester_id):
    with pytest.raises(TxlogError) as info:
        check_requester_id(requester_id)
    assert info.value.code == ErrorCode.Value("INVALID_REQUEST")
    assert str(requester_id) in info.value.message


def test_requester_ids_in_range_pass():
    assert check_requester_id(0) == 0 and check_requester_id(REQUESTER_ID_MAX) == REQUESTER_ID_MAX
