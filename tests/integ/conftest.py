"""Fixtures of the integration tests (tests/conftest.py has the clusters)."""

from __future__ import annotations

import pytest

from tests.integ.raw import Raw


@pytest.fixture
def raw(txn_cluster):
    """Hand-built gRPC calls to the full cluster (txn_cluster)."""
    with Raw(txn_cluster) as client:
        yield client


@pytest.fixture(scope="module")
def shared_raw(shared_txn_cluster):
    """Hand-built gRPC calls to the module's shared full cluster (shared_txn_cluster)."""
    with Raw(shared_txn_cluster) as client:
        yield client
