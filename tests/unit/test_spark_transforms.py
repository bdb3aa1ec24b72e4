"""The pure parts of the Spark jobs, without a Spark session: range splitting, the schedule,
the windowed-counts transformation, the sample input and the writer's checks and helpers."""

import concurrent.futures
import datetime
import json
import logging
import re
import signal
import threading
import time

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from spark_jobs import sample_events, schedule, windowed_counts
from spark_jobs.eos import OutputRecord
from spark_jobs.options import OptionError
from spark_jobs.planning import OffsetRange
from spark_jobs.windowed_counts import MALFORMED, count_views, section_of
from spark_jobs.writing import SendFailures, check_schema, rows, send_row
from txlog.protocol import names
from txlog.structs import ConsumerRecord
from txlog.two_phase import new_run_id, task_id_pattern, task_transactional_id

# --- OffsetRange.split ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "start, end, records_max",
    [(0, 10, 3), (0, 10, 5), (0, 10, 1), (7, 1007, 100), (7, 1008, 100), (5, 6, 1), (0, 10, 9), (100, 250, 64)],
)
def test_split_tiles_the_range_without_gap_or_overlap_in_pieces_of_at_most_max(start, end, records_max):
    pieces = OffsetRange("t", 2, start, end).split(records_max)
    assert all(p.topic == "t" and p.partition == 2 for p in pieces)
    assert pieces[0].start == start and pieces[-1].end == end
    assert all(a.end == b.start for a, b in zip(pieces, pieces[1:], strict=False))
    assert all(0 < p.end - p.start <= records_max for p in pieces)
    assert len(pieces) == -(-(end - start) // records_max)  # ceil: only the last piece may be short


def test_split_pieces_are_exactly_the_expected_ranges():
    assert OffsetRange("t", 0, 10, 20).split(4) == [
        OffsetRange("t", 0, 10, 14), OffsetRange("t", 0, 14, 18), OffsetRange("t", 0, 18, 20)]


@pytest.mark.parametrize("records_max", [None, 10, 11, 1_000_000])
def test_a_range_within_the_limit_or_without_one_is_one_task(records_max):
    whole = OffsetRange("t", 1, 40, 50)
    assert whole.split(records_max) == [whole]


def test_an_offset_range_knows_its_topic_partition():
    assert OffsetRange("t", 4, 0, 1).tp == ("t", 4)


# --- schedule.run_every --------------------------------------------------------------------------


def _in_thread(target):
    outcome = {}

    def body():
        try:
            target()
        except BaseException as exc:  # reported to the test below
            outcome["error"] = exc

    thread = threading.Thread(target=body, name="schedule-test")
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "run_every did not stop"
    assert "error" not in outcome, outcome.get("error")


@pytest.fixture
def signal_handlers():
    """run_every installs SIGTERM/SIGINT handlers from the main thread: put pytest's back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield saved
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_run_every_calls_run_until_stop_is_set_and_no_more():
    stop, calls = threading.Event(), []

    def run():
        calls.append(time.monotonic())
        if len(calls) == 3:
            stop.set()

    _in_thread(lambda: schedule.run_every(0.01, run, stop))
    assert len(calls) == 3
    assert calls[2] - calls[0] >= 0.02 - 0.002  # the interval separates the runs' starts


def test_a_failing_run_is_logged_and_the_schedule_goes_on(caplog):
    stop, calls = threading.Event(), []

    def run():
        calls.append(1)
        if len(calls) == 3:
            stop.set()
        if len(calls) < 3:
            raise RuntimeError(f"run {len(calls)} failed")

    with caplog.at_level(logging.ERROR, logger="spark_jobs.schedule"):
        _in_thread(lambda: schedule.run_every(0.01, run, stop))
    assert len(calls) == 3
    failures = [r for r in caplog.records if r.name == "spark_jobs.schedule"]
    assert [str(r.exc_info[1]) for r in failures] == ["run 1 failed", "run 2 failed"]


def test_a_stop_set_before_the_schedule_starts_runs_nothing():
    stop, calls = threading.Event(), []
    stop.set()
    _in_thread(lambda: schedule.run_every(0.01, lambda: calls.append(1), stop))
    assert calls == []


def test_run_every_off_the_main_thread_leaves_signal_handlers_alone():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    stop = threading.Event()
    _in_thread(lambda: schedule.run_every(0.01, stop.set, stop))
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_on_the_main_thread_a_signal_lets_the_current_run_finish_then_stops(signal_handlers, signum):
    assert threading.current_thread() is threading.main_thread()
    stop, finished = threading.Event(), []

    def run():
        signal.raise_signal(signum)  # handled in this thread, before the run returns
        finished.append(stop.is_set())

    schedule.run_every(60, run, stop)  # a second run would wait 60 s: the signal must end the schedule
    assert finished == [True]
    assert stop.is_set()


# --- windowed_counts.section_of -----------------------------------------------------------------


@pytest.mark.parametrize(
    "page, section",
    [
        ("/", "home"),
        ("", "home"),
        ("/?utm=x", "home"),
        ("/docs/intro", "docs"),
        ("/docs", "docs"),
        ("/docs/", "docs"),
        ("docs/api", "docs"),
        ("//docs//api", "docs"),
        ("/DOCS/Intro", "docs"),
        ("/Blog/launch", "blog"),
        ("/docs?page=/blog", "docs"),
        ("/blog?x=/docs", "blog"),
        ("/pricing", "sales"),
        ("/signup?plan=pro", "sales"),
        ("/account/settings", "account"),
        ("/about", "other"),
        ("/documentation", "other"),
        ("/?", "home"),
        ("/x/docs", "other"),
    ],
)
def test_a_page_belongs_to_the_section_of_its_first_path_segment(page, section):
    assert section_of(page) == section


# --- windowed_counts.count_views ----------------------------------------------------------------

SOURCE = OffsetRange("events", 3, 100, 200)
WINDOW_MS = 60_000


def _record(value, offset=100, timestamp_ms=0):
    if isinstance(value, dict):
        value = json.dumps(value)
    if isinstance(value, str):
        value = value.encode()
    return ConsumerRecord("events", 3, offset, b"u1", value, [], timestamp_ms)


def _view(page, ts, size=None):
    event = {"user": "u1", "page": page, "ts": ts}
    if size is not None:
        event["bytes"] = size
    return event


def _counts(values, source=SOURCE, window_ms=WINDOW_MS):
    records = [v if isinstance(v, ConsumerRecord) else _record(v, offset=source.start + i)
               for i, v in enumerate(values)]
    output = list(count_views(iter(records), source, window_ms=window_ms))
    assert all(isinstance(o, OutputRecord) for o in output)
    return [(o.key, json.loads(o.value)) for o in output]


def test_views_of_a_section_in_one_window_are_one_record_with_views_and_bytes():
    output = _counts([_view("/docs/a", 60_000, 100), _view("/docs/b", 61_000, 50), _view("/DOCS", 119_999, 1)])
    assert output == [("docs/60000", {
        "section": "docs", "window_start_ms": 60_000, "window_end_ms": 120_000, "views": 3, "bytes": 151,
        "source": {"topic": "events", "partition": 3, "from": 100, "to": 200}})]


def test_window_start_is_inclusive_and_window_end_exclusive():
    output = _counts([_view("/", 59_999), _view("/", 60_000), _view("/", 119_999), _view("/", 120_000)])
    assert [(key, value["views"], value["window_start_ms"], value["window_end_ms"]) for key, value in output] == [
        ("home/0", 1, 0, 60_000), ("home/60000", 2, 60_000, 120_000), ("home/120000", 1, 120_000, 180_000)]


def test_the_window_length_is_a_transform_argument():
    output = _counts([_view("/", 999), _view("/", 1000), _view("/", 1999)], window_ms=1000)
    assert [(key, value["views"], value["window_end_ms"]) for key, value in output] == [
        ("home/0", 1, 1000), ("home/1000", 2, 2000)]


def test_missing_bytes_count_as_zero():
    assert _counts([_view("/blog/x", 5)])[0][1]["bytes"] == 0


@pytest.mark.parametrize(
    "value",
    [
        "not json",
        b"\xff\xfe not utf-8",
        None,
        "",
        '"just a string"',
        "[1, 2]",
        "42",
        {"user": "u1", "ts": 60_000},
        {"user": "u1", "page": "/docs", "ts": "yesterday"},
        {"user": "u1", "page": "/docs", "ts": None},
        {"user": "u1", "page": "/docs"},
        {"user": "u1", "page": "/docs", "ts": [60_000]},
        {"user": "u1", "page": None, "ts": 60_000},
        {"user": "u1", "page": 17, "ts": 60_000},
        {"user": "u1", "page": "/docs", "ts": 60_000, "bytes": "many"},
        '{"page": "/docs", "ts": NaN}',
    ],
)
def test_a_malformed_event_is_counted_under_malformed_in_the_window_of_the_record_timestamp(value):
    record = _record(value, timestamp_ms=125_000)
    assert _counts([record]) == [(f"{MALFORMED}/120000", {
        "section": MALFORMED, "window_start_ms": 120_000, "window_end_ms": 180_000, "views": 1, "bytes": 0,
        "source": {"topic": "events", "partition": 3, "from": 100, "to": 200}})]


def test_output_is_sorted_by_section_then_numeric_window_start():
    values = [_view("/pricing", 600_000), _view("/docs", 600_000), _view("/docs", 90_000), _view("/", 0),
              _record("garbage", timestamp_ms=30_000)]
    keys = [key for key, _ in _counts(values)]
    assert keys == [f"{MALFORMED}/0", "docs/60000", "docs/600000", "home/0", "sales/600000"]


def test_source_is_the_range_passed_in_not_the_records_offsets():
    source = OffsetRange("clicks", 7, 1_000, 1_003)
    output = _counts([_view("/", 0), _view("/", 1)], source=source)
    assert output[0][1]["source"] == {"topic": "clicks", "partition": 7, "from": 1_000, "to": 1_003}


def test_an_empty_range_produces_nothing():
    assert _counts([]) == []


def test_the_value_is_canonical_json_with_sorted_keys():
    (output,) = list(count_views(iter([_record(_view("/docs", 0, 7))]), SOURCE))
    assert output.key == "docs/0"
    assert output.value == ('{"bytes": 7, "section": "docs", "source": {"from": 100, "partition": 3, "to": 200, '
                            '"topic": "events"}, "views": 1, "window_end_ms": 60000, "window_start_ms": 0}')
    assert output.headers == ()


def test_views_of_the_sample_events_sum_to_the_input_count_and_malformed_to_the_non_json_ones():
    generated = sample_events.events(3_000, seed=11)
    records = [ConsumerRecord("events", 0, i, key.encode(), value.encode(), [], sample_events.START_MS)
               for i, (key, value) in enumerate(generated)]
    output = [json.loads(o.value) for o in count_views(iter(records), OffsetRange("events", 0, 0, 3_000))]
    assert sum(o["views"] for o in output) == 3_000
    not_json = sum(1 for _, value in generated if value.startswith("not json"))
    assert sum(o["views"] for o in output if o["section"] == MALFORMED) == not_json
    sizes = sum(json.loads(v)["bytes"] for _, v in generated if not v.startswith("not json"))
    assert sum(o["bytes"] for o in output) == sizes
    assert {o["section"] for o in output} <= {*windowed_counts.SECTIONS.values(), "other", MALFORMED}


# --- sample_events.events -------------------------------------------------------------------------


def test_sample_events_are_the_same_for_a_seed_and_differ_across_seeds():
    assert sample_events.events(500, seed=3) == sample_events.events(500, seed=3)
    assert sample_events.events(500, seed=3) != sample_events.events(500, seed=4)
    assert sample_events.events(500) == sample_events.events(500, seed=1)


@pytest.mark.parametrize("count", [0, 1, 7, 2_000])
def test_sample_events_count_is_respected(count):
    assert len(sample_events.events(count, seed=2)) == count


def test_sample_events_are_page_views_keyed_by_user_within_the_spread():
    generated = sample_events.events(5_000, seed=5)
    parsed = [(key, json.loads(value)) for key, value in generated if not value.startswith("not json")]
    assert len(parsed) >= 4_950  # about one in a thousand is malformed
    assert [e["n"] for _, e in parsed] == sorted({e["n"] for _, e in parsed})  # unique, in order
    for key, event in parsed:
        assert key == event["user"] and key.startswith("u") and 0 <= int(key[1:]) < 500
        assert event["page"] in sample_events.PAGES
        assert sample_events.START_MS <= event["ts"] < sample_events.START_MS + sample_events.SPREAD_MS
        assert 200 <= event["bytes"] < 5_000
    malformed = [value for _, value in generated if value.startswith("not json")]
    assert len(malformed) + len(parsed) == 5_000
    for value in malformed:
        with pytest.raises(json.JSONDecodeError):
            json.loads(value)


# --- writing.check_schema -----------------------------------------------------------------------

HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def _schema(*fields):
    return StructType([StructField(name, data_type) for name, data_type in fields])


@pytest.mark.parametrize(
    "schema",
    [
        _schema(("value", BinaryType())),
        _schema(("value", StringType())),
        _schema(("key", StringType()), ("value", BinaryType())),
        _schema(("value", BinaryType()), ("key", BinaryType()), ("partition", IntegerType()), ("headers", HEADERS),
                ("timestamp", TimestampType())),
        _schema(("value", StringType()), ("partition", LongType()), ("timestamp", LongType())),
        _schema(("value", BinaryType()), ("headers", ArrayType(StructType([
            StructField("key", StringType()), StructField("value", StringType())])))),
    ],
)
def test_check_schema_accepts_the_topic_columns(schema):
    check_schema(schema)


@pytest.mark.parametrize(
    "schema, says",
    [
        (_schema(("key", StringType())), "needs a 'value' column"),
        (_schema(), "needs a 'value' column"),
        (_schema(("value", BinaryType()), ("offset", LongType())), "column 'offset' is not written"),
        (_schema(("Value", BinaryType())), "needs a 'value' column"),
        (_schema(("value", IntegerType())), "column 'value' has type int, expected binary or string"),
        (_schema(("value", BinaryType()), ("key", LongType())), "column 'key' has type bigint"),
        (_schema(("value", BinaryType()), ("partition", StringType())), "column 'partition' has type string"),
        (_schema(("value", BinaryType()), ("partition", ShortType())), "column 'partition' has type smallint"),
        (_schema(("value", BinaryType()), ("timestamp", DoubleType())), "column 'timestamp' has type double"),
        (_schema(("value", BinaryType()), ("timestamp", TimestampNTZType())), "column 'timestamp' has type"),
        (_schema(("value", BinaryType()), ("headers", MapType(StringType(), BinaryType()))),
         "column 'headers' has type map<string,binary>"),
        (_schema(("value", BinaryType()), ("headers", ArrayType(StringType()))),
         "'headers' must be array<struct<key: string, value: binary>>, not array<string>"),
        (_schema(("value", BinaryType()), ("headers", ArrayType(StructType([
            StructField("value", BinaryType()), StructField("key", StringType())])))), "'headers' must be"),
        (_schema(("value", BinaryType()), ("headers", ArrayType(StructType([
            StructField("key", BinaryType()), StructField("value", BinaryType())])))), "'headers' must be"),
        (_schema(("value", BinaryType()), ("headers", ArrayType(StructType([
            StructField("key", StringType()), StructField("value", LongType())])))), "'headers' must be"),
        (_schema(("value", BinaryType()), ("headers", ArrayType(StructType([
            StructField("key", StringType())])))), "'headers' must be"),
        (_schema(("value", BinaryType()), ("headers", ArrayType(StructType([
            StructField("key", StringType()), StructField("value", BinaryType()),
            StructField("extra", StringType())])))), "'headers' must be"),
    ],
)
def test_check_schema_rejects_what_a_topic_cannot_hold(schema, says):
    with pytest.raises(OptionError, match=re.escape(says)):
        check_schema(schema)


# --- writing: transactional ids, SendFailures, rows, send_row ---------------------------------------


def test_a_write_tasks_transactional_id_is_in_the_prefixs_group_and_names_run_partition_and_attempt():
    tid = task_transactional_id("copy-job", "r1700000000000-0a1b2c", 17, 42)
    assert tid == "copy-job/r1700000000000-0a1b2c.p17.t42"
    assert names.transaction_group(tid) == "copy-job" and names.is_transactional_id(tid)
    assert task_id_pattern("copy-job").fullmatch(tid).group(1) == "r1700000000000-0a1b2c"
    assert task_id_pattern("copy-job").fullmatch("copy-job/offsets") is None  # a job's offsets are no task's
    assert task_id_pattern("copy").fullmatch(tid) is None  # another prefix's runs are not ours
    assert task_transactional_id("copy-job", new_run_id(), 0, 0) != task_transactional_id("copy-job", new_run_id(), 0, 0)


def _futures(count):
    futures = [concurrent.futures.Future() for _ in range(count)]
    for future in futures:
        assert future.set_running_or_notify_cancel()
    return futures


def test_send_failures_without_a_failure_raise_nothing():
    failures = SendFailures()
    futures = _futures(3)
    for future in futures:
        failures.watch(future)
    failures.raise_first()  # nothing done yet
    for i, future in enumerate(futures):
        future.set_result(i)
    failures.raise_first()
    assert failures.first is None


def test_send_failures_keep_the_first_exception_even_when_later_ones_fail():
    failures = SendFailures()
    ok, first, second = _futures(3)
    for future in (ok, first, second):
        failures.watch(future)
    ok.set_result(0)
    first_error, second_error = RuntimeError("first"), RuntimeError("second")
    first.set_exception(first_error)
    second.set_exception(second_error)
    with pytest.raises(RuntimeError) as raised:
        failures.raise_first()
    assert raised.value is first_error
    with pytest.raises(RuntimeError) as again:  # raising does not forget it
        failures.raise_first()
    assert again.value is first_error


def test_send_failures_see_a_future_that_failed_before_it_was_watched():
    failures = SendFailures()
    (future,) = _futures(1)
    error = ValueError("too big")
    future.set_exception(error)
    failures.watch(future)
    assert failures.first is error


def test_send_failures_keep_exactly_one_of_concurrent_failures():
    failures = SendFailures()
    futures = _futures(64)
    for future in futures:
        failures.watch(future)
    errors = [RuntimeError(str(i)) for i in range(len(futures))]
    barrier = threading.Barrier(8)

    def fail(chunk):
        barrier.wait()
        for i in chunk:
            futures[i].set_exception(errors[i])

    threads = [threading.Thread(target=fail, args=(range(k, len(futures), 8),)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert any(failures.first is e for e in errors)
    with pytest.raises(RuntimeError) as raised:
        failures.raise_first()
    assert raised.value is failures.first


def test_rows_turns_an_arrow_batch_into_dicts_in_order():
    batch = pa.RecordBatch.from_pydict({"value": [b"a", b"b", None], "key": ["k1", None, "k3"],
                                        "partition": pa.array([0, 1, 2], pa.int32())})
    assert list(rows(batch)) == [{"value": b"a", "key": "k1", "partition": 0},
                                 {"value": b"b", "key": None, "partition": 1},
                                 {"value": None, "key": "k3", "partition": 2}]
    assert list(rows(batch.slice(0, 0))) == []


class _RecordingProducer:
    def __init__(self):
        self.sent = []

    def send(self, topic, **fields):
        self.sent.append((topic, fields))
        return "future"


def test_send_row_sends_the_columns_a_topic_holds():
    producer = _RecordingProducer()
    assert send_row(producer, "copy", {"value": b"v", "key": b"k", "partition": 2, "timestamp": 1_795_000_000_123,
                                       "headers": [{"key": "h1", "value": b"x"}, {"key": "h2", "value": None}]}
                    ) == "future"
    assert producer.sent == [("copy", {"value": b"v", "key": b"k", "partition": 2,
                                       "headers": [("h1", b"x"), ("h2", None)], "timestamp_ms": 1_795_000_000_123})]


def test_send_row_leaves_absent_columns_to_the_producer():
    producer = _RecordingProducer()
    send_row(producer, "copy", {"value": "only"})
    send_row(producer, "copy", {"value": "v", "headers": [], "timestamp": None, "key": None})
    expected = {"value": None, "key": None, "partition": None, "headers": None, "timestamp_ms": None}
    assert producer.sent == [("copy", {**expected, "value": "only"}), ("copy", {**expected, "value": "v"})]


def test_send_row_turns_a_timestamp_column_into_epoch_ms():
    producer = _RecordingProducer()
    utc = datetime.UTC
    send_row(producer, "copy", {"value": b"v", "timestamp": datetime.datetime(2026, 11, 19, 8, 26, 40, 123456, utc)})
    send_row(producer, "copy", {"value": b"v", "timestamp": datetime.datetime(1970, 1, 1, 0, 0, 1, tzinfo=utc)})
    assert [fields["timestamp_ms"] for _, fields in producer.sent] == [1_795_076_800_123, 1_000]


def test_totals_are_printed_with_utc_window_starts(capsys):
    windowed_counts.print_totals([{"window_start_ms": 1_795_000_020_000, "section": "docs", "views": 3, "bytes": 70}])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("window start (UTC)")
    assert lines[1].split() == ["2026-11-18", "11:07:00", "docs", "3", "70"] and lines[2].split() == ["total", "3", "70"]
