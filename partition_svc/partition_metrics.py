"""What an operator alerts on in a partition_svc: records and bytes produced
and fetched per topic (counters, recorded on the hot path with one cached
attribute set per topic); per led partition its high watermark, LSO lag
(high watermark - LSO: a stuck LSO is a hanging transaction) and in-sync
replicas; under-replicated and (on the active controller) offline partitions;
the producer ids remembered; and RocksDB's size, pending compaction and write stalls. Gauges are read at
each scrape, never kept up to date on the hot path."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from txlog.protocol.errors import spec_of


class PartitionMetrics:
    def __init__(self, meter: Meter, partitions: Callable[[], Iterable], offline: Callable[[], int | None],
                 store_properties: Callable[[], dict[str, int]],
                 group_offsets: Callable[[], Iterable[tuple[str, str, int, int]]] = lambda: ()):
        self._partitions = partitions
        self._offline = offline
        self._store_properties = store_properties
        self._group_offsets = group_offsets
        self._topics: dict[str, dict] = {}
        self.produced_records = meter.create_counter("txlog.produce.records", description="records appended as leader, by topic")
        self.produced_bytes = meter.create_counter("txlog.produce.bytes", unit="By", description="batch bytes appended as leader, by topic")
        self.fetched_records = meter.create_counter("txlog.fetch.records", description="records returned to fetches, by topic")
        self.partition_errors = meter.create_counter(
            "txlog.partition.errors", description="partitions of Produce and Fetch calls answered with an error, by method, "
            "topic and error code (the call itself succeeded: txlog.rpc.errors counts calls refused whole)")
        self._refusals: dict[tuple[str, str, int], dict] = {}
        self.fetched_bytes = meter.create_counter("txlog.fetch.bytes", unit="By", description="bytes returned to fetches, by topic")
        gauges = {
            "txlog.partition.high_watermark": ("the high watermark of each led partition", self._high_watermarks),
            "txlog.partition.last_stable_offset": ("the last stable offset of each led partition (what read_committed "
                                                   "readers reach; a group's lag is this minus its committed offset)",
                                                   self._last_stable_offsets),
            "txlog.group.committed_offset": ("the committed offset of each partition of each group this instance "
                                             "coordinates", self._committed_offsets),
            "txlog.partition.lso_lag": ("records between the high watermark and the last stable offset, per led "
                                        "partition (an open transaction holds the LSO back)", self._lso_lags),
            "txlog.partition.in_sync_replicas": ("in-sync replicas of each led partition", self._in_sync),
            "txlog.partition.aborted_transactions": ("aborted transactions in each led partition's aborted index (what "
                                                     "read_committed reads consult; retention, DeleteRecords and "
                                                     "compaction trim it)", self._aborted_transactions),
            "txlog.partitions.led": ("partitions this instance leads", self._led),
            "txlog.partitions.under_replicated": ("led partitions with fewer in-sync replicas than replicas", self._under_replicated),
            "txlog.partitions.offline": ("partitions without a live leader (reported by the active controller only)", self._offline_count),
            "txlog.producer_ids": ("producer ids the partitions here remember (as leader or follower) for idempotence and "
                                   "transactions; each is kept until producer_id_expiration_ms after its last append "
                                   "(Kafka's ProducerIdCount)", self._producer_ids),
            "txlog.rocksdb": ("RocksDB figures by property: sst_bytes, blob_bytes, blob_garbage_bytes, memtable_bytes, "
                              "block_cache_bytes, block_cache_capacity_bytes, table_readers_bytes, "
                              "pending_compaction_bytes, delayed_write_rate, write_stopped", self._rocksdb),
        }
        for name, (description, callback) in gauges.items():
            meter.create_observable_gauge(name, [callback], description=description)

    def topic(self, name: str) -> dict:
        attributes = self._topics.get(name)
        if attributes is None:
            attributes = self._topics[name] = {"topic": name}
        return attributes

    def forget_topic(self, name: str) -> None:
        """A deleted topic: its cached labels go (its partitions' gauges stop
        with the partitions; its counters' series are cumulative and stay)."""
        self._topics.pop(name, None)
        for key in [key for key in self._refusals if key[1] == name]:
            del self._refusals[key]

    def produced(self, topic: str, records: int, size: int) -> None:
        attributes = self.topic(topic)
        self.produced_records.add(records, attributes)
        self.produced_bytes.add(size, attributes)

    def fetched(self, topic: str, records: int, size: int) -> None:
        attributes = self.topic(topic)
        self.fetched_records.add(records, attributes)
        self.fetched_bytes.add(size, attributes)

    def refused(self, method: str, topic: str, code: int) -> None:
        key = (method, topic, code)
        attributes = self._refusals.get(key)
        if attributes is None:
            attributes = self._refusals[key] = {"rpc.method": method, "topic": topic, "error_code": spec_of(code).name}
        self.partition_errors.add(1, attributes)

    def _leaders(self):
        return [p for p in self._partitions() if p.is_leader]

    @staticmethod
    def _labels(partition) -> dict:
        return {"topic": partition.topic, "partition": partition.index}

    def _high_watermarks(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(p.high_watermark, self._labels(p)) for p in self._leaders()]

    def _last_stable_offsets(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(p.last_stable_offset, self._labels(p)) for p in self._leaders()]

    def _committed_offsets(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(offset, {"group": group, "topic": topic, "partition": index})
                for group, topic, index, offset in self._group_offsets()]

    def _lso_lags(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(max(p.high_watermark - p.last_stable_offset, 0), self._labels(p)) for p in self._leaders()]

    def _aborted_transactions(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(sum(len(spans) for spans in p.aborted.values()), self._labels(p)) for p in self._leaders()]

    def _in_sync(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(len(p.replica_set.isr), self._labels(p)) for p in self._leaders()]

    def _led(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(len(self._leaders()))]

    def _under_replicated(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(sum(1 for p in self._leaders() if len(p.replica_set.isr) < len(p.replicas)))]

    def _offline_count(self, _: CallbackOptions) -> Iterable[Observation]:
        offline = self._offline()
        return [] if offline is None else [Observation(offline)]

    def _producer_ids(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(sum(len(p.producers) for p in self._partitions()))]

    def _rocksdb(self, _: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value, {"property": name}) for name, value in self._store_properties().items()]
