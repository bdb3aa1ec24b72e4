"""The asyncio clients (txlog/aio.py) against a real cluster:
ZooKeeper, producer_id_svc, two partition_svc and two coordinator_svc
processes started by LocalCluster (as `txlog cluster up` does). Every test
runs its scenario with asyncio.run, under a deadline; nothing sleeps a fixed
time."""

from __future__ import annotations

import asyncio

import pytest

from services.tooling.cluster import LocalCluster
from txlog import (
    Admin,
    AIOConsumer,
    AIOProducer,
    ClientClosedError,
    NoOffsetForPartitionError,
    RecordMetadata,
    TopicPartition,
    TxnState,
)

SCENARIO_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory):
    cluster = LocalCluster(tmp_path_factory.mktemp("client-aio") / "cluster")
    cluster.up(service_args={"partition_svc": ["--group-heartbeat-interval-ms", "200"],
                             "coordinator_svc": ["--transaction-check-interval-ms", "200",
                                                 "--ownership-check-interval-ms", "300"]})
    cluster.wait_until_coordinators_settle()
    yield cluster
    cluster.down(grace_s=5)


@pytest.fixture(scope="module")
def bootstrap(local_cluster):
    return local_cluster.state.bootstrap


def _create(bootstrap: str, name: str, partitions: int) -> list[TopicPartition]:
    with Admin(bootstrap) as admin:
        assert admin.create_topics([(name, partitions)]) == {name: partitions}
    return [TopicPartition(name, p) for p in range(partitions)]


def _run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario, SCENARIO_TIMEOUT_S))


def _flat(batch: dict) -> list:
    return [record for records in batch.values() for record in records]


async def _read(consumer: AIOConsumer, count: int, timeout_s: float = 60) -> list:
    """At least ``count`` records (getmany until then), within ``timeout_s``."""
    records: list = []
    async with asyncio.timeout(timeout_s):
        while len(records) < count:
            records += _flat(await consumer.getmany(timeout_ms=500))
    return records


async def _until(condition, timeout_s: float, what: str, tasks=()) -> None:
    """Until ``condition()``, asking again every 20 ms; fails after ``timeout_s`` or
    when one of ``tasks`` failed."""
    try:
        async with asyncio.timeout(timeout_s):
            while not condition():
                for task in tasks:
                    if task.done():
                        task.result()  # raises what the task raised
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"never: {what}") from None


def test_produce_consume_round_trip(bootstrap):
    tps = _create(bootstrap, "aio-roundtrip", 3)

    async def scenario():
        async with AIOProducer(bootstrap, linger_ms=1) as producer:
            assert await producer.partitions_for("aio-roundtrip") == [0, 1, 2]
            deliveries = [await producer.send("aio-roundtrip", f"value-{i}", key=f"key-{i}", headers=[("n", str(i))],
                                              timestamp_ms=1_700_000_000_000 + i) for i in range(60)]
            assert all(isinstance(d, asyncio.Future) for d in deliveries)
            last = await producer.send_and_wait("aio-roundtrip", b"last", partition=2)
            await producer.flush(timeout_s=30)
            sent = await asyncio.gather(*deliveries)
        assert isinstance(last, RecordMetadata) and last.partition == 2
        with pytest.raises(ClientClosedError):
            await producer.send("aio-roundtrip", b"after stop")

        async with AIOConsumer(bootstrap, fetch_max_wait_ms=100, consumer_timeout_ms=500) as consumer:
            await consumer.assign(tps)
            assert consumer.assignment() == set(tps)
            first = await consumer.getone()
            some = _flat(await consumer.getmany(timeout_ms=5000, max_records=7))
            assert some and len(some) <= 7, "records, never more than max_records"
            offsets_by_partition: dict[int, list[int]] = {}
            for record in some:
                offsets_by_partition.setdefault(record.partition, []).append(record.offset)
            assert all(offsets == list(range(offsets[0], offsets[0] + len(offsets))) for offsets in offsets_by_partition.values()), \
                "each partition's records in offset order, none skipped"
            rest = await _read(consumer, 61 - 1 - len(some))
            records = [first, *some, *rest]
            more = [record async for record in consumer]  # ends after consumer_timeout_ms without a record
            assert more == []
            for tp in tps:
                assert await consumer.position(tp) == sum(1 for r in records if r.partition == tp.partition)
        assert len(records) == 61
        by_value = {r.value: r for r in records}
        for i, metadata in enumerate(sent):
            record = by_value[f"value-{i}".encode()]
            assert (record.partition, record.offset) == (metadata.partition, metadata.offset)
            assert record.key == f"key-{i}".encode() and record.headers == [("n", str(i).encode())]
            assert record.timestamp_ms == metadata.timestamp_ms == 1_700_000_000_000 + i
        assert (by_value[b"last"].partition, by_value[b"last"].offset) == (last.partition, last.offset)
        for tp in tps:  # each partition's records in offset order
            offsets = [r.offset for r in records if r.partition == tp.partition]
            assert offsets == sorted(offsets)

    _run(scenario())


async def _values_to_end(bootstrap: str, tps: list[TopicPartition], isolation: str) -> list[str]:
    """Every value a reader with ``isolation`` sees, from the start to the end it sees now."""
    values: list[str] = []
    async with AIOConsumer(bootstrap, isolation_level=isolation, fetch_max_wait_ms=100) as consumer:
        await consumer.assign(tps)
        await consumer.seek_to_beginning()
        ends = await consumer.end_offsets(tps)

        async def behind() -> bool:
            return any([await consumer.position(tp) < ends[tp] for tp in tps])

        async with asyncio.timeout(60):
            while await behind():
                values += [r.value.decode() for r in _flat(await consumer.getmany(timeout_ms=500))]
    return sorted(values)


async def _values_once_settled(bootstrap: str, tps: list[TopicPartition], isolation: str, expected: list[str],
                               timeout_s: float = 60) -> list[str]:
    """_values_to_end, read again (with a deadline) until it is ``expected``; the last read otherwise."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        values = await _values_to_end(bootstrap, tps, isolation)
        if values == expected or asyncio.get_running_loop().time() > deadline:
            return values
        await asyncio.sleep(0.2)


def test_a_transaction_context_commits_on_success_and_aborts_on_an_exception(bootstrap):
    tps = _create(bootstrap, "aio-txn", 2)
    (source,) = _create(bootstrap, "aio-txn-source", 1)

    async def scenario():
        async with AIOProducer(bootstrap, transactional_id="aio-txn-0", linger_ms=1) as producer:
            assert producer.transaction_state is TxnState.READY  # start() initialized the transactions
            await producer.init_transactions()  # done already: returns at once
            async with producer.transaction():
                for i in range(6):
                    await producer.send("aio-txn", f"committed-{i}", partition=i % 2)
                await producer.send_offsets_to_transaction({source: 42}, "aio-txn-group")
            assert producer.transaction_state is TxnState.READY

            with pytest.raises(RuntimeError, match="boom"):
                async with producer.transaction():
                    for i in range(6):
                        await producer.send("aio-txn", f"aborted-{i}", partition=i % 2)
                    await producer.send_offsets_to_transaction({source: 99}, "aio-txn-group")
                    await producer.flush(timeout_s=30)  # the records are in the log before the abort
                    raise RuntimeError("boom")
            assert producer.transaction_state is TxnState.READY

            await producer.begin_transaction()  # the explicit calls work the same
            await producer.send("aio-txn", "explicit", partition=0)
            await producer.commit_transaction()

        # commit_transaction returns once the commit is decided; the records show once its markers are written
        committed = [f"committed-{i}" for i in range(6)] + ["explicit"]
        assert await _values_once_settled(bootstrap, tps, "read_committed", sorted(committed)) == sorted(committed)
        aborted = [f"aborted-{i}" for i in range(6)]
        assert await _values_to_end(bootstrap, tps, "read_uncommitted") == sorted(committed + aborted)
        async with AIOConsumer(bootstrap, group_id="aio-txn-group") as consumer:
            await consumer.assign([source])
            assert await consumer.committed(source) == 42  # the committed transaction's offset, not the aborted one

    _run(scenario())


def test_the_event_loop_keeps_running_while_getmany_waits(bootstrap):
    (tp,) = _create(bootstrap, "aio-idle", 1)

    async def scenario():
        loop = asyncio.get_running_loop()
        async with AIOConsumer(bootstrap, fetch_max_wait_ms=500) as consumer:
            await consumer.assign([tp])
            assert await consumer.position(tp) == 0
            ticks = 0

            async def tick():
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            ticker = asyncio.create_task(tick())
            try:
                started = loop.time()
                assert await consumer.getmany(timeout_ms=1000) == {}
                waited_s = loop.time() - started
            finally:
                ticker.cancel()
            assert waited_s >= 0.99  # it did wait for its timeout ...
            assert ticks >= 10, f"the loop ticked {ticks} times in a {waited_s:.2f} s getmany"  # ... off the loop

    _run(scenario())


def test_a_cancelled_getmany_leaves_the_consumer_usable_and_loses_no_record(bootstrap):
    (tp,) = _create(bootstrap, "aio-cancel", 1)

    async def scenario():
        async with AIOProducer(bootstrap, linger_ms=1) as producer, \
                AIOConsumer(bootstrap, group_id="aio-cancel-group", fetch_max_wait_ms=100,
                            max_poll_records=7) as consumer:
            await consumer.assign([tp])
            # cancelled while it waits on an empty partition: by a deadline, and by hand
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(consumer.getmany(timeout_ms=10_000), timeout=0.3)
            waiting = asyncio.create_task(consumer.getmany(timeout_ms=10_000))
            await asyncio.sleep(0)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting

            for i in range(30):
                await producer.send("aio-cancel", f"{i}", partition=0)
            await producer.flush(timeout_s=30)

            # cancelled while records come in: whatever a cancelled poll brought is handed out later
            records = []
            for _ in range(8):
                task = asyncio.create_task(consumer.getmany(timeout_ms=5000, max_records=3))
                await asyncio.sleep(0)
                task.cancel()
                try:
                    records += _flat(await task)
                except asyncio.CancelledError:
                    pass
            records += await _read(consumer, 30 - len(records))
            assert [r.offset for r in records] == list(range(30)), "a record was lost or handed out twice"
            assert [r.value for r in records] == [f"{i}".encode() for i in range(30)]
            assert await consumer.position(tp) == 30

            # a getmany that takes fewer records than its poll brought: the rest is neither lost nor committed
            await consumer.seek(tp, 0)
            taken = []
            async with asyncio.timeout(30):
                while len(taken) < 5:
                    taken += _flat(await consumer.getmany(timeout_ms=1000, max_records=5 - len(taken)))
            assert [r.offset for r in taken] == list(range(5))
            assert await consumer.position(tp) == 5
            await consumer.commit()
            assert await consumer.committed(tp) == 5
            assert [r.offset for r in await _read(consumer, 25)] == list(range(5, 30))

    _run(scenario())


def test_a_poll_error_reaches_getmany_and_the_consumer_goes_on(bootstrap):
    (tp,) = _create(bootstrap, "aio-no-offset", 1)

    async def scenario():
        async with AIOProducer(bootstrap, linger_ms=1) as producer:
            await producer.send_and_wait("aio-no-offset", b"only", partition=0)
        async with AIOConsumer(bootstrap, group_id="aio-no-offset-group", auto_offset_reset="none",
                               fetch_max_wait_ms=100) as consumer:
            await consumer.assign([tp])
            with pytest.raises(NoOffsetForPartitionError):
                await consumer.getmany(timeout_ms=1000)
            await consumer.seek(tp, 0)
            assert [r.value for r in await _read(consumer, 1)] == [b"only"]

    _run(scenario())


def test_two_subscribed_consumers_share_the_partitions(bootstrap):
    tps = _create(bootstrap, "aio-shared", 4)
    everything = set(tps)

    async def scenario():
        options = {"group_id": "aio-sharing", "fetch_max_wait_ms": 100, "session_timeout_ms": 10_000}
        async with AIOConsumer(bootstrap, **options) as first, AIOConsumer(bootstrap, **options) as second:
            assigned, revoked = [], []
            received = {first: [], second: []}
            stop = asyncio.Event()

            async def on_assign(partitions):  # a coroutine listener runs on this loop
                assigned.append(partitions)

            async def on_revoke(partitions):
                revoked.append(partitions)
                await first.commit()  # the consumer's own calls work inside its listener

            async def pump(consumer):
                while not stop.is_set():
                    received[consumer] += _flat(await consumer.getmany(timeout_ms=100))

            await first.subscribe(["aio-shared"], on_assign=on_assign, on_revoke=on_revoke)
            tasks = [asyncio.create_task(pump(first))]
            await _until(lambda: first.assignment() == everything, 60, "the only member owning every partition", tasks)
            await second.subscribe(["aio-shared"])
            tasks.append(asyncio.create_task(pump(second)))

            def split() -> bool:
                a, b = first.assignment(), second.assignment()
                assert not (a & b), f"a partition owned twice: {a & b}"
                return bool(a) and bool(b) and a | b == everything
            await _until(split, 60, "the partitions split between the two members", tasks)
            owned = {first: first.assignment(), second: second.assignment()}

            async with AIOProducer(bootstrap, linger_ms=1) as producer:
                for tp in tps:
                    await producer.send_and_wait("aio-shared", f"p{tp.partition}", partition=tp.partition)
            await _until(lambda: len(received[first]) + len(received[second]) >= len(tps), 60,
                         "every record received", tasks)
            stop.set()
            await asyncio.gather(*tasks)

            for consumer in (first, second):
                assert {TopicPartition(r.topic, r.partition) for r in received[consumer]} <= owned[consumer]
            values = sorted(r.value for r in received[first] + received[second])
            assert values == sorted(f"p{tp.partition}".encode() for tp in tps)  # each once
            assert assigned and set().union(*assigned) == everything
            assert revoked and set().union(*revoked) == owned[second]  # the first handed the second its share
            assert first.group_metadata().member_epoch > 0

    _run(scenario())


def test_stop_ends_an_async_for_and_later_calls_raise(bootstrap):
    (tp,) = _create(bootstrap, "aio-stop", 1)

    async def scenario():
        consumer = AIOConsumer(bootstrap, fetch_max_wait_ms=100)
        await consumer.start()
        await consumer.assign([tp])
        seen = []

        async def iterate():
            async for record in consumer:
                seen.append(record.value)

        iteration = asyncio.create_task(iterate())
        async with AIOProducer(bootstrap, linger_ms=1) as producer:
            for i in range(3):
                await producer.send("aio-stop", f"{i}")
        await _until(lambda: len(seen) == 3, 60, "three records iterated", [iteration])
        await consumer.stop()
        await asyncio.wait_for(iteration, 30)  # the iteration ended (StopAsyncIteration)
        assert seen == [b"0", b"1", b"2"]
        with pytest.raises(ClientClosedError):
            await consumer.getmany()
        await consumer.stop()  # idempotent

    _run(scenario())
