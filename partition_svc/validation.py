"""Checks of names, topic configurations and produced batches: pure, and run
before anything is changed, so bad input never alters stored data."""

from __future__ import annotations

from dataclasses import dataclass, field

from txlog.protocol import INTERNAL_TOPIC_PREFIX, PRODUCER_EPOCH_MAX, SEQUENCE_MAX, batch_format, compression
from txlog.protocol.batch_format import BatchFormatError, BatchHeader
from txlog.protocol.errors import ErrorCode, TxlogError
from txlog.protocol.names import check_group_id, check_topic_name  # noqa: F401 -- the name rules, re-exported
from txlog.v1 import common_pb2

TIMESTAMP_MS_MAX = 2**53
HEADERS_PER_RECORD_MAX = 1000
OFFSET_METADATA_BYTES_MAX = 4096

# Topic configuration keys, their defaults and checks (Kafka's names).
TOPIC_CONFIG_DEFAULTS = {
    "retention.ms": "-1",  # -1: keep forever
    "retention.bytes": "-1",  # -1: no size limit
    "max.record.bytes": str(1024 * 1024),
    "cleanup.policy": "delete",
    "min.insync.replicas": "1",  # acks=all needs this many in-sync replicas
    "unclean.leader.election.enable": "false",  # true: a replica outside the ISR may lead (may lose records)
    # producer: store each batch as its producer compressed it; uncompressed, gzip, zstd, lz4: store every
    # batch so (the leader re-encodes a batch produced otherwise, as Kafka's broker does).
    "compression.type": "producer",
}
TOPIC_COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "zstd", "lz4")
# Keys a topic may set whose default is the instance's setting (not stored with the topic, so a
# changed setting reaches every topic that does not set its own):
# delete.retention.ms: how long a compacted topic keeps a transaction's markers once none of its
# batches is left (partition_svc's --log-cleaner-delete-retention-ms, Kafka's log.cleaner.delete.retention.ms).
TOPIC_CONFIGS_DEFAULTED_BY_INSTANCE = ("delete.retention.ms",)
DELETE_RETENTION_MS_DEFAULT = 86_400_000  # a day, as Kafka's
TOPIC_CONFIG_KEYS = frozenset(TOPIC_CONFIG_DEFAULTS) | frozenset(TOPIC_CONFIGS_DEFAULTED_BY_INSTANCE)


def invalid(message: str, code: str = "INVALID_REQUEST") -> TxlogError:
    return TxlogError(ErrorCode.Value(code), message)


def check_partition_count(count: int, count_max: int) -> int:
    if not 1 <= count <= count_max:
        raise invalid(f"partition count must be 1..{count_max}, got {count}", "INVALID_PARTITIONS")
    return count


def _int_config(key: str, value: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise invalid(f"topic config {key}={value[:100]!r} is not an integer", "INVALID_CONFIG") from None
    if not low <= number <= high:
        raise invalid(f"topic config {key}={number} is out of range {low}..{high}", "INVALID_CONFIG")
    return number


def topic_configs(configs: dict[str, str], record_bytes_max: int, replication_factor: int = 1) -> dict[str, str]:
    """The full configuration of a new topic: defaults overlaid with ``configs``, checked."""
    unknown = sorted(set(configs) - TOPIC_CONFIG_KEYS)
    if unknown:
        raise invalid(f"unknown topic config {unknown[0][:100]!r}; known: {sorted(TOPIC_CONFIG_KEYS)}", "INVALID_CONFIG")
    merged = {**TOPIC_CONFIG_DEFAULTS, **configs}
    _int_config("retention.ms", merged["retention.ms"], -1, 2**62)
    if "delete.retention.ms" in merged:
        _int_config("delete.retention.ms", merged["delete.retention.ms"], 0, 2**62)
    _int_config("retention.bytes", merged["retention.bytes"], -1, 2**62)
    _int_config("max.record.bytes", merged["max.record.bytes"], 1, record_bytes_max)
    if merged["cleanup.policy"] not in ("delete", "compact"):
        raise invalid(f"topic config cleanup.policy must be delete or compact, not {merged['cleanup.policy'][:100]!r}", "INVALID_CONFIG")
    # Above the replication factor, acks=all could never be answered.
    _int_config("min.insync.replicas", merged["min.insync.replicas"], 1, replication_factor)
    if merged["unclean.leader.election.enable"] not in ("true", "false"):
        raise invalid("topic config unclean.leader.election.enable must be true or false, not "
                      f"{merged['unclean.leader.election.enable'][:100]!r}", "INVALID_CONFIG")
    if merged["compression.type"] not in TOPIC_COMPRESSION_TYPES:
        raise invalid(f"topic config compression.type must be one of {', '.join(TOPIC_COMPRESSION_TYPES)}, not "
                      f"{merged['compression.type'][:100]!r}", "INVALID_CONFIG")
    return merged


@dataclass(frozen=True)
class BatchLimits:
    records_per_batch_max: int
    batch_bytes_max: int


def record_bytes(record: common_pb2.Record) -> int:
    return len(record.key) + len(record.value) + sum(len(h.key) + len(h.value) for h in record.headers)


PRODUCER_FIELDS = ("producer_id", "producer_epoch", "base_sequence")


def check_batch(batch: common_pb2.RecordBatch, limits: BatchLimits, topic: str = "") -> None:
    """Raises a TxlogError naming what is wrong with a produced batch's frame
    (its records are checked as the leader gives them offsets:
    :func:`check_record` and :func:`check_sizes`). A batch that leaves all of
    its producer fields out is non-idempotent: they are set to -1 here, the
    form it is stored and read back in. A compressed batch is opened here:
    its records are decompressed (at most batch_bytes_max bytes) into
    ``records`` so that every check counts and reads them as a plain batch's;
    compression and compressed_records stay (see Partition._append)."""
    if batch.compression != common_pb2.COMPRESSION_NONE or batch.compressed_records:
        open_compressed(batch, limits, topic)
    count = len(batch.records)
    if count == 0:
        raise invalid("a batch needs at least one record")
    if count > limits.records_per_batch_max:
        raise invalid(f"a batch holds {count} records, more than the limit {limits.records_per_batch_max}", "BATCH_TOO_LARGE")
    if batch.control_type != common_pb2.CONTROL_TYPE_DATA or batch.coordinator_epoch != 0:
        raise invalid("producers may not send control batches (control_type and coordinator_epoch are the leader's)")
    given = [name for name in PRODUCER_FIELDS if batch.HasField(name)]
    if given and len(given) < len(PRODUCER_FIELDS):
        missing = [name for name in PRODUCER_FIELDS if name not in given]
        raise invalid(f"a batch sets {', '.join(given)} but not {', '.join(missing)}: an idempotent batch sets all "
                      "three, a non-idempotent one none (or all -1)")
    if not given:  # a non-idempotent batch: stored, and read back, with -1 in all three
        batch.producer_id = batch.producer_epoch = batch.base_sequence = -1
    check_producer_fields(batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.is_transactional)


def produced_batch(item, limits: BatchLimits) -> common_pb2.RecordBatch | EncodedBatch:
    """A PartitionBatch's batch, checked: its ``batch`` message (check_batch) or
    its ``encoded_batch`` (check_encoded), exactly one of them."""
    if item.encoded_batch:
        if item.HasField("batch"):
            raise invalid("a PartitionBatch sets batch and encoded_batch; set exactly one")
        return check_encoded(item.encoded_batch, limits, item.topic)
    check_batch(item.batch, limits, item.topic)
    return item.batch


def check_producer_fields(producer_id: int, producer_epoch: int, base_sequence: int, is_transactional: bool) -> None:
    if producer_id == -1:
        if producer_epoch != -1 or base_sequence != -1 or is_transactional:
            raise invalid("a batch without a producer id needs producer_epoch and base_sequence left out (or -1) "
                          "and is not transactional")
    elif producer_id < 0:
        raise invalid(f"producer_id must be -1 or >= 0, got {producer_id}")
    else:
        if not 0 <= producer_epoch <= PRODUCER_EPOCH_MAX:
            raise invalid(f"producer_epoch must be 0..{PRODUCER_EPOCH_MAX}, got {producer_epoch}")
        if not 0 <= base_sequence <= SEQUENCE_MAX:
            raise invalid(f"base_sequence must be 0..{SEQUENCE_MAX}, got {base_sequence}")


@dataclass(frozen=True)
class EncodedBatch:
    """A produced batch in the encoded format (PartitionBatch.encoded_batch),
    its header, CRC and records checked by :func:`check_encoded`. It answers
    the producer fields a RecordBatch does, so the producer rules read either."""

    data: bytes
    header: BatchHeader
    parsed: common_pb2.RecordBatch = field(repr=False)  # its records (decompressed), for the rules that read them

    @property
    def producer_id(self) -> int:
        return self.header.producer_id

    @property
    def producer_epoch(self) -> int:
        return self.header.producer_epoch

    @property
    def base_sequence(self) -> int:
        return self.header.base_sequence

    @property
    def is_transactional(self) -> bool:
        return self.header.is_transactional

    @property
    def records(self):
        return self.parsed.records

    @property
    def plain_bytes(self) -> int:
        """The records' serialized size, uncompressed: what batch_bytes_max and max.record.bytes bound."""
        return self.parsed.ByteSize() if self.header.compression else len(self.data) - batch_format.HEADER_BYTES


def check_encoded(data: bytes, limits: BatchLimits, topic: str) -> EncodedBatch:
    """Raises a TxlogError naming what is wrong with an encoded batch: its
    header (the format, the attributes, the producer fields), its CRC32C
    (CORRUPT_MESSAGE: damaged on the way, a retry may pass) and its records
    (a well-formed section of exactly the count the header says, within
    batch_bytes_max). Each record's size is checked as the leader gives the
    batch offsets (log_core.encode_encoded); its timestamp and headers are the
    producer's, as Kafka's broker takes a v2 batch's (the header's
    max_timestamp_ms, which retention and ListOffsets read, is checked)."""
    if topic.startswith(INTERNAL_TOPIC_PREFIX):
        raise invalid(f"internal topic {topic!r} takes batches as RecordBatch messages (PartitionBatch.batch) only")
    try:
        header = batch_format.header_of(data)
    except BatchFormatError as exc:
        raise invalid(str(exc), "INVALID_RECORD") from None
    try:
        batch_format.check_crc(data, header)
    except BatchFormatError as exc:
        raise invalid(str(exc), "CORRUPT_MESSAGE") from None
    if header.attributes & ~batch_format.KNOWN_ATTRIBUTES or header.attributes < 0:
        raise invalid(f"attributes {header.attributes:#06x} set bits this format does not define (known: "
                      f"{batch_format.KNOWN_ATTRIBUTES:#06x}); producers may not send control batches", "INVALID_RECORD")
    if header.compression and header.compression not in compression.CODECS:
        raise invalid(f"unknown compression {header.compression}; known: {sorted(compression.CODECS)}")
    count = header.record_count
    if count < 1:
        raise invalid(f"a batch needs at least one record (last_offset_delta {header.last_offset_delta})")
    if count > limits.records_per_batch_max:
        raise invalid(f"a batch holds {count} records, more than the limit {limits.records_per_batch_max}", "BATCH_TOO_LARGE")
    check_producer_fields(header.producer_id, header.producer_epoch, header.base_sequence, header.is_transactional)
    if not 0 <= header.max_timestamp_ms <= TIMESTAMP_MS_MAX:
        raise invalid(f"max_timestamp_ms {header.max_timestamp_ms} is out of range 0..2^53", "INVALID_TIMESTAMP")
    section_bytes = len(data) - batch_format.HEADER_BYTES
    if not header.compression and section_bytes > limits.batch_bytes_max:
        raise invalid(f"a batch of {section_bytes} bytes is larger than the limit {limits.batch_bytes_max}", "BATCH_TOO_LARGE")
    try:
        parsed = batch_format.open_records(data, header, limits.batch_bytes_max)
    except BatchFormatError as exc:
        raise invalid(str(exc), "INVALID_RECORD") from None
    return EncodedBatch(data, header, parsed)


def open_compressed(batch: common_pb2.RecordBatch, limits: BatchLimits, topic: str) -> None:
    """Decompresses a compressed batch's records into its ``records``, or raises."""
    if batch.compression not in compression.CODECS:
        if batch.compression == common_pb2.COMPRESSION_NONE:
            raise invalid("a batch with compression COMPRESSION_NONE has its records in records, not compressed_records")
        raise invalid(f"unknown compression {batch.compression}; known: {sorted(compression.CODECS)}")
    if batch.records:
        raise invalid("a compressed batch has its records in compressed_records only, and records empty")
    if topic.startswith(INTERNAL_TOPIC_PREFIX):
        raise invalid(f"internal topic {topic!r} takes uncompressed batches only")
    try:
        inner = compression.open_records(batch, limits.batch_bytes_max)
    except compression.CompressionError as exc:
        raise invalid(str(exc), "INVALID_RECORD") from None
    batch.records.MergeFrom(inner.records)


def stored_compression(topic: str, configs: dict[str, str], produced: int) -> int:
    """The codec a batch produced with ``produced`` is stored with: the topic's
    compression.type, or the producer's for ``producer``; never compressed in an
    internal topic (its readers, the services themselves, read records)."""
    wanted = configs.get("compression.type", "producer")
    if topic.startswith(INTERNAL_TOPIC_PREFIX):
        return common_pb2.COMPRESSION_NONE
    if wanted == "producer":
        return produced
    return compression.CODEC_BY_NAME["none" if wanted == "uncompressed" else wanted]


def check_record(index: int, record: common_pb2.Record) -> None:
    if not 0 <= record.timestamp_ms <= TIMESTAMP_MS_MAX:
        raise invalid(f"record {index}: timestamp_ms {record.timestamp_ms} is out of range 0..2^53", "INVALID_TIMESTAMP")
    if len(record.headers) > HEADERS_PER_RECORD_MAX:
        raise invalid(f"record {index} has {len(record.headers)} headers, more than {HEADERS_PER_RECORD_MAX}", "INVALID_RECORD")


def check_sizes(batch: common_pb2.RecordBatch, batch_bytes: int, limits: BatchLimits, record_bytes_max: int) -> None:
    """``batch_bytes``: the batch's serialized size, which bounds every record's."""
    if batch_bytes > limits.batch_bytes_max:
        raise invalid(f"a batch of {batch_bytes} bytes is larger than the limit {limits.batch_bytes_max}", "BATCH_TOO_LARGE")
    if batch_bytes <= record_bytes_max:
        return  # no record can be larger than the batch holding it
    if max(map(common_pb2.Record.ByteSize, batch.records)) <= record_bytes_max:
        return  # nor larger than its own encoding: one C call a record, a third of counting each field here
    for index, record in enumerate(batch.records):
        size = record_bytes(record)
        if size > record_bytes_max:
            raise invalid(f"record {index} is {size} bytes, larger than max.record.bytes {record_bytes_max}", "RECORD_TOO_LARGE")
