"""Edge cases of the Spark job's parts that a first review found broken: each failed before its fix."""

import datetime
import json
import signal
import threading

import pytest

from spark_jobs import eos, schedule
from spark_jobs.options import OptionError, parse_read, parse_write
from spark_jobs.planning import OffsetRange
from spark_jobs.windowed_counts import classify, count_views
from spark_jobs.writing import send_row
from txlog.structs import ConsumerRecord


@pytest.mark.parametrize("value", [b'{"page": "/", "ts": Infinity}', b'{"page": "/", "ts": -Infinity}',
                                   b'{"page": "/", "ts": 1e400}'])
def test_an_event_with_an_infinite_ts_is_counted_as_malformed(value):
    record = ConsumerRecord("events", 0, 0, None, value, [], 125_000)
    (output,) = count_views(iter([record]), OffsetRange("events", 0, 0, 1))
    assert output.key == "_malformed/120000"


@pytest.mark.parametrize("value", [b'{"page": "/", "ts": 253402300800000}', b'{"page": "/", "ts": -62135596800001}',
                                   b'{"page": "/", "ts": 5, "bytes": 1099511627776}', b'{"page": "/", "ts": 5, "bytes": -1}'])
def test_an_event_time_or_size_the_streaming_arithmetic_cannot_hold_is_malformed_in_both_modes(value):
    record = ConsumerRecord("events", 0, 0, None, value, [], 125_000)
    (output,) = count_views(iter([record]), OffsetRange("events", 0, 0, 1))
    assert json.loads(output.value)["section"] == "_malformed"
    assert classify(value, 125_000) == ("_malformed", 125_000, 0)
    assert classify(b'{"page": "/", "ts": 253402300799999, "bytes": 1099511627775}', 0) == ("home", 253402300799999, 1099511627775)


def test_an_event_with_a_boolean_ts_is_counted_as_malformed():
    record = ConsumerRecord("events", 0, 0, None, b'{"page": "/", "ts": true}', [], 125_000)
    (output,) = count_views(iter([record]), OffsetRange("events", 0, 0, 1))
    assert output.key == "_malformed/120000"


def test_a_transactional_id_prefix_with_a_trailing_newline_is_rejected():
    with pytest.raises(OptionError):
        parse_write({"bootstrap": "h:1", "topic": "t", "transactionalIdPrefix": "job\n"})


def test_a_job_name_with_a_trailing_newline_is_rejected():
    with pytest.raises(OptionError):
        eos.EosJob(name="job\n", bootstrap="h:1", input_topics=("t",), output_topic="o", group="g",
                   transform="spark_jobs.windowed_counts:count_views")


@pytest.mark.parametrize("options", [
    {"bootstrap": "h:²", "topic": "t"},
    {"bootstrap": "h:1", "topic": "t", "startingOffsets": '{"t": {"²": 5}}'},
])
def test_a_non_ascii_digit_is_an_option_error_naming_the_option(options):
    with pytest.raises(OptionError, match="option '"):
        parse_read(options)


class _Recording:
    def send(self, topic, **fields):
        self.fields = fields


def test_send_row_keeps_the_milliseconds_of_a_timestamp():
    producer = _Recording()
    ts = datetime.datetime(1987, 3, 12, 11, 13, 30, 180_000, tzinfo=datetime.UTC)
    send_row(producer, "t", {"value": b"v", "timestamp": ts})
    assert producer.fields["timestamp_ms"] == 542_546_010_180


def test_run_every_on_the_main_thread_puts_the_signal_handlers_back():
    before = signal.getsignal(signal.SIGINT)
    stop = threading.Event()
    try:
        schedule.run_every(0.01, stop.set, stop)
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        signal.signal(signal.SIGINT, before)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
