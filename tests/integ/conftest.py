"""Fixtures of the integration tests (tests/conftest.py has the clusters)."""

from __future__ import annotations

import pytest
from raw import Raw


@pytest.fixture
def raw(txn_cluster):
    """Hand-built gRPC calls to the full cluster (txn_cluster)."""
    client = Raw(txn_cluster)
    yield client
    client.close()
