"""Settings of the client objects, validated in one place, each with its limit.

Names carry their unit last (``linger_ms``, ``batch_size_bytes``); defaults
follow Kafka's producer and consumer where txlog has the same notion, except
``batch_size_bytes`` (1 MiB: txlog batches are protobuf messages, cheaper in
bigger units). An out-of-range setting raises ValueError naming the setting,
its limit and the value given.
"""

from __future__ import annotations

from dataclasses import dataclass

from txlog.protocol import compression

ACKS_BY_NAME = {"all": -1, "-1": -1, -1: -1, "1": 1, 1: 1, "0": 0, 0: 0}
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
OFFSET_RESETS = ("earliest", "latest", "none")

# Upper limits of the settings (put a limit on everything).
LINGER_MS_MAX = 60_000
BATCH_SIZE_BYTES_MAX = 64 * 1024 * 1024
BATCH_RECORDS_MAX = 100_000  # partition_svc's records_per_batch_max default
MAX_IN_FLIGHT_IDEMPOTENT_MAX = 5  # the leader's duplicate cache holds the last 5 batches
MAX_IN_FLIGHT_MAX = 100
REQUEST_TIMEOUT_MS_MAX = 600_000
DELIVERY_TIMEOUT_MS_MAX = 24 * 3600 * 1000
BUFFER_MEMORY_BYTES_MAX = 16 * 1024**3
MAX_REQUEST_SIZE_BYTES_MAX = 64 * 1024 * 1024
MAX_BLOCK_MS_MAX = 3600 * 1000
TRANSACTIONAL_ID_CHARS_MAX = 255  # the coordinator also checks the characters ([a-zA-Z0-9._:-])
TRANSACTION_TIMEOUT_MS_MAX = 2**31 - 1  # int32 on the wire; the coordinator's own maximum is lower (15 min)
PREPARE_METADATA_BYTES_MAX = 4096  # PrepareTransactionRequest.prepare_metadata; the coordinator refuses more
MAX_POLL_RECORDS_MAX = 1_000_000
FETCH_MAX_BYTES_MAX = 64 * 1024 * 1024
FETCH_MAX_WAIT_MS_MAX = 60_000


def _check_range(name: str, value, low, high) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, not {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be within [{low}, {high}], not {value}")


def checked_prepare_metadata(metadata) -> bytes:
    """``prepare_transaction(metadata=)``: bytes (or a bytearray) of at most
    PREPARE_METADATA_BYTES_MAX, as bytes; TypeError or ValueError otherwise."""
    if not isinstance(metadata, (bytes, bytearray)):
        hint = " (encode a str first, e.g. metadata=text.encode())" if isinstance(metadata, str) else ""
        raise TypeError(f"metadata must be bytes, not {type(metadata).__name__}{hint}")
    if len(metadata) > PREPARE_METADATA_BYTES_MAX:
        raise ValueError(f"metadata must be at most {PREPARE_METADATA_BYTES_MAX} bytes, not {len(metadata)}")
    return bytes(metadata)


@dataclass(frozen=True)
class ProducerConfig:
    enable_idempotence: bool = True
    acks: int = -1
    linger_ms: float = 5
    batch_size_bytes: int = 1_048_576
    batch_records_max: int = 10_000
    max_in_flight: int = 5
    retries: int = 2**31 - 1
    retry_backoff_ms: float = 100
    retry_backoff_max_ms: float = 1000
    delivery_timeout_ms: float = 120_000
    request_timeout_ms: float = 30_000
    max_request_size_bytes: int = 4 * 1024 * 1024
    buffer_memory_bytes: int = 32 * 1024 * 1024
    max_block_ms: float = 60_000
    metadata_max_age_ms: float = 300_000
    transactional_id: str | None = None
    transaction_timeout_ms: int = 60_000
    compression_type: str = "none"  # Kafka's name: none, gzip, zstd or lz4 (txlog.protocol.compression)
    # Transactions V2 (KIP-890 part 2): partition leaders add the partitions a transaction
    # produces to; False: AddPartitionsToTxn first, for clusters older than add_to_transaction
    implicit_partition_adds: bool = True

    @property
    def compression(self) -> int:
        """The RecordBatch.compression of compression_type."""
        return compression.codec_named(self.compression_type)

    @staticmethod
    def parse_acks(acks) -> int:
        if acks not in ACKS_BY_NAME:
            raise ValueError(f"acks must be 'all' (or -1), 1 or 0, not {acks!r}")
        return ACKS_BY_NAME[acks]

    def __post_init__(self):
        if self.acks not in (-1, 0, 1):
            raise ValueError(f"acks must be -1 (all), 1 or 0, not {self.acks!r}")
        if self.enable_idempotence and self.acks != -1:
            raise ValueError("enable_idempotence=True needs acks='all' (as in Kafka); "
                             "set enable_idempotence=False for acks=0 or 1")
        _check_range("linger_ms", self.linger_ms, 0, LINGER_MS_MAX)
        _check_range("max_request_size_bytes", self.max_request_size_bytes, 1024, MAX_REQUEST_SIZE_BYTES_MAX)
        _check_range("batch_size_bytes", self.batch_size_bytes, 1, min(BATCH_SIZE_BYTES_MAX, self.max_request_size_bytes))
        _check_range("batch_records_max", self.batch_records_max, 1, BATCH_RECORDS_MAX)
        in_flight_max = MAX_IN_FLIGHT_IDEMPOTENT_MAX if self.enable_idempotence else MAX_IN_FLIGHT_MAX
        _check_range("max_in_flight", self.max_in_flight, 1, in_flight_max)
        _check_range("retries", self.retries, 0, 2**31 - 1)
        _check_range("retry_backoff_ms", self.retry_backoff_ms, 0, 60_000)
        _check_range("retry_backoff_max_ms", self.retry_backoff_max_ms, self.retry_backoff_ms, 600_000)
        _check_range("request_timeout_ms", self.request_timeout_ms, 1, REQUEST_TIMEOUT_MS_MAX)
        _check_range("delivery_timeout_ms", self.delivery_timeout_ms, self.linger_ms + self.request_timeout_ms,
                     DELIVERY_TIMEOUT_MS_MAX)
        _check_range("buffer_memory_bytes", self.buffer_memory_bytes, self.batch_size_bytes, BUFFER_MEMORY_BYTES_MAX)
        _check_range("max_block_ms", self.max_block_ms, 0, MAX_BLOCK_MS_MAX)
        _check_range("metadata_max_age_ms", self.metadata_max_age_ms, 0, 24 * 3600 * 1000)
        if self.transactional_id is not None:
            if not isinstance(self.transactional_id, str) or not 0 < len(self.transactional_id) \
                    <= TRANSACTIONAL_ID_CHARS_MAX:
                raise ValueError(f"transactional_id must be a str of 1 to {TRANSACTIONAL_ID_CHARS_MAX} characters "
                                 f"or None, not {self.transactional_id!r}")
            if not self.enable_idempotence:
                raise ValueError("a transactional producer is idempotent: transactional_id needs "
                                 "enable_idempotence=True (and acks='all'), as in Kafka")
        if isinstance(self.transaction_timeout_ms, float) or not isinstance(self.transaction_timeout_ms, int):
            raise ValueError(f"transaction_timeout_ms must be an int, not {self.transaction_timeout_ms!r}")
        _check_range("transaction_timeout_ms", self.transaction_timeout_ms, 1, TRANSACTION_TIMEOUT_MS_MAX)
        self.compression  # noqa: B018 -- raises ValueError naming the choices


@dataclass(frozen=True)
class ConsumerConfig:
    group_id: str | None = None
    isolation_level: str = "read_committed"
    auto_offset_reset: str = "earliest"
    enable_auto_commit: bool = False
    auto_commit_interval_ms: float = 5000
    max_poll_records: int = 500
    fetch_max_bytes: int = 50 * 1024 * 1024
    max_partition_fetch_bytes: int = 1024 * 1024
    fetch_max_wait_ms: float = 500
    request_timeout_ms: float = 30_000
    retry_backoff_ms: float = 100
    default_api_timeout_ms: float = 60_000
    metadata_max_age_ms: float = 300_000
    include_transaction_outcomes: bool = False

    def __post_init__(self):
        if self.group_id is not None and (not isinstance(self.group_id, str) or not self.group_id):
            raise ValueError(f"group_id must be a non-empty str or None, not {self.group_id!r}")
        if self.isolation_level not in ISOLATION_LEVELS:
            raise ValueError(f"isolation_level must be one of {ISOLATION_LEVELS}, not {self.isolation_level!r}")
        if self.auto_offset_reset not in OFFSET_RESETS:
            raise ValueError(f"auto_offset_reset must be one of {OFFSET_RESETS}, not {self.auto_offset_reset!r}")
        if self.enable_auto_commit and self.group_id is None:
            raise ValueError("enable_auto_commit=True needs a group_id")
        if not isinstance(self.include_transaction_outcomes, bool):
            raise ValueError(f"include_transaction_outcomes must be True or False, not {self.include_transaction_outcomes!r}")
        if self.include_transaction_outcomes and self.isolation_level != "read_uncommitted":
            raise ValueError("include_transaction_outcomes=True needs isolation_level='read_uncommitted': "
                             "read_committed returns only committed records")
        _check_range("auto_commit_interval_ms", self.auto_commit_interval_ms, 1, 24 * 3600 * 1000)
        _check_range("max_poll_records", self.max_poll_records, 1, MAX_POLL_RECORDS_MAX)
        _check_range("fetch_max_bytes", self.fetch_max_bytes, 1024, FETCH_MAX_BYTES_MAX)
        _check_range("max_partition_fetch_bytes", self.max_partition_fetch_bytes, 1024, FETCH_MAX_BYTES_MAX)
        _check_range("fetch_max_wait_ms", self.fetch_max_wait_ms, 0, FETCH_MAX_WAIT_MS_MAX)
        _check_range("request_timeout_ms", self.request_timeout_ms, self.fetch_max_wait_ms + 1, REQUEST_TIMEOUT_MS_MAX)
        _check_range("retry_backoff_ms", self.retry_backoff_ms, 0, 60_000)
        _check_range("default_api_timeout_ms", self.default_api_timeout_ms, 1, REQUEST_TIMEOUT_MS_MAX)
        _check_range("metadata_max_age_ms", self.metadata_max_age_ms, 0, 24 * 3600 * 1000)
