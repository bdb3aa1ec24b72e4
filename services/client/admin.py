"""The Admin client: topics, offsets and producer states, synchronous for its
callers (one event loop thread per Admin).

Guarantees
----------
* ``create_topics`` is idempotent: creating a topic that exists with the same
  partition count succeeds (TOPIC_ALREADY_EXISTS only for a different count),
  and it returns once every new topic's partitions have leaders in the
  metadata (or ``timeout_s`` passes), so a Producer made next can use them.
* Every call retries retriable errors (unreachable servers, leader moves,
  ZooKeeper hiccups) within its timeout, by the SDK's one error table, and
  raises the first error that is not retriable as a ClientError.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence

from services.client._loop import LoopThread
from services.client.errors import ClientClosedError, ClientError, error_for, from_proto
from services.client.fetcher import list_offsets
from services.client.metadata import Metadata, TopicInfo
from services.client.requests import call_leaders, retry_policy, with_retries
from services.client.structs import (
    OffsetAndTimestamp,
    PartitionDescription,
    ProducerDescription,
    TopicDescription,
    TopicPartition,
    as_tp,
)
from services.client.transport import Transport
from services.errors import ErrorCode
from services.stubs.txlog.v1 import common_pb2, partition_pb2

NONE = ErrorCode.Value("NONE")
TOPICS_PER_CALL_MAX = 10_000
OFFSET_SPECS = {
    "earliest": partition_pb2.OFFSET_SPEC_EARLIEST,
    "latest": partition_pb2.OFFSET_SPEC_LATEST,
    "last_stable": partition_pb2.OFFSET_SPEC_LAST_STABLE,
}


def describe(info: TopicInfo) -> TopicDescription:
    return TopicDescription(
        name=info.name,
        partitions=tuple(
            PartitionDescription(p.partition, p.leader_id, p.leader_address, p.leader_epoch,
                                 ErrorCode.Name(p.error_code) if p.error_code in ErrorCode.values() else str(p.error_code))
            for p in info.partitions
        ),
        is_internal=info.is_internal,
        configs=dict(info.configs),
    )


class Admin:
    """Administers a txlog cluster through any of its partition servers."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        request_timeout_ms: float = 30_000,
        default_api_timeout_ms: float = 60_000,
        retry_backoff_ms: float = 100,
        transport=None,
        tracer_provider=None,
    ):
        self._request_timeout_ms = request_timeout_ms
        self._default_api_timeout_ms = default_api_timeout_ms
        self._retry_backoff_ms = retry_backoff_ms
        self._transport = transport or Transport(request_timeout_ms=int(request_timeout_ms),
                                                 tracer_provider=tracer_provider)
        self._metadata = Metadata(self._transport, bootstrap, refresh_backoff_ms=retry_backoff_ms)
        self._closed = False
        self._loop = LoopThread("txlog-admin")

    def _run(self, coro, timeout_ms: float, what: str):
        if self._closed:
            coro.close()
            raise ClientClosedError("the admin client is closed")
        return self._loop.run(coro, timeout_s=timeout_ms / 1000 + 5, what=what)

    def _timeout_ms(self, timeout_s: float | None) -> float:
        return self._default_api_timeout_ms if timeout_s is None else timeout_s * 1000

    def _policy(self, timeout_ms: float):
        return retry_policy(deadline_ms=timeout_ms, backoff_ms=self._retry_backoff_ms)

    # --- topics ----------------------------------------------------------------------------------

    def create_topics(
        self,
        topics: Iterable[tuple[str, int]],
        configs: Mapping[str, str] | None = None,
        *,
        validate_only: bool = False,
        timeout_s: float | None = None,
    ) -> dict[str, int]:
        """Creates ``topics`` ((name, partition_count) pairs; ``configs`` apply to
        each); returns {name: partition count}. Raises the first topic's error
        that is not retriable (TOPIC_ALREADY_EXISTS for a different count,
        INVALID_TOPIC, INVALID_PARTITIONS, INVALID_CONFIG...)."""
        wanted = [(name, count) for name, count in topics]
        if not wanted:
            return {}
        if len(wanted) > TOPICS_PER_CALL_MAX:
            raise ValueError(f"at most {TOPICS_PER_CALL_MAX} topics per call, not {len(wanted)}")
        for name, count in wanted:
            if not isinstance(name, str) or not isinstance(count, int) or isinstance(count, bool):
                raise TypeError(f"a topic is (name: str, partition_count: int), not {(name, count)!r}")
        timeout_ms = self._timeout_ms(timeout_s)
        return self._run(self._create_topics(wanted, dict(configs or {}), validate_only, timeout_ms), timeout_ms,
                         "create_topics")

    async def _create_topics(self, wanted, configs, validate_only: bool, timeout_ms: float) -> dict[str, int]:
        started = time.monotonic()
        pending = dict(wanted)
        created: dict[str, int] = {}

        async def attempt() -> None:
            request = partition_pb2.CreateTopicsRequest(
                topics=[partition_pb2.CreatableTopic(name=name, partition_count=count, configs=configs)
                        for name, count in pending.items()],
                validate_only=validate_only,
            )
            response = await self._metadata.call_any("CreateTopics", request, timeout_ms=self._request_timeout_ms)
            retriable: ClientError | None = None
            for result in response.results:
                if result.name not in pending:
                    continue
                if result.error.code == NONE:
                    created[result.name] = result.partition_count or pending[result.name]
                    del pending[result.name]
                    continue
                error = from_proto(result.error)
                if not error.retriable:
                    raise error
                retriable = error
            if pending:
                raise retriable or error_for(ErrorCode.Value("REQUEST_TIMED_OUT"),
                                             f"CreateTopics answered nothing for {sorted(pending)}")

        await with_retries(attempt, metadata=self._metadata, policy=self._policy(timeout_ms))
        if not validate_only:
            remaining_ms = timeout_ms - (time.monotonic() - started) * 1000
            await self._wait_for_leaders(list(created), max(remaining_ms, 0))
        return created

    async def _wait_for_leaders(self, names: list[str], timeout_ms: float) -> None:
        deadline = time.monotonic() + timeout_ms / 1000
        delay_s = self._retry_backoff_ms / 1000
        while True:
            try:
                await self._metadata.refresh(names)
            except ClientError as exc:
                if not exc.retriable:
                    raise
            infos = [self._metadata.topic(name) for name in names]
            if all(i is not None and i.exists and all(p.has_leader for p in i.partitions) for i in infos):
                return
            if time.monotonic() + delay_s > deadline:
                return  # created; leaders will follow (the producer waits for them itself)
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 1.0)

    def list_topics(self, timeout_s: float | None = None) -> list[str]:
        """Names of every topic (internal ones included), sorted."""
        return sorted(t.name for t in self.describe_topics(None, timeout_s=timeout_s))

    def describe_topics(self, names: Iterable[str] | None = None, *,
                        timeout_s: float | None = None) -> list[TopicDescription]:
        """The topics' partitions and leaders (None: every topic). A topic that does
        not exist raises UNKNOWN_TOPIC_OR_PARTITION."""
        wanted = None if names is None else list(dict.fromkeys(names))
        timeout_ms = self._timeout_ms(timeout_s)
        return self._run(self._describe_topics(wanted, timeout_ms), timeout_ms, "describe_topics")

    async def _describe_topics(self, wanted: list[str] | None, timeout_ms: float) -> list[TopicDescription]:
        async def attempt():
            return await self._metadata.fetch(wanted or (), all_topics=wanted is None)

        response = await with_retries(attempt, metadata=self._metadata, policy=self._policy(timeout_ms))
        by_name = {t.name: t for t in response.topics}
        out = []
        for name in wanted if wanted is not None else sorted(by_name):
            proto = by_name.get(name)
            if proto is None:
                raise error_for(ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"), f"no topic {name!r}")
            if proto.error.code != NONE:
                raise from_proto(proto.error)
            out.append(describe(self._metadata.topic(name)))
        return out

    # --- offsets and producers -----------------------------------------------------------------------

    def list_offsets(self, specs: Mapping, *, timeout_s: float | None = None) -> dict[TopicPartition, OffsetAndTimestamp]:
        """{(topic, partition): "earliest" | "latest" | "last_stable" | timestamp_ms}
        -> {TopicPartition: OffsetAndTimestamp}. "latest" is the high watermark."""
        kinds: dict[TopicPartition, int] = {}
        timestamps: dict[TopicPartition, int] = {}
        for key, spec in specs.items():
            tp = as_tp(key)
            if isinstance(spec, str):
                if spec not in OFFSET_SPECS:
                    raise ValueError(f"offset spec must be one of {sorted(OFFSET_SPECS)} or a timestamp, not {spec!r}")
                kinds[tp] = OFFSET_SPECS[spec]
            elif isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
                kinds[tp] = partition_pb2.OFFSET_SPEC_TIMESTAMP
                timestamps[tp] = spec
            else:
                raise ValueError(f"offset spec must be a name or a timestamp in ms >= 0, not {spec!r}")
        timeout_ms = self._timeout_ms(timeout_s)
        answers = self._run(
            list_offsets(self._metadata, self._transport, kinds, timestamps, timeout_ms=timeout_ms,
                         backoff_ms=self._retry_backoff_ms, request_timeout_ms=self._request_timeout_ms),
            timeout_ms, "list_offsets")
        return {tp: OffsetAndTimestamp(offset, timestamp_ms) for tp, (offset, timestamp_ms) in answers.items()}

    def describe_producers(self, partitions: Iterable, *,
                           timeout_s: float | None = None) -> dict[TopicPartition, list[ProducerDescription]]:
        """The producers each partition's leader knows (ids, epochs, last sequence,
        open transactions)."""
        tps = [as_tp(p) for p in partitions]
        timeout_ms = self._timeout_ms(timeout_s)

        def build(group: list[TopicPartition]):
            return partition_pb2.DescribeProducersRequest(
                partitions=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in group])

        def results_of(response):
            for item in response.results:
                producers = [ProducerDescription(p.producer_id, p.producer_epoch, p.last_sequence,
                                                 p.last_timestamp_ms, p.coordinator_epoch, p.current_txn_start_offset)
                             for p in item.producers]
                yield TopicPartition(item.topic, item.partition), item.error, producers

        answers = self._run(
            call_leaders(self._metadata, self._transport, tps, "DescribeProducers", build, results_of,
                         policy=self._policy(timeout_ms), timeout_ms=self._request_timeout_ms),
            timeout_ms, "describe_producers")
        return {tp: answers[tp] for tp in tps}

    # --- closing ----------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._loop.run(self._transport.close(), timeout_s=5, what="closing connections")
        finally:
            self._loop.stop()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
