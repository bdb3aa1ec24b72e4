"""Check-back rules, pure: a transaction group's settings, when a prepared
transaction is due a check, what a checker's answer does, and the checkers
registered for a group. No I/O; time is passed in. check_back.py carries the
checks out.

A prepared transaction (PREPARED) whose owner has not completed it is checked
``transaction.check.interval.ms`` after it was prepared, then that long after
each check that decided nothing, up to ``transaction.check.max`` checks; then
the group's ``transaction.check.exhausted`` policy applies (abort, or keep it
PREPARED until its prepared timeout). Each due time carries a jitter of up to a
tenth of the interval, fixed by the id and the check's number, so transactions
prepared in the same moment (a crashed owner's batch) are not all checked in
the same moment, and a restarted coordinator computes the same times.

Answers
-------
- COMMIT / ABORT: exactly CompleteTransaction with the checked handle
  (transaction_core.decide_complete): the same fencing (a handle whose epoch is
  no longer the prepared one is refused and nothing changes), the same
  idempotence (a late answer agreeing with what was decided is a repeat).
- UNKNOWN (also an error, an unset answer, no answer, no reachable checker):
  one attempt, recorded durably (PREPARED -> PREPARED with the count), so a
  coordinator failover neither forgets the count nor checks ahead of time; the
  attempt that reaches the maximum applies the exhausted policy.
- With no checker registered for the group, nothing is checked and nothing is
  counted: a group that does not use the check-back keeps the prepared timeout.
"""

from __future__ import annotations

import enum
import ipaddress
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType

from coordinator_svc import transaction_core as core
from coordinator_svc import transaction_state as ts
from coordinator_svc.transaction_state import Handle, TransactionMetadata, TransactionState
from txlog.protocol.names import quoted

S = TransactionState
error = core.error

CHECK_INTERVAL_MS = "transaction.check.interval.ms"
CHECK_MAX = "transaction.check.max"
CHECK_EXHAUSTED = "transaction.check.exhausted"
CHECK_TIMEOUT_MS = "transaction.check.timeout.ms"
EXHAUSTED_POLICIES = ("abort", "keep")
PREPARE_METADATA_BYTES_MAX = 4096
JITTER_FRACTION = 10  # a due time moves by up to interval / 10


def _bounded_int(low: int, high: int):
    def parse(key: str, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise error("INVALID_CONFIG", f"{key} must be an integer, got {quoted(text)}") from None
        if not low <= value <= high:
            raise error("INVALID_CONFIG", f"{key} must be {low:,}..{high:,}, got {value:,}")
        return value
    return parse


def _policy(key: str, text: str) -> str:
    if text not in EXHAUSTED_POLICIES:
        raise error("INVALID_CONFIG", f"{key} must be one of {', '.join(EXHAUSTED_POLICIES)}, got {quoted(text)}")
    return text


# key -> (parser, default)
SETTINGS = {
    CHECK_INTERVAL_MS: (_bounded_int(100, 86_400_000), "60000"),
    CHECK_MAX: (_bounded_int(1, 1_000), "15"),
    CHECK_EXHAUSTED: (_policy, "abort"),
    CHECK_TIMEOUT_MS: (_bounded_int(100, 60_000), "5000"),
}


@dataclass(frozen=True)
class GroupCheckConfig:
    """A transaction group's check-back settings; ``overrides`` are the keys set explicitly."""

    overrides: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self):  # parsed once: every check round reads them for every prepared transaction
        values = {key: parse(key, self.overrides.get(key, default)) for key, (parse, default) in SETTINGS.items()}
        object.__setattr__(self, "_values", values)

    def value(self, key: str):
        return self._values[key]

    @property
    def interval_ms(self) -> int:
        return self.value(CHECK_INTERVAL_MS)

    @property
    def check_max(self) -> int:
        return self.value(CHECK_MAX)

    @property
    def keep_when_exhausted(self) -> bool:
        return self.value(CHECK_EXHAUSTED) == "keep"

    @property
    def timeout_ms(self) -> int:
        return self.value(CHECK_TIMEOUT_MS)

    def configs(self) -> dict[str, str]:
        """Every key, defaults included."""
        return {key: self.overrides.get(key, default) for key, (_, default) in SETTINGS.items()}


DEFAULT_CONFIG = GroupCheckConfig()


def listed(keys: list[str], shown_max: int = 3) -> str:
    """Keys for a message: a few, each shortened (a hostile request may name thousands, each huge)."""
    more = f" and {len(keys) - shown_max:,} more" if len(keys) > shown_max else ""
    return "[" + ", ".join(quoted(k) for k in keys[:shown_max]) + "]" + more


def altered(config: GroupCheckConfig, to_set: dict[str, str], to_delete: list[str]) -> GroupCheckConfig:
    """The config after a change; INVALID_CONFIG (nothing changes) for an unknown
    key, a bad value, or a key both set and deleted."""
    unknown = sorted(k for k in [*to_set, *to_delete] if k not in SETTINGS)
    if unknown:
        raise error("INVALID_CONFIG", f"unknown transaction group setting(s) {listed(unknown)}: the settings are {sorted(SETTINGS)}")
    both = sorted(set(to_set) & set(to_delete))
    if both:
        raise error("INVALID_CONFIG", f"{listed(both)} both set and deleted in one change")
    parsed = {key: str(SETTINGS[key][0](key, text)) for key, text in to_set.items()}  # kept as used: " 15", "1_5" are 15
    overrides = {k: v for k, v in config.overrides.items() if k not in to_delete}
    overrides.update(parsed)
    return GroupCheckConfig(MappingProxyType(dict(sorted(overrides.items()))))


class CheckAnswer(enum.Enum):
    COMMIT = "COMMIT"
    ABORT = "ABORT"
    UNKNOWN = "UNKNOWN"


def next_check_ms(meta: TransactionMetadata, config: GroupCheckConfig) -> int | None:
    """When ``meta``'s prepared transaction is due its next check (or, its checks
    exhausted under the abort policy, its abort); None when nothing is due ever:
    not PREPARED, a transition in flight, or exhausted under the keep policy."""
    if meta.pending_state is not None:
        return None
    return check_due_ms(meta, config)


def check_due_ms(meta: TransactionMetadata, config: GroupCheckConfig) -> int | None:
    """:func:`next_check_ms` of the state ``meta`` is in, whatever transition is
    in flight: the due time the coordinator's index keeps for it (a transition
    that is abandoned leaves the id as it was, due then)."""
    if meta.state is not S.PREPARED:
        return None
    anchor = meta.last_check_ms if meta.checks_done else meta.prepared_ms
    if meta.checks_done >= config.check_max:
        return None if config.keep_when_exhausted else anchor
    interval = config.interval_ms
    jitter = zlib.crc32(f"{meta.transactional_id}#{meta.checks_done}".encode()) % (interval // JITTER_FRACTION + 1)  # stable across processes
    return anchor + interval + jitter


def shown_next_check_ms(meta: TransactionMetadata, config: GroupCheckConfig) -> int:
    """What DescribeTransactions shows as the next check time: the due time of
    the state the transaction is in, even while a transition is in flight (a
    check's answer being written), and -1 only when no check will be made."""
    due = check_due_ms(meta, config)
    return -1 if due is None else due


def exhausted(meta: TransactionMetadata, config: GroupCheckConfig) -> bool:
    return meta.checks_done >= config.check_max


def decide_answer(meta: TransactionMetadata | None, handle: Handle, answer: CheckAnswer, config: GroupCheckConfig,
                  now_ms: int, spare_ids: list[int]) -> core.Outcome:
    """What a checker's answer about ``handle`` does (see the module docstring)."""
    if answer is not CheckAnswer.UNKNOWN:
        return core.decide_complete(meta, handle, answer is CheckAnswer.COMMIT, spare_ids)
    if meta is None or meta.pending_state is not None or not ts.is_prepared_as(meta, handle):
        return core.Reply()  # completed, fenced or in flight meanwhile: the attempt no longer counts
    checks = meta.checks_done + 1
    if checks >= config.check_max and not config.keep_when_exhausted:
        return core.decide_complete(meta, handle, False, spare_ids)
    return core.Transit(S.PREPARED, {"checks_done": checks, "last_check_ms": now_ms})


def decide_exhausted(meta: TransactionMetadata | None, handle: Handle, config: GroupCheckConfig, spare_ids: list[int]) -> core.Outcome:
    """The abort of a prepared transaction whose checks are exhausted (the group's
    maximum lowered below its count, say) under the abort policy."""
    if meta is None or not ts.is_prepared_as(meta, handle) or not exhausted(meta, config) or config.keep_when_exhausted:
        return core.Reply()
    return core.decide_complete(meta, handle, False, spare_ids)


# --- registrations ---------------------------------------------------------------------------

LEASE_MS_DEFAULT = 30_000
LEASE_MS_MIN, LEASE_MS_MAX = 1_000, 300_000
CHECKERS_PER_GROUP_MAX = 100
REGISTRATIONS_MAX = 10_000
ADDRESS_CHARS_MAX = 255


def check_checker_address(address: str) -> str:
    """host:port with a concrete host (a checker is dialled at it) and a port 1..65535;
    an IPv6 host in brackets ([::1]:5), as gRPC reads an unbracketed one whole as the host."""
    host, sep, port = address.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    problem = None
    if not sep or not host or len(address) > ADDRESS_CHARS_MAX or any(c.isspace() for c in address):
        problem = f"host:port of at most {ADDRESS_CHARS_MAX} characters"
    elif not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        problem = "a port 1..65535"
    elif ":" in host and not bracketed:
        problem = "an IPv6 host in brackets, as [::1]:50051"
    else:
        try:
            unspecified = ipaddress.ip_address(host).is_unspecified
        except ValueError:
            unspecified = False
        if unspecified:
            problem = "a host the coordinators can dial, not an unspecified address (0.0.0.0, ::)"
    if problem:
        raise error("INVALID_REQUEST", f"checker address {address[:ADDRESS_CHARS_MAX]!r} is invalid: it must be {problem}")
    return address


def lease_of(lease_ms: int) -> int:
    if lease_ms == 0:
        return LEASE_MS_DEFAULT
    if not LEASE_MS_MIN <= lease_ms <= LEASE_MS_MAX:
        raise error("INVALID_REQUEST", f"lease_ms must be 0 (the default, {LEASE_MS_DEFAULT:,}) or {LEASE_MS_MIN:,}..{LEASE_MS_MAX:,}, got {lease_ms:,}")
    return lease_ms


class CheckerRegistrations:
    """The checker addresses registered per transaction group, each until its
    lease lapses (monotonic seconds passed in)."""

    def __init__(self, per_group_max: int = CHECKERS_PER_GROUP_MAX, total_max: int = REGISTRATIONS_MAX,
                 shuffle: Callable[[list], None] = lambda addresses: None):
        self.per_group_max = per_group_max
        self.shuffle = shuffle  # how live() orders a group's addresses: the coordinator passes random.shuffle
        self.total_max = total_max
        self._leases: dict[str, dict[str, float]] = {}  # group -> address -> lapses at

    def register(self, group_id: str, address: str, lease_ms: int, now_s: float) -> None:
        self._drop_lapsed(now_s, group_id)
        group = self._leases.get(group_id, {})
        if address not in group:
            if len(group) >= self.per_group_max:
                raise error("INVALID_REQUEST", f"transaction group {group_id!r} has {len(group)} checkers registered, the most allowed")
            if self.count() >= self.total_max:
                self._drop_lapsed(now_s)
            if self.count() >= self.total_max:
                raise error("COORDINATOR_NOT_AVAILABLE", f"this coordinator holds {self.total_max:,} checker registrations, the most allowed; retry later")
        self._leases.setdefault(group_id, {})[address] = now_s + lease_ms / 1000

    def unregister(self, group_id: str, address: str) -> bool:
        removed = self._leases.get(group_id, {}).pop(address, None) is not None
        self._forget_if_empty(group_id)
        return removed

    def live(self, group_id: str, now_s: float) -> list[str]:
        """The group's registered addresses, in the order ``shuffle`` leaves them (any may be asked)."""
        self._drop_lapsed(now_s, group_id)
        addresses = list(self._leases.get(group_id, {}))
        self.shuffle(addresses)
        return addresses

    def leases(self, group_id: str, now_s: float) -> list[tuple[str, int]]:
        """(address, ms left on its lease), by address."""
        self._drop_lapsed(now_s, group_id)
        return sorted((a, int((until - now_s) * 1000)) for a, until in self._leases.get(group_id, {}).items())

    def count(self) -> int:
        return sum(len(g) for g in self._leases.values())

    def _drop_lapsed(self, now_s: float, only_group: str | None = None) -> None:
        for group_id in list(self._leases) if only_group is None else [only_group]:
            group = self._leases.get(group_id, {})
            for address in [a for a, until in group.items() if until <= now_s]:
                del group[address]
            self._forget_if_empty(group_id)

    def _forget_if_empty(self, group_id: str) -> None:
        if not self._leases.get(group_id, True):
            del self._leases[group_id]
