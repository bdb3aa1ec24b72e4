"""The txlog data source's options, the jobs' settings and names: every mistake is an
OptionError (or ValueError for a duration) that names what was wrong, before Spark plans a task."""

import pytest

from spark_jobs import eos, windowed_counts
from spark_jobs.options import (
    EARLIEST,
    LATEST,
    EndingOffsets,
    OptionError,
    StartingOffsets,
    parse_read,
    parse_write,
)
from spark_jobs.schedule import parse_duration

READ = {"bootstrap": "127.0.0.1:7300", "topic": "events"}
WRITE = {"bootstrap": "127.0.0.1:7300", "topic": "copy"}


def _read(**overrides):
    return parse_read({**READ, **overrides})


def _read_without(name, **overrides):
    return parse_read({k: v for k, v in {**READ, **overrides}.items() if k != name})


# --- parse_read: what it accepts -------------------------------------------------------------


def test_read_defaults_are_earliest_to_latest_read_committed_failing_on_data_loss():
    parsed = parse_read(READ)
    assert parsed.bootstrap == "127.0.0.1:7300"
    assert parsed.topics == ("events",)
    assert parsed.starting == StartingOffsets(EARLIEST, group=None, per_partition=None)
    assert parsed.ending == EndingOffsets(LATEST, per_partition=None)
    assert parsed.isolation == "read_committed"
    assert parsed.max_records_per_split is None
    assert parsed.fail_on_data_loss is True
    assert parsed.poll_timeout_s == 120.0


def test_earliest_and_latest_are_the_spark_kafka_specials():
    assert (EARLIEST, LATEST) == (-2, -1)
    assert _read(startingOffsets="latest").starting == StartingOffsets(LATEST)
    assert _read(startingOffsets="earliest").starting == StartingOffsets(EARLIEST)
    assert _read(endingOffsets="latest").ending == EndingOffsets(LATEST)


def test_committed_group_starts_from_the_groups_offsets_else_earliest():
    starting = _read(startingOffsets="committed:my-group").starting
    assert starting == StartingOffsets(EARLIEST, group="my-group", per_partition=None)


def test_comma_separated_topics_are_read_in_order_with_spaces_trimmed():
    assert _read(topic="a, b ,c").topics == ("a", "b", "c")


def test_starting_offsets_json_maps_each_topic_partition_incl_both_specials():
    parsed = _read(topic="a,b", startingOffsets='{"a": {"0": 23, "1": -2}, "b": {"3": -1}}')
    assert parsed.starting.default == EARLIEST
    assert parsed.starting.group is None
    assert parsed.starting.per_partition == {("a", 0): 23, ("a", 1): EARLIEST, ("b", 3): LATEST}


def test_ending_offsets_json_accepts_latest_and_explicit_offsets():
    parsed = _read(topic="a,b", endingOffsets='{"a": {"0": 100, "1": -1}, "b": {"0": 0}}')
    assert parsed.ending.default == LATEST
    assert parsed.ending.per_partition == {("a", 0): 100, ("a", 1): LATEST, ("b", 0): 0}


def test_other_read_options_are_parsed():
    parsed = _read(isolation="read_uncommitted", maxRecordsPerSplit="1000", failOnDataLoss="FALSE",
                   pollTimeoutMs="2500")
    assert parsed.isolation == "read_uncommitted"
    assert parsed.max_records_per_split == 1000
    assert parsed.fail_on_data_loss is False
    assert parsed.poll_timeout_s == 2.5


def test_several_bootstrap_addresses_are_accepted():
    assert _read(bootstrap="a:1,b:65535, [::1]:7300").bootstrap == "a:1,b:65535, [::1]:7300"


# --- parse_read: every mistake is an OptionError that names the option -----------------------


@pytest.mark.parametrize(
    "overrides, named, says",
    [
        ({"bootstrap": "localhost"}, "'bootstrap'", "host:port"),
        ({"bootstrap": "localhost:0"}, "'bootstrap'", "host:port"),
        ({"bootstrap": "localhost:70000"}, "'bootstrap'", "host:port"),
        ({"bootstrap": ":7300"}, "'bootstrap'", "host:port"),
        ({"bootstrap": "a:1,b"}, "'bootstrap'", "host:port"),
        ({"bootstrap": "a:1,"}, "'bootstrap'", "host:port"),
        ({"bootstrap": "a:x"}, "'bootstrap'", "host:port"),
        ({"bootstrap": "  "}, "'bootstrap'", "required"),
        ({"topic": ""}, "'topic'", "required"),
        ({"topic": "a,a"}, "'topic'", "distinct"),
        ({"topic": "a, a"}, "'topic'", "distinct"),
        ({"topic": "a,,b"}, "'topic'", "distinct"),
        ({"startingOffsets": "{"}, "'startingOffsets'", "not valid JSON"),
        ({"startingOffsets": "earliest-ish"}, "'startingOffsets'", "not valid JSON"),
        ({"endingOffsets": '{"events": {0: 1}}'}, "'endingOffsets'", "not valid JSON"),
        ({"startingOffsets": "[]"}, "'startingOffsets'", "JSON object"),
        ({"startingOffsets": "{}"}, "'startingOffsets'", "JSON object"),
        ({"startingOffsets": '{"other": {"0": 1}}'}, "'startingOffsets'", "'other'"),
        ({"endingOffsets": '{"other": {"0": 1}}'}, "'endingOffsets'", "'other'"),
        ({"startingOffsets": '{"events": 5}'}, "'startingOffsets'", "must map partition numbers"),
        ({"startingOffsets": '{"events": {}}'}, "'startingOffsets'", "must map partition numbers"),
        ({"startingOffsets": '{"events": {"zero": 1}}'}, "'startingOffsets'", "not a partition number"),
        ({"startingOffsets": '{"events": {"-1": 1}}'}, "'startingOffsets'", "not a partition number"),
        ({"startingOffsets": '{"events": {"0": -3}}'}, "'startingOffsets'", "-3"),
        ({"startingOffsets": '{"events": {"0": true}}'}, "'startingOffsets'", "True"),
        ({"startingOffsets": '{"events": {"0": 1.5}}'}, "'startingOffsets'", "1.5"),
        ({"startingOffsets": '{"events": {"0": "5"}}'}, "'startingOffsets'", "'5'"),
        ({"endingOffsets": '{"events": {"0": -2}}'}, "'endingOffsets'", "-2"),
        ({"endingOffsets": '{"events": {"0": false}}'}, "'endingOffsets'", "False"),
        ({"endingOffsets": "earliest"}, "'endingOffsets'", "earliest"),
        ({"isolation": "serializable"}, "'isolation'", "serializable"),
        ({"isolation": "READ_COMMITTED"}, "'isolation'", "READ_COMMITTED"),
        ({"maxRecordsPerSplit": "0"}, "'maxRecordsPerSplit'", "positive integer"),
        ({"maxRecordsPerSplit": "-5"}, "'maxRecordsPerSplit'", "positive integer"),
        ({"maxRecordsPerSplit": "x"}, "'maxRecordsPerSplit'", "positive integer"),
        ({"pollTimeoutMs": "1.5"}, "'pollTimeoutMs'", "positive integer"),
        ({"failOnDataLoss": "maybe"}, "'failOnDataLoss'", "true or false"),
        ({"failOnDataLoss": "1"}, "'failOnDataLoss'", "true or false"),
        ({"startingOffsets": "committed:"}, "'startingOffsets'", "group"),
        ({"startingOffsets": "committed:  "}, "'startingOffsets'", "group"),
    ],
)
def test_a_bad_read_option_is_an_option_error_naming_it(overrides, named, says):
    with pytest.raises(OptionError) as error:
        _read(**overrides)
    assert named in str(error.value)
    assert says in str(error.value)


def test_the_allowed_specials_are_named_where_an_offset_is_rejected():
    with pytest.raises(OptionError, match=r"events-0 must be >= 0 or -2 or -1"):
        _read(startingOffsets='{"events": {"0": -7}}')
    with pytest.raises(OptionError, match=r"events-0 must be >= 0 or -1$"):
        _read(endingOffsets='{"events": {"0": -2}}')


def test_the_json_error_says_where_it_failed():
    with pytest.raises(OptionError, match=r"not valid JSON \(Expecting .* at character \d+\)"):
        _read(startingOffsets='{"events": {"0": }}')


@pytest.mark.parametrize("missing", ["bootstrap", "topic"])
def test_a_missing_required_read_option_is_named(missing):
    with pytest.raises(OptionError, match=f"option '{missing}' is required"):
        _read_without(missing)


def test_an_unknown_topic_in_json_is_reported_with_the_topics_read():
    with pytest.raises(OptionError) as error:
        _read(topic="a,b", startingOffsets='{"c": {"0": 1}}')
    assert "['a', 'b']" in str(error.value)


# --- parse_write --------------------------------------------------------------------------------


def test_write_defaults_are_an_idempotent_producer_with_a_60s_transaction_timeout():
    parsed = parse_write(WRITE)
    assert (parsed.bootstrap, parsed.topic) == ("127.0.0.1:7300", "copy")
    assert parsed.transactional_id_prefix is None
    assert parsed.transaction_timeout_ms == 60_000


@pytest.mark.parametrize("prefix", ["a", "copy-job", "Job_1.v2", "x" * 200])
def test_a_legal_transactional_id_prefix_is_kept_as_given(prefix):
    assert parse_write({**WRITE, "transactionalIdPrefix": prefix}).transactional_id_prefix == prefix


@pytest.mark.parametrize("prefix", ["", "has space", "slash/ed", "colon:", "ünïcode", "x" * 201])
def test_a_bad_transactional_id_prefix_is_an_option_error(prefix):
    with pytest.raises(OptionError, match="'transactionalIdPrefix' must be 1-200 characters"):
        parse_write({**WRITE, "transactionalIdPrefix": prefix})


def test_transaction_timeout_is_a_positive_integer_of_ms():
    assert parse_write({**WRITE, "transactionTimeoutMs": "15000"}).transaction_timeout_ms == 15_000
    for bad in ("0", "-1", "soon", "1.5"):
        with pytest.raises(OptionError, match="'transactionTimeoutMs' must be a positive integer"):
            parse_write({**WRITE, "transactionTimeoutMs": bad})


@pytest.mark.parametrize(
    "options, named",
    [
        ({"bootstrap": "127.0.0.1:7300"}, "'topic'"),
        ({"bootstrap": "127.0.0.1:7300", "topic": " "}, "'topic'"),
        ({"topic": "copy"}, "'bootstrap'"),
        ({"bootstrap": "127.0.0.1", "topic": "copy"}, "'bootstrap'"),
    ],
)
def test_a_bad_write_option_is_an_option_error_naming_it(options, named):
    with pytest.raises(OptionError, match=named):
        parse_write(options)


# --- schedule.parse_duration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [("500ms", 0.5), ("60s", 60.0), ("5m", 300.0), ("1h", 3600.0), ("60", 60.0), ("1.5s", 1.5), (" 2 m ", 120.0)],
)
def test_a_duration_is_read_in_seconds(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["0s", "0", "0.0m", "-1s", "5x", "", "s", "1 h 2 m", "1d"])
def test_a_duration_that_is_not_positive_or_not_understood_is_a_value_error(text):
    with pytest.raises(ValueError, match="not a positive duration"):
        parse_duration(text)


# --- eos.EosJob and its transform -------------------------------------------------------------------


def _job(**overrides):
    fields = {"name": "counts", "bootstrap": "127.0.0.1:7300", "input_topics": ("events",),
              "output_topic": "event-counts", "group": "counts", "transform": "spark_jobs.windowed_counts:count_views"}
    return eos.EosJob(**{**fields, **overrides})


def test_a_valid_job_is_built_with_exactly_once_delivery_by_default():
    job = _job()
    assert job.delivery == "exactly-once"
    assert job.transaction_timeout_ms == 60_000
    assert dict(job.transform_args) == {}


@pytest.mark.parametrize("delivery", ["exactly-once", "at-least-once"])
def test_both_delivery_modes_are_accepted(delivery):
    assert _job(delivery=delivery).delivery == delivery


@pytest.mark.parametrize(
    "overrides, says",
    [
        ({"delivery": "at-most-once"}, "delivery must be one of"),
        ({"delivery": "Exactly-Once"}, "delivery must be one of"),
        ({"name": ""}, "a job name must be 1-200 characters"),
        ({"name": "my job"}, "a job name must be 1-200 characters"),
        ({"name": "a/b"}, "a job name must be 1-200 characters"),
        ({"name": "x" * 201}, "a job name must be 1-200 characters"),
        ({"transform": "nocolon"}, "module:function"),
        ({"transform": ":count_views"}, "module:function"),
        ({"transform": "spark_jobs.windowed_counts:"}, "module:function"),
        ({"transform": "no.such.module:f"}, "cannot load the transform 'no.such.module:f'"),
        ({"transform": "json:nosuchfn"}, "cannot load the transform 'json:nosuchfn'"),
        ({"transform": "spark_jobs.windowed_counts:MALFORMED"}, "is not callable"),
    ],
)
def test_a_bad_job_is_an_option_error_when_built(overrides, says):
    with pytest.raises(OptionError, match=says):
        _job(**overrides)


def test_load_transform_returns_the_named_callable():
    assert eos.load_transform("spark_jobs.windowed_counts:count_views") is windowed_counts.count_views
    assert eos.load_transform("spark_jobs.windowed_counts:section_of")("/docs/x") == "docs"


def test_a_jobs_transactional_id_is_the_same_for_every_run_and_attempt_of_a_partition():
    from spark_jobs.planning import OffsetRange

    job = _job(name="counts")
    assert job.transactional_id(OffsetRange("events", 3, 0, 10)) == "counts:events:3"
    assert job.transactional_id(OffsetRange("events", 3, 10, 99)) == "counts:events:3"
    assert job.transactional_id(OffsetRange("events", 4, 0, 10)) == "counts:events:4"


def test_two_jobs_never_share_a_transactional_id():
    from spark_jobs.planning import OffsetRange

    assert _job(name="a").transactional_id(OffsetRange("b-c", 0, 0, 1)) != \
        _job(name="a-b").transactional_id(OffsetRange("c", 0, 0, 1))


def test_a_transaction_timeout_above_the_coordinators_maximum_is_refused_before_any_task():
    assert parse_write({**WRITE, "transactionTimeoutMs": "900000"}).transaction_timeout_ms == 900_000
    with pytest.raises(OptionError, match="'transactionTimeoutMs' must be at most 900000"):
        parse_write({**WRITE, "transactionTimeoutMs": "900001"})
    with pytest.raises(OptionError, match="transaction_timeout_ms must be 1..900000"):
        _job(transaction_timeout_ms=2**31)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"input_topics": ()}, "at least one input"),
    ({"input_topics": ("bad topic",)}, "valid topic names"),
    ({"output_topic": ".."}, "valid topic names"),
    ({"group": "g\n"}, "not a valid group id"),
])
def test_a_job_with_bad_topics_or_group_is_refused_on_the_driver(overrides, message):
    with pytest.raises(OptionError, match=message):
        _job(**overrides)
