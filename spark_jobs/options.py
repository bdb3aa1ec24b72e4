"""The options of the ``txlog`` data source, parsed and checked on the driver.

Every mistake in the options is reported here, before Spark plans a task, as an
``OptionError`` naming the option and what was wrong with it.

Every option either takes is known here (``READ_OPTIONS``, ``WRITE_OPTIONS``,
with the spark-sql-kafka names that mean the same in ``READ_ALIASES`` and
``WRITE_ALIASES``): any other option is refused, with the txlog option to use
instead where there is one. Spark hands the options over case-insensitively
(keys may arrive lower-cased): names are matched regardless of case.

Offsets given as JSON follow Spark's Kafka source: ``{"topic": {"0": 23, "1": -2}}``
where ``-2`` means the earliest offset and ``-1`` the latest (the last stable
offset under read_committed, the high watermark under read_uncommitted).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from txlog.protocol import names
from txlog.structs import TransactionHandle

EARLIEST = -2
LATEST = -1
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
TRANSACTIONAL_ID_PREFIX_RE = re.compile(r"[a-zA-Z0-9._-]{1,200}")  # fullmatch: "$" would let a trailing newline in
COMMITTED_PREFIX = "committed:"


class OptionError(ValueError):
    """A data source option is missing or malformed."""


@dataclass(frozen=True)
class StartingOffsets:
    """Where reading starts: ``per_partition`` offsets, else the ``group``'s
    committed offsets (earliest where it has none), else ``default``."""

    default: int = EARLIEST
    group: str | None = None
    per_partition: Mapping[tuple[str, int], int] | None = None


@dataclass(frozen=True)
class EndingOffsets:
    default: int = LATEST
    per_partition: Mapping[tuple[str, int], int] | None = None


TLS_OPTIONS = {"tlsCa": "tls_ca", "tlsCert": "tls_cert", "tlsKey": "tls_key", "tokenFile": "token_file"}  # option -> the SDK's keyword

# Every option the reader and the writer take, and nothing else: anything else is refused (see _known).
READ_OPTIONS = ("bootstrap", "topic", "startingOffsets", "endingOffsets", "isolation", "maxRecordsPerSplit",
                "maxRecordsPerTrigger", "failOnDataLoss", "pollTimeoutMs", *TLS_OPTIONS)
# checkpointLocation, queryName: Spark hands a streaming query's to its sink with the other options
WRITE_OPTIONS = ("bootstrap", "topic", "transactionalIdPrefix", "transactionTimeoutMs", "preparedTimeoutMs",
                 "groupCommitWith", "checkpointLocation", "queryName", *TLS_OPTIONS)
# spark-sql-kafka's names for the same settings, accepted as they are (alias -> txlog's option).
# subscribe takes a comma-separated list of topics, as txlog's topic does on a read.
READ_ALIASES = {"kafka.bootstrap.servers": "bootstrap", "subscribe": "topic", "kafka.isolation.level": "isolation",
                "maxOffsetsPerTrigger": "maxRecordsPerTrigger"}
WRITE_ALIASES = {"kafka.bootstrap.servers": "bootstrap"}
# What only a streaming read or write takes, and what only a batch one takes.
STREAM_ONLY_READ, BATCH_ONLY_READ = ("maxRecordsPerTrigger",), ("endingOffsets",)
STREAM_ONLY_WRITE, BATCH_ONLY_WRITE = ("checkpointLocation", "queryName"), ("groupCommitWith",)

_TRIGGERS = ("txlog has no equivalent: a txlog stream bounds each micro-batch by 'maxRecordsPerTrigger' (offsets "
             "over all partitions) and nothing else")
_BY_TIME = ("txlog has no equivalent: give offsets in 'startingOffsets' / 'endingOffsets' (JSON), or move a "
            "group with `txlog groups reset-offsets GROUP --to-datetime ...` and read with "
            "startingOffsets=committed:GROUP")
_NO_GROUP = ("txlog has no equivalent: a txlog read joins no consumer group; to start where a group's committed "
             "offsets are, use startingOffsets=committed:GROUP")
_SECURITY = ("txlog has no equivalent: txlog's client turns TLS on with 'tlsCa' (a PEM CA bundle) and "
             "authenticates with 'tlsCert' and 'tlsKey' (PEM, mutual TLS) or with 'tokenFile' (a bearer token)")
# spark-sql-kafka options (lower-cased) that txlog does not accept: (Kafka's spelling, what to do instead).
KAFKA_OPTIONS = {name.lower(): (name, advice) for name, advice in [
    ("assign", "txlog has no equivalent: a read covers every partition of the topics in 'topic' (JSON "
               "'startingOffsets' / 'endingOffsets' set each partition's range)"),
    ("subscribePattern", "txlog has no equivalent: name the topics in 'topic' (comma-separated)"),
    ("minOffsetsPerTrigger", _TRIGGERS), ("maxTriggerDelay", _TRIGGERS),
    ("startingOffsetsByTimestamp", _BY_TIME), ("endingOffsetsByTimestamp", _BY_TIME),
    ("startingTimestamp", _BY_TIME), ("endingTimestamp", _BY_TIME), ("startingOffsetsByTimestampStrategy", _BY_TIME),
    ("maxRecordsPerPartition", "use txlog's 'maxRecordsPerSplit', which means the same"),
    ("minPartitions", "txlog has no equivalent: 'maxRecordsPerSplit' splits each partition's range into tasks "
                      "of at most that many offsets"),
    ("kafkaConsumer.pollTimeoutMs", "use txlog's 'pollTimeoutMs' (a task without progress for this long fails)"),
    ("fetchOffset.numRetries", "txlog has no equivalent: offset lookups retry inside the txlog client"),
    ("fetchOffset.retryIntervalMs", "txlog has no equivalent: offset lookups retry inside the txlog client"),
    ("groupIdPrefix", _NO_GROUP), ("kafka.group.id", _NO_GROUP),
    ("includeHeaders", "txlog has no equivalent and needs none: the 'headers' column is always read, and "
                       "written when the DataFrame has it"),
    ("kafka.transactional.id", "txlog has no equivalent: with 'transactionalIdPrefix' a write is one atomic "
                               "transaction group"),
    ("kafka.security.protocol", _SECURITY),
]}
_KAFKA_PREFIXES = {"kafka.ssl.": _SECURITY, "kafka.sasl.": _SECURITY}


@dataclass(frozen=True)
class ReadOptions:
    bootstrap: str
    topics: tuple[str, ...]
    starting: StartingOffsets
    ending: EndingOffsets
    isolation: str
    max_records_per_split: int | None
    fail_on_data_loss: bool
    poll_timeout_s: float
    client_tls: Mapping[str, str] = field(default_factory=dict)  # the SDK's tls_ca= / tls_cert= / tls_key=
    max_records_per_trigger: int | None = None  # a streaming read's micro-batch bound, in offsets


@dataclass(frozen=True)
class WriteOptions:
    bootstrap: str
    topic: str
    transactional_id_prefix: str | None
    transaction_timeout_ms: int
    prepared_timeout_ms: int = 0  # 0: the coordinators' prepared_transaction_timeout_ms
    group_commit_with: tuple = ()  # TransactionHandles committed together with the write's own
    client_tls: Mapping[str, str] = field(default_factory=dict)  # the SDK's tls_ca= / tls_cert= / tls_key=


def _unknown(given: str, mode: str) -> str:
    """Why ``given`` (as Spark passed it: maybe lower-cased) is refused by a ``mode`` ("read" or "write")."""
    lowered = given.lower()
    names, aliases = (READ_OPTIONS, READ_ALIASES) if mode == "read" else (WRITE_OPTIONS, WRITE_ALIASES)
    other_mode, (other_names, other_aliases) = (("write", (WRITE_OPTIONS, WRITE_ALIASES)) if mode == "read"
                                                else ("read", (READ_OPTIONS, READ_ALIASES)))
    for name in (*other_names, *other_aliases):
        if name.lower() == lowered:
            instead = other_aliases.get(name)
            hint = f"; use {instead!r}" if instead in names else ""
            return f"txlog: option {name!r} is a {other_mode} option: a {mode} does not take it{hint}"
    if lowered == "path":
        return f"txlog: a {mode} takes no path (load() / save() without one): name the topic in 'topic'"
    if lowered in KAFKA_OPTIONS:
        kafka_name, advice = KAFKA_OPTIONS[lowered]
        return f"txlog: unknown option {kafka_name!r} (a spark-sql-kafka option): {advice}"
    for prefix, advice in _KAFKA_PREFIXES.items():
        if lowered.startswith(prefix):
            return f"txlog: unknown option {given!r} (a Kafka client setting): {advice}"
    candidates = {name.lower(): name for name in (*names, *aliases)}
    close = difflib.get_close_matches(lowered, candidates, n=1)
    if close:
        return f"txlog: unknown option {given!r}: did you mean {candidates[close[0]]!r}?"
    if lowered.startswith("kafka."):
        return (f"txlog: unknown option {given!r} (a Kafka client setting): txlog has no equivalent; "
                f"the {mode} options are {', '.join(names)}")
    return f"txlog: unknown option {given!r}: the {mode} options are {', '.join(names)}"


def _known(options: Mapping[str, str], mode: str) -> tuple[dict[str, str], dict[str, str]]:
    """``options`` keyed by txlog's own spelling of each option (whatever case and
    alias they were given in), and which were given by another name (txlog's ->
    given); an unknown option, or one setting given twice with different values, is an OptionError."""
    names, aliases = (READ_OPTIONS, READ_ALIASES) if mode == "read" else (WRITE_OPTIONS, WRITE_ALIASES)
    canonical = {name.lower(): name for name in names} | {alias.lower(): name for alias, name in aliases.items()}
    known: dict[str, str] = {}
    first_given: dict[str, str] = {}
    unknown = []
    for given, value in options.items():
        given = str(given)
        name = canonical.get(given.lower())
        if name is None:
            unknown.append(_unknown(given, mode))
        elif name not in known:
            known[name], first_given[name] = value, given
        elif str(known[name]).strip() != str(value).strip():
            shown = [n if n.lower() == name.lower() else n.lower() for n in (first_given[name], given)]
            raise OptionError(f"txlog: options {shown[0]!r} and {shown[1]!r} both set {name!r}, to different values "
                              f"({known[name]!r} and {value!r}): give one of them")
    if unknown:
        raise OptionError("\n".join(unknown))
    given_as = {name: given.lower() for name, given in first_given.items() if given.lower() != name.lower()}
    return known, given_as


def _named_as_given(error: OptionError, given_as: dict[str, str]) -> OptionError:
    """``error`` naming an option given by its spark-sql-kafka alias as the alias, with txlog's name."""
    message = str(error)
    for name, alias in given_as.items():
        message = message.replace(f"option {name!r}", f"option {alias!r} (txlog's {name!r})")
    return OptionError(message)


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()  # str.isdigit alone takes "²", which int() refuses


def _required(options: Mapping[str, str], name: str) -> str:
    value = options.get(name)
    if value is None or not str(value).strip():
        raise OptionError(f"txlog: option {name!r} is required")
    return str(value).strip()


def _bootstrap(options: Mapping[str, str]) -> str:
    value = _required(options, "bootstrap")
    for address in value.split(","):
        host, sep, port = address.strip().rpartition(":")
        if not sep or not host or not _is_number(port) or not 0 < int(port) < 65536:
            raise OptionError(f"txlog: option 'bootstrap' must be host:port[,host:port...], not {value!r}")
    return value


def _client_tls(options: Mapping[str, str]) -> dict[str, str]:
    """tlsCa / tlsCert / tlsKey (PEM) and tokenFile (a bearer token): files
    on every machine that runs the job (the driver checks them here;
    executors read the same paths)."""
    given = {keyword: str(options[name]).strip() for name, keyword in TLS_OPTIONS.items() if options.get(name)}
    if ("tls_cert" in given) != ("tls_key" in given):
        raise OptionError("txlog: options 'tlsCert' and 'tlsKey' go together: give both, or neither")
    if "token_file" in given and "tls_ca" not in given:
        raise OptionError("txlog: option 'tokenFile' needs 'tlsCa': a bearer token is sent only over TLS")
    for name, keyword in TLS_OPTIONS.items():
        if keyword in given and not os.access(given[keyword], os.R_OK):
            raise OptionError(f"txlog: option {name!r}: {given[keyword]!r} is not a readable file")
    return given


def _positive_int(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    text = options.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"txlog: option {name!r} must be a positive integer, not {text!r}") from None
    if value <= 0:
        raise OptionError(f"txlog: option {name!r} must be a positive integer, not {text!r}")
    return value


def _boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name)
    if text is None:
        return default
    lowered = str(text).strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(f"txlog: option {name!r} must be true or false, not {text!r}")
    return lowered == "true"


def _offsets_json(name: str, text: str, topics: tuple[str, ...], allowed_special: tuple[int, ...]) -> dict:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(f"txlog: option {name!r} is not valid JSON ({exc.msg} at character {exc.pos}): {text!r}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"txlog: option {name!r} must be a JSON object {{topic: {{partition: offset}}}}, not {text!r}")
    offsets = {}
    for topic, partitions in parsed.items():
        if topic not in topics:
            raise OptionError(f"txlog: option {name!r} names topic {topic!r}, which is not among the topics read {list(topics)}")
        if not isinstance(partitions, dict) or not partitions:
            raise OptionError(f"txlog: option {name!r}: topic {topic!r} must map partition numbers to offsets")
        for partition, offset in partitions.items():
            if not _is_number(str(partition)):
                raise OptionError(f"txlog: option {name!r}: {partition!r} of topic {topic!r} is not a partition number")
            if not isinstance(offset, int) or isinstance(offset, bool) or (offset < 0 and offset not in allowed_special):
                allowed = " or ".join(str(s) for s in allowed_special)
                raise OptionError(f"txlog: option {name!r}: offset {offset!r} of {topic}-{partition} must be >= 0 or {allowed}")
            offsets[(topic, int(partition))] = offset
    return offsets


def parse_read(options: Mapping[str, str], streaming: bool = False) -> ReadOptions:
    """The read's options (as Spark passes them: any case, spark-sql-kafka aliases) parsed and checked;
    ``streaming``: for spark.readStream."""
    known, given_as = _known(options, "read")
    try:
        _check_kind(known, "read", streaming, STREAM_ONLY_READ, BATCH_ONLY_READ)
        return _parse_read(known)
    except OptionError as error:
        raise _named_as_given(error, given_as) from None


def _check_kind(known: Mapping[str, str], mode: str, streaming: bool, stream_only: tuple, batch_only: tuple) -> None:
    """A streaming read or write refuses what only a batch one takes, and the other way round."""
    for name in batch_only if streaming else stream_only:
        if name in known:
            kind, other = ("streaming", "batch") if streaming else ("batch", "streaming")
            why = {"endingOffsets": "a stream has no end: each micro-batch reads up to what is there when it is "
                                    "planned; bound it with 'maxRecordsPerTrigger'",
                   "maxRecordsPerTrigger": "a batch read has no triggers: bound it with 'endingOffsets'",
                   "groupCommitWith": "each micro-batch commits its own tasks' transactions with its batch id",
                   "checkpointLocation": "a batch write has no checkpoint: with 'transactionalIdPrefix' it commits "
                                         "atomically as it is",
                   "queryName": "a batch write is no streaming query"}[name]
            raise OptionError(f"txlog: option {name!r} is a {other} {mode} option: a {kind} {mode} does not take "
                              f"it ({why})")


def _parse_read(options: Mapping[str, str]) -> ReadOptions:
    bootstrap = _bootstrap(options)
    topics = tuple(t.strip() for t in _required(options, "topic").split(","))
    if any(not t for t in topics) or len(set(topics)) != len(topics):
        raise OptionError(f"txlog: option 'topic' must be a comma-separated list of distinct topic names, not {options['topic']!r}")

    starting_text = str(options.get("startingOffsets", "earliest")).strip()
    if starting_text == "earliest":
        starting = StartingOffsets(EARLIEST)
    elif starting_text == "latest":
        starting = StartingOffsets(LATEST)
    elif starting_text.startswith(COMMITTED_PREFIX):
        group = starting_text[len(COMMITTED_PREFIX):]
        if not group:
            raise OptionError("txlog: option 'startingOffsets' committed:<group> needs a group name")
        starting = StartingOffsets(EARLIEST, group=group)
    else:
        starting = StartingOffsets(EARLIEST, per_partition=_offsets_json(
            "startingOffsets", starting_text, topics, (EARLIEST, LATEST)))

    ending_text = str(options.get("endingOffsets", "latest")).strip()
    if ending_text == "latest":
        ending = EndingOffsets(LATEST)
    elif ending_text == "earliest":
        raise OptionError("txlog: option 'endingOffsets' cannot be 'earliest' (that reads nothing); use 'latest' or JSON")
    else:
        ending = EndingOffsets(LATEST, per_partition=_offsets_json("endingOffsets", ending_text, topics, (LATEST,)))

    isolation = str(options.get("isolation", "read_committed")).strip()
    if isolation not in ISOLATION_LEVELS:
        raise OptionError(f"txlog: option 'isolation' must be one of {ISOLATION_LEVELS}, not {isolation!r}")
    return ReadOptions(
        bootstrap=bootstrap, topics=topics, starting=starting, ending=ending, isolation=isolation,
        max_records_per_split=_positive_int(options, "maxRecordsPerSplit", None),
        fail_on_data_loss=_boolean(options, "failOnDataLoss", True),
        poll_timeout_s=float(_positive_int(options, "pollTimeoutMs", 120_000)) / 1000,
        client_tls=_client_tls(options),
        max_records_per_trigger=_positive_int(options, "maxRecordsPerTrigger", None),
    )


def _transaction_timeout_ms(options: Mapping[str, str]) -> int:
    from txlog.admin import MAX_TRANSACTION_TIMEOUT_MS_DEFAULT

    value = _positive_int(options, "transactionTimeoutMs", 60_000)
    if value > MAX_TRANSACTION_TIMEOUT_MS_DEFAULT:  # the coordinators refuse more, on every task
        raise OptionError(f"txlog: option 'transactionTimeoutMs' must be at most {MAX_TRANSACTION_TIMEOUT_MS_DEFAULT} "
                          f"(the coordinators' default maximum), not {value}")
    return value


def parse_write(options: Mapping[str, str], streaming: bool = False) -> WriteOptions:
    """The write's options (as Spark passes them: any case, spark-sql-kafka aliases) parsed and checked;
    ``streaming``: for DataFrame.writeStream."""
    known, given_as = _known(options, "write")
    try:
        _check_kind(known, "write", streaming, STREAM_ONLY_WRITE, BATCH_ONLY_WRITE)
        return _parse_write(known)
    except OptionError as error:
        raise _named_as_given(error, given_as) from None


def _parse_write(options: Mapping[str, str]) -> WriteOptions:
    bootstrap = _bootstrap(options)
    topic = _required(options, "topic")
    prefix = options.get("transactionalIdPrefix")
    if prefix is not None and not TRANSACTIONAL_ID_PREFIX_RE.fullmatch(prefix):
        raise OptionError(
            f"txlog: option 'transactionalIdPrefix' must be 1-200 characters of [a-zA-Z0-9._-], not {prefix!r}")
    return WriteOptions(
        bootstrap=bootstrap, topic=topic, transactional_id_prefix=prefix,
        transaction_timeout_ms=_transaction_timeout_ms(options),
        prepared_timeout_ms=_positive_int(options, "preparedTimeoutMs", 0),
        group_commit_with=_group_commit_with(options, prefix),
        client_tls=_client_tls(options),
    )


def _group_commit_with(options: Mapping[str, str], prefix: str | None) -> tuple:
    """``groupCommitWith``: JSON ``[[transactional_id, producer_id, producer_epoch], ...]``,
    prepared transactions of group ``prefix`` to commit with the write (an
    exactly-once job's input offsets)."""
    text = options.get("groupCommitWith")
    if text is None:
        return ()
    if prefix is None:
        raise OptionError("txlog: option 'groupCommitWith' needs 'transactionalIdPrefix' (the group they commit in)")
    try:
        raw = json.loads(text)
        handles = tuple(TransactionHandle(str(t), int(p), int(e)) for t, p, e in raw)
    except (ValueError, TypeError) as exc:
        raise OptionError(f"txlog: option 'groupCommitWith' must be JSON [[transactional_id, producer_id, "
                          f"producer_epoch], ...], not {text[:200]!r} ({exc})") from None
    for handle in handles:
        if not names.is_transactional_id(handle.transactional_id) or handle.group != prefix:
            raise OptionError(f"txlog: option 'groupCommitWith' names {handle.transactional_id!r}, which is not a "
                              f"transactional id of group {prefix!r} ({prefix}/...)")
    return handles
