"""Client quotas as Kafka keeps them: what a quota entity is, which configured
entity applies to a call, the rate a client is at and how long its answer is
held (pure, no I/O; quota_store.py keeps the configs in ZooKeeper).

Entities
--------
An entity names a ``user`` (a principal's name without ``User:``), a
``client-id`` (the ``txlog-client-id`` metadata a client sends), or both; a
part without a name is that type's default. For a call by user U with client
id C, each quota key is taken from the first entity that sets it, in Kafka's
order: (U, C), (U, default client), (U), (default user, C), (default user,
default client), (default user), (C), (default client).

Sharing: the clients that map to one configured entity share its quota, a
default part standing for each name it matches: a ``{"user": "alice"}`` quota
is shared by all of alice's clients, a default client-id quota is each
client id's own.

Quotas: ``producer_byte_rate`` (the bytes of the batches a client produces,
per second), ``consumer_byte_rate`` (the bytes of the answers it fetches, per
second) and ``request_percentage`` (Kafka's KIP-124: the time its calls'
handlers take on the instance's one request-handling thread, its event loop,
as a percentage of that thread: 50 is half a second per second).

Throttling (Kafka's, KIP-219): each (shared entity, key) has a rate over
``SAMPLES`` windows of ``WINDOW_MS``. A call that takes the rate past the
quota is answered at once with ``throttle_time_ms``: ``(rate - quota) /
quota * span`` ms (span: the windows measured, at most ``SAMPLES *
WINDOW_MS``), at most ``THROTTLE_MAX_MS``; until then the entity is
throttled. A call of a throttled entity waits before it is applied (a
compliant client waits before sending it), so however many calls a client
keeps in flight, what it gets applied stays at its quota.
"""

from __future__ import annotations

import math
import urllib.parse
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from txlog.protocol.errors import ErrorCode, TxlogError

USER, CLIENT_ID = "user", "client-id"
ENTITY_TYPES = (USER, CLIENT_ID)
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
# Kafka's KIP-124: the share of one request-handling thread a client may take, in percent (a handler thread here is
# the instance's event loop: the time its calls' handlers run on it, between their waits; request_seconds)
REQUEST_PERCENTAGE = "request_percentage"
BYTE_RATE_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE)
QUOTA_KEYS = (*BYTE_RATE_KEYS, REQUEST_PERCENTAGE)
DEFAULT = "<default>"
WINDOW_MS = 1_000
SAMPLES = 11
THROTTLE_MAX_MS = SAMPLES * WINDOW_MS
NAME_LENGTH_MAX = 255
TRACKED_MAX = 100_000  # (entity, key) rates kept, the least recently used going first

# An entity: (entity type, name or None for the default) per part, users first.
Entity = tuple[tuple[str, str | None], ...]


def entity_of(parts: Mapping[str, str | None]) -> Entity:
    """An entity from ``{"user": ..., "client-id": ...}`` (a None name: the
    default); INVALID_REQUEST naming what is wrong."""
    if not parts:
        raise TxlogError(ErrorCode.Value("INVALID_REQUEST"), "a quota entity names a user, a client-id or both")
    unknown = sorted(set(parts) - set(ENTITY_TYPES))
    if unknown:
        raise TxlogError(ErrorCode.Value("INVALID_REQUEST"),
                         f"unknown entity type {unknown[0]!r}: quota entities are {list(ENTITY_TYPES)}")
    for kind, name in parts.items():
        if name is not None and (not name or len(name) > NAME_LENGTH_MAX or name == DEFAULT):
            raise TxlogError(ErrorCode.Value("INVALID_REQUEST"),
                             f"{kind} name must be 1 to {NAME_LENGTH_MAX} characters and not {DEFAULT!r} "
                             "(leave the name out for the default)")
    return tuple((kind, parts[kind]) for kind in ENTITY_TYPES if kind in parts)


def entity_parts(entity: Entity) -> dict[str, str | None]:
    return dict(entity)


def node_name(entity: Entity) -> str:
    """The znode name of an entity (names percent-encoded: a name may hold '/' or ',')."""
    return ",".join(f"{kind}={DEFAULT if name is None else urllib.parse.quote(name, safe='')}" for kind, name in entity)


def entity_of_node(node: str) -> Entity:
    parts = {}
    for part in node.split(","):
        kind, _, name = part.partition("=")
        parts[kind] = None if name == DEFAULT else urllib.parse.unquote(name)
    return entity_of(parts)


def checked_values(values: Mapping[str, float | None]) -> dict[str, float | None]:
    """Quota values to set (None: remove the key); INVALID_CONFIG naming what is wrong."""
    checked = {}
    for key, value in values.items():
        if key not in QUOTA_KEYS:
            raise TxlogError(ErrorCode.Value("INVALID_CONFIG"), f"unknown quota {key!r}; known: {list(QUOTA_KEYS)}")
        if value is not None:
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
                raise TxlogError(ErrorCode.Value("INVALID_CONFIG"), f"{key} must be a positive number, got {value!r}")
            if key in BYTE_RATE_KEYS and value < 1:
                raise TxlogError(ErrorCode.Value("INVALID_CONFIG"), f"{key} is bytes per second: at least 1, got {value!r}")
        checked[key] = None if value is None else float(value)
    return checked


def precedence(user: str, client_id: str) -> list[Entity]:
    """The entities that may apply to (user, client_id), most specific first."""
    return [((USER, user), (CLIENT_ID, client_id)), ((USER, user), (CLIENT_ID, None)), ((USER, user),),
            ((USER, None), (CLIENT_ID, client_id)), ((USER, None), (CLIENT_ID, None)), ((USER, None),),
            ((CLIENT_ID, client_id),), ((CLIENT_ID, None),)]


def applying(configs: Mapping[Entity, Mapping[str, float]], user: str, client_id: str,
             key: str) -> tuple[Entity, float] | None:
    """The quota ``key`` that applies to (user, client_id): the entity sharing
    it (defaults replaced by the names they matched) and its value; None when
    no entity sets it."""
    for entity in precedence(user, client_id):
        value = configs.get(entity, {}).get(key)
        if value is not None:
            shared = tuple((kind, name if name is not None else (user if kind == USER else client_id))
                           for kind, name in entity)
            return shared, value
    return None


@dataclass
class Rate:
    """Amounts in ``SAMPLES`` windows of ``WINDOW_MS`` (Kafka's sampled rate)."""

    started_ms: float
    windows: deque = field(default_factory=deque)  # [window start, amount]

    def record(self, amount: float, now_ms: float) -> None:
        start = now_ms - now_ms % WINDOW_MS
        if self.windows and self.windows[-1][0] == start:
            self.windows[-1][1] += amount
        else:
            self.windows.append([start, amount])
        while self.windows and self.windows[0][0] <= now_ms - SAMPLES * WINDOW_MS:
            self.windows.popleft()

    def span_ms(self, now_ms: float) -> float:
        """The time the rate is over: the windows kept, at least one whole window."""
        return max(WINDOW_MS, min(SAMPLES * WINDOW_MS, now_ms - self.started_ms))

    def per_second(self, now_ms: float) -> float:
        return sum(amount for _, amount in self.windows) * 1000 / self.span_ms(now_ms)


def request_amount(handler_seconds: float) -> float:
    """What a call that ran ``handler_seconds`` on the handler thread counts against request_percentage: its
    time in hundredths of a second, so that a rate per second of it is the percentage of the thread taken."""
    return handler_seconds * 100


def throttle_ms(rate: Rate, quota: float, now_ms: float) -> int:
    """How long to hold an answer that took ``rate`` where it is: Kafka's
    (observed - quota) / quota * span, 0 within the quota."""
    observed = rate.per_second(now_ms)
    if observed <= quota:
        return 0
    return min(THROTTLE_MAX_MS, math.ceil((observed - quota) / quota * rate.span_ms(now_ms)))


class QuotaTracker:
    """The rates of the entities that have quotas, on one instance, and until
    when each is throttled. At most ``TRACKED_MAX`` are kept, the least
    recently used going first (client ids are the callers' to choose)."""

    def __init__(self, tracked_max: int = TRACKED_MAX):
        self.tracked_max = tracked_max
        self.rates: OrderedDict[tuple[Entity, str], Rate] = OrderedDict()
        self.throttled_until: dict[tuple[Entity, str], float] = {}

    def throttled_ms(self, configs: Mapping[Entity, Mapping[str, float]], user: str, client_id: str, key: str,
                     now_ms: float) -> tuple[tuple[Entity, str] | None, float]:
        """The (entity, key) whose quota applies, and how long it is still throttled (0: not)."""
        found = applying(configs, user, client_id, key)
        if found is None:
            return None, 0.0
        tracked = (found[0], key)
        return tracked, max(0.0, self.throttled_until.get(tracked, 0.0) - now_ms)

    def record(self, configs: Mapping[Entity, Mapping[str, float]], user: str, client_id: str,
               amounts: Iterable[tuple[str, float]], now_ms: float) -> int:
        """Counts a call's ``amounts`` (quota key, amount) against the quotas
        that apply; the longest throttle they call for (0: none), from which
        on the entity is throttled."""
        held = 0
        for key, amount in amounts:
            found = applying(configs, user, client_id, key)
            if found is None:
                continue
            entity, quota = found
            tracked = (entity, key)
            rate = self.rates.get(tracked)
            if rate is None:
                rate = self.rates[tracked] = Rate(now_ms)
                while len(self.rates) > self.tracked_max:
                    evicted, _ = self.rates.popitem(last=False)
                    self.throttled_until.pop(evicted, None)
            else:
                self.rates.move_to_end(tracked)
            rate.record(amount, now_ms)
            throttle = throttle_ms(rate, quota, now_ms)
            if throttle:
                self.throttled_until[tracked] = max(self.throttled_until.get(tracked, 0.0), now_ms + throttle)
            held = max(held, throttle)
        return held
