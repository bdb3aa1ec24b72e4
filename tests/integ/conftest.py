"""Fixtures of the integration tests (tests/conftest.py has the clusters)."""

from __future__ import annotations

import pytest
from raw import Raw


def raw_client(cluster):
    client = Raw(cluster)
    yield client
    client.close()


@pytest.fixture
def raw(txn_cluster):
    """Hand-built gRPC calls to the full cluster (txn_cluster)."""
    yield from raw_client(txn_cluster)


@pytest.fixture(scope="module")
def shared_raw(shared_txn_cluster):
    """Hand-built gRPC calls to the module's shared full cluster (shared_txn_cluster)."""
    yield from raw_client(shared_txn_cluster)
