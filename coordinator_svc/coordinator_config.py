"""A coordinator's settings, as its server reads them (server.py's SETTINGS)
and the state manager, the coordinator and the check-back use them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CoordinatorConfig:
    node_id: int
    zookeeper_root: str
    transaction_state_partitions: int
    transaction_timeout_ms_max: int
    transactional_id_expiration_ms: int
    ownership_lease_ms: int = 3_000
    prepared_transaction_timeout_ms: int = 24 * 3600 * 1000
    checks_in_flight_max: int = 16
