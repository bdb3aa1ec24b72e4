"""The replication factor the internal topics are created with (cluster_view.internal_replication_factor)."""

from __future__ import annotations

import pytest

from partition_svc.cluster_view import INTERNAL_REPLICATION_FACTOR_AUTO_MAX, internal_replication_factor
from txlog.protocol.errors import ErrorCode, TxlogError


@pytest.mark.parametrize("live", [1, 2, 3, 5])
def test_a_set_factor_is_taken_whole_once_that_many_instances_are_live(live):
    assert internal_replication_factor(min(live, 3), live, "__transaction_state") == min(live, 3)


@pytest.mark.parametrize(("configured", "live"), [(3, 1), (3, 2), (2, 1)])
def test_a_set_factor_is_refused_retriably_while_fewer_instances_are_live(configured, live):
    """Never fewer replicas than asked: instances that come up one at a time would leave the transaction log on one."""
    with pytest.raises(TxlogError) as refused:
        internal_replication_factor(configured, live, "__consumer_offsets")
    assert refused.value.code == ErrorCode.Value("COORDINATOR_NOT_AVAILABLE")
    assert refused.value.retriable
    assert f"{configured} partition_svc instances" in refused.value.message and f"{live} are" in refused.value.message
    assert "__consumer_offsets" in refused.value.message


@pytest.mark.parametrize(("live", "expected"), [(1, 1), (2, 2), (3, 3), (7, INTERNAL_REPLICATION_FACTOR_AUTO_MAX)])
def test_zero_takes_the_live_instances_up_to_three(live, expected):
    assert internal_replication_factor(0, live, "__transaction_state") == expected
