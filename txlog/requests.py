"""Request drivers shared by the Consumer and the Admin client: retrying a call
by the error table, and sending a per-partition request to each partition's
leader.

Error Handling
--------------
Both drivers sort every failure with :func:`txlog.errors.action_for`:
REFRESH_METADATA marks the metadata cache stale (the next attempt refreshes
it), FIND_COORDINATOR forgets the group's coordinator, RETRY just backs off;
the retry policy (:class:`txlog.protocol.retry.RetryPolicy`: attempts, deadline,
jittered back-off) bounds them all; FAIL raises at once. When the policy runs
out, the last error is raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from txlog.errors import Action, ClientError, action_for, error_for, from_proto
from txlog.metadata import Metadata
from txlog.protocol.errors import ErrorCode
from txlog.protocol.retry import RetryPolicy
from txlog.structs import TopicPartition

T = TypeVar("T")
NONE = ErrorCode.Value("NONE")
PARTITIONS_PER_REQUEST_MAX = 1000  # partition_svc refuses requests naming more than 10_000


def retry_policy(*, deadline_ms: float, backoff_ms: float, attempts_max: int = 1000) -> RetryPolicy:
    return RetryPolicy(attempts_max=attempts_max, backoff_initial_ms=backoff_ms,
                       backoff_max_ms=max(backoff_ms, 1000), deadline_ms=deadline_ms)


def sort_error(exc: BaseException, metadata: Metadata, group_id: str | None = None) -> bool:
    """Acts on ``exc`` as the error table says; True when the call should be retried."""
    if not isinstance(exc, ClientError):
        return False
    action = action_for(exc.code)
    if action is Action.REFRESH_METADATA:
        metadata.request_update()
    elif action is Action.FIND_COORDINATOR and group_id is not None:
        metadata.forget_group_coordinator(group_id)
    return action.retries


async def with_retries(
    operation: Callable[[], Awaitable[T]], *, metadata: Metadata, policy: RetryPolicy, group_id: str | None = None
) -> T:
    """Runs ``operation`` until it succeeds, fails for good, or ``policy`` runs out."""

    async def attempt() -> T:
        if metadata.needs_refresh():
            await metadata.refresh()
        return await operation()

    return await policy.run(attempt, lambda exc: sort_error(exc, metadata, group_id))


async def call_leaders(
    metadata: Metadata,
    transport,
    tps: Iterable[TopicPartition],
    rpc: str,
    build_request: Callable[[list[TopicPartition]], object],
    results_of: Callable[[object], Iterable[tuple[TopicPartition, object, object]]],
    *,
    policy: RetryPolicy,
    timeout_ms: float | None = None,
) -> dict[TopicPartition, object]:
    """Sends ``rpc`` for ``tps`` to their leaders (one request per leader, in
    parallel) and returns each partition's result item.

    ``results_of(response)`` yields ``(tp, error, item)`` per partition. Items
    with retriable errors, and partitions without a known leader, are asked
    again after a metadata refresh and back-off, within ``policy``."""
    pending = set(tps)
    results: dict[TopicPartition, object] = {}
    metadata.track(tp.topic for tp in pending)
    started = policy.clock()
    attempt = 0
    last_error: ClientError | None = None
    while pending:
        if metadata.needs_refresh() or any(metadata.leader(tp) is None for tp in pending):
            try:
                await metadata.refresh([tp.topic for tp in pending])
            except ClientError as exc:
                if not exc.retriable:
                    raise
                last_error = exc
        by_leader: dict[str, list[TopicPartition]] = {}
        for tp in sorted(pending):
            leader = metadata.leader(tp)
            if leader is None:
                info = metadata.topic(tp.topic)
                code = info.error_code if info is not None and info.error_code != NONE else \
                    ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION")
                last_error = error_for(code, f"no leader known for {tp.topic}-{tp.partition}")
                if action_for(code) is Action.FAIL:
                    raise last_error
                continue
            by_leader.setdefault(leader.leader_address, []).append(tp)
        calls = [transport.call(address, rpc, build_request(group[i:i + PARTITIONS_PER_REQUEST_MAX]),
                                timeout_ms=timeout_ms)
                 for address, group in by_leader.items() for i in range(0, len(group), PARTITIONS_PER_REQUEST_MAX)]
        answers = await asyncio.gather(*calls, return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                if not isinstance(answer, ClientError) or not sort_error(answer, metadata):
                    raise answer
                last_error = answer
                continue
            for tp, error, item in results_of(answer):
                if tp not in pending:
                    continue
                if error.code == NONE:
                    results[tp] = item
                    pending.discard(tp)
                    continue
                exc = from_proto(error)
                if not sort_error(exc, metadata):
                    raise exc
                last_error = exc
        if not pending:
            break
        attempt += 1
        elapsed_ms = (policy.clock() - started) * 1000
        delay_ms = policy.delay_after(attempt, last_error)
        if attempt >= policy.attempts_max or (policy.deadline_ms is not None
                                              and elapsed_ms + delay_ms > policy.deadline_ms):
            raise last_error or error_for(ErrorCode.Value("REQUEST_TIMED_OUT"),
                                          f"{rpc}: no answer for {sorted(pending)}")
        await policy.sleep(delay_ms / 1000)
    return results
