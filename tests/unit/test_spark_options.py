"""The txlog data source's options, the jobs' settings and names: every mistake is an
OptionError (or ValueError for a duration) that names what was wrong, before Spark plans a task."""

from dataclasses import replace

import pytest

from spark_jobs import eos, windowed_counts
from spark_jobs.options import (
    EARLIEST,
    KAFKA_OPTIONS,
    LATEST,
    READ_OPTIONS,
    WRITE_OPTIONS,
    EndingOffsets,
    OptionError,
    ReadOptions,
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


# --- the known options: anything else is refused, spark-sql-kafka's names where they mean the same ---


def _spark_options(options: dict):
    """``options`` as Spark hands them to the data source: keys lower-cased, looked up in any case."""
    from pyspark.sql.datasource import CaseInsensitiveDict

    return CaseInsensitiveDict(options)


def _pem_files(tmp_path) -> dict[str, str]:
    files = {}
    for name in ("tlsCa", "tlsCert", "tlsKey", "tokenFile"):
        path = tmp_path / name
        path.write_text("-----BEGIN X-----\n")
        files[name] = str(path)
    return files


def test_every_known_read_option_is_taken_in_any_case(tmp_path):
    values = {"bootstrap": "h:1", "topic": "events", "startingOffsets": "latest",
              "endingOffsets": '{"events": {"0": 9}}', "isolation": "read_uncommitted", "maxRecordsPerSplit": "7",
              "failOnDataLoss": "false", "pollTimeoutMs": "2500", **_pem_files(tmp_path)}
    assert set(values) | {"maxRecordsPerTrigger"} == set(READ_OPTIONS)  # that one only a streaming read takes
    expected = ReadOptions("h:1", ("events",), StartingOffsets(LATEST), EndingOffsets(LATEST, {("events", 0): 9}),
                           "read_uncommitted", 7, False, 2.5,
                           {"tls_ca": values["tlsCa"], "tls_cert": values["tlsCert"], "tls_key": values["tlsKey"],
                            "token_file": values["tokenFile"]})
    assert parse_read(values) == expected
    assert parse_read(_spark_options(values)) == expected
    assert parse_read({name.lower(): value for name, value in values.items()}) == expected
    assert parse_read({name.upper(): value for name, value in values.items()}) == expected
    streamed = {**{k: v for k, v in values.items() if k != "endingOffsets"}, "maxRecordsPerTrigger": "9"}
    for given in (streamed, {name.lower(): value for name, value in streamed.items()}):
        assert parse_read(given, streaming=True) == replace(expected, ending=EndingOffsets(LATEST), max_records_per_trigger=9)


def test_every_known_write_option_is_taken_in_any_case(tmp_path):
    values = {"bootstrap": "h:1", "topic": "copy", "transactionalIdPrefix": "job", "transactionTimeoutMs": "15000",
              "preparedTimeoutMs": "5000", "groupCommitWith": '[["job/offsets", 7, 2]]', **_pem_files(tmp_path)}
    assert set(values) | {"checkpointLocation", "queryName"} == set(WRITE_OPTIONS)  # what Spark hands a streaming sink
    for given in (values, _spark_options(values), {name.lower(): value for name, value in values.items()}):
        parsed = parse_write(given)
        assert (parsed.bootstrap, parsed.topic, parsed.transactional_id_prefix) == ("h:1", "copy", "job")
        assert (parsed.transaction_timeout_ms, parsed.prepared_timeout_ms) == (15_000, 5_000)
        assert [tuple(h) for h in parsed.group_commit_with] == [("job/offsets", 7, 2)]
        assert parsed.client_tls["token_file"] == values["tokenFile"]


def test_the_spark_kafka_names_with_the_same_meaning_are_accepted_on_a_read():
    parsed = parse_read({"kafka.bootstrap.servers": "a:1,b:2", "subscribe": "events",
                         "kafka.isolation.level": "read_uncommitted"})
    assert (parsed.bootstrap, parsed.topics, parsed.isolation) == ("a:1,b:2", ("events",), "read_uncommitted")
    assert parse_read({**READ, "kafka.isolation.level": "read_committed"}).isolation == "read_committed"
    assert parse_read(_spark_options({"kafka.bootstrap.servers": "a:1", "Subscribe": "x"})).topics == ("x",)


def test_subscribe_takes_several_topics_like_topic():
    assert parse_read({"bootstrap": "h:1", "subscribe": "a, b,c"}).topics == ("a", "b", "c")
    with pytest.raises(OptionError, match=r"option 'subscribe' \(txlog's 'topic'\) must be a comma-separated list"):
        parse_read({"bootstrap": "h:1", "subscribe": "a,a"})


def test_kafka_bootstrap_servers_is_accepted_on_a_write():
    assert parse_write({"kafka.bootstrap.servers": "a:1", "topic": "copy"}).bootstrap == "a:1"


@pytest.mark.parametrize(("options", "message"), [
    ({"kafka.bootstrap.servers": "nohost", "topic": "t"},
     "option 'kafka.bootstrap.servers' (txlog's 'bootstrap') must be host:port"),
    ({"bootstrap": "h:1", "topic": "t", "kafka.isolation.level": "READ_COMMITTED"},
     "option 'kafka.isolation.level' (txlog's 'isolation') must be one of ('read_committed', 'read_uncommitted'), "
     "not 'READ_COMMITTED'"),
    ({"bootstrap": "h:1", "subscribe": " "}, "option 'subscribe' (txlog's 'topic') is required"),
])
def test_a_bad_value_given_by_its_kafka_name_names_it_and_txlogs_name(options, message):
    with pytest.raises(OptionError) as error:
        parse_read(options)
    assert message in str(error.value)


@pytest.mark.parametrize(("alias", "name", "value", "other"), [
    ("kafka.bootstrap.servers", "bootstrap", "127.0.0.1:7300", "10.0.0.1:7300"),
    ("subscribe", "topic", "events", "other"),
    ("kafka.isolation.level", "isolation", "read_committed", "read_uncommitted"),
])
def test_a_kafka_name_and_its_txlog_name_must_agree(alias, name, value, other):
    both = {**READ, name: value, alias: value}
    assert parse_read(both) == parse_read({**READ, name: value})
    for given in ({**READ, name: value, alias: other}, _spark_options({**READ, name: value, alias: other})):
        with pytest.raises(OptionError) as error:
            parse_read(given)
        assert f"options '{name}' and '{alias}' both set '{name}', to different values ('{value}' and '{other}')" \
            in str(error.value)


def test_an_option_given_twice_in_different_cases_with_different_values_is_refused():
    with pytest.raises(OptionError, match="options 'topic' and 'TOPIC' both set 'topic'"):
        parse_read({**READ, "TOPIC": "other"})
    with pytest.raises(OptionError, match="options 'bootstrap' and 'kafka.bootstrap.servers' both set 'bootstrap'"):
        parse_write({**WRITE, "kafka.bootstrap.servers": "10.0.0.1:1"})


@pytest.mark.parametrize(("option", "says"), [
    ("minOffsetsPerTrigger", "bounds each micro-batch by 'maxRecordsPerTrigger'"),
    ("maxTriggerDelay", "bounds each micro-batch by 'maxRecordsPerTrigger'"),
    ("startingOffsetsByTimestamp", "--to-datetime"),
    ("endingOffsetsByTimestamp", "--to-datetime"),
    ("startingTimestamp", "--to-datetime"),
    ("subscribePattern", "name the topics in 'topic'"),
    ("assign", "every partition of the topics in 'topic'"),
    ("minPartitions", "'maxRecordsPerSplit' splits"),
    ("kafka.group.id", "startingOffsets=committed:GROUP"),
    ("groupIdPrefix", "startingOffsets=committed:GROUP"),
    ("includeHeaders", "'headers' column is always read"),
    ("kafka.security.protocol", "'tlsCa'"),
])
def test_a_spark_kafka_option_without_an_equivalent_is_refused_saying_what_txlog_does(option, says):
    for given in (option, option.lower()):  # Spark may hand the key over lower-cased
        with pytest.raises(OptionError) as error:
            parse_read({**READ, given: "1"})
        message = str(error.value)
        assert f"unknown option '{option}' (a spark-sql-kafka option): txlog has no equivalent" in message
        assert says in message


@pytest.mark.parametrize("option", ["kafka.sasl.mechanism", "kafka.sasl.jaas.config", "kafka.ssl.truststore.location",
                                    "kafka.ssl.keystore.password"])
def test_kafka_security_settings_are_refused_naming_the_tls_options(option):
    for parse, options in ((parse_read, READ), (parse_write, WRITE)):
        with pytest.raises(OptionError) as error:
            parse({**options, option: "x"})
        assert f"unknown option '{option}' (a Kafka client setting): txlog has no equivalent" in str(error.value)
        assert all(f"'{name}'" in str(error.value) for name in ("tlsCa", "tlsCert", "tlsKey", "tokenFile"))


@pytest.mark.parametrize(("option", "instead"), [
    ("maxRecordsPerPartition", "use txlog's 'maxRecordsPerSplit', which means the same"),
    ("kafkaConsumer.pollTimeoutMs", "use txlog's 'pollTimeoutMs'"),
])
def test_a_spark_kafka_option_with_a_txlog_equivalent_names_it(option, instead):
    with pytest.raises(OptionError, match=f"unknown option '{option}' \\(a spark-sql-kafka option\\): {instead}"):
        parse_read({**READ, option.lower(): "10"})


def test_every_spark_kafka_option_refused_is_no_txlog_option():
    known = {name.lower() for name in (*READ_OPTIONS, *WRITE_OPTIONS)}
    assert not known & set(KAFKA_OPTIONS)
    assert parse_read({**READ, "failOnDataLoss": "false"}).fail_on_data_loss is False  # the same name in both


@pytest.mark.parametrize(("parse", "options", "typo", "meant"), [
    (parse_read, READ, "startingOffset", "startingOffsets"),
    (parse_read, READ, "startingoffset", "startingOffsets"),
    (parse_read, READ, "endingOfsets", "endingOffsets"),
    (parse_read, READ, "boostrap", "bootstrap"),
    (parse_read, READ, "topics", "topic"),
    (parse_read, READ, "maxRecordsPerSplits", "maxRecordsPerSplit"),
    (parse_read, READ, "isolationLevel", "kafka.isolation.level"),
    (parse_read, READ, "kafka.bootstrap.server", "kafka.bootstrap.servers"),
    (parse_write, WRITE, "transactionalIdPrefx", "transactionalIdPrefix"),
    (parse_write, WRITE, "transactiontimeout", "transactionTimeoutMs"),
    (parse_write, WRITE, "tlsCaCert", "tlsCert"),
])
def test_a_typo_is_refused_naming_the_closest_option(parse, options, typo, meant):
    with pytest.raises(OptionError) as error:
        parse({**options, typo: "1"})
    assert str(error.value) == f"txlog: unknown option '{typo}': did you mean '{meant}'?"


def test_an_option_like_none_is_refused_with_the_list_of_options():
    with pytest.raises(OptionError) as error:
        parse_read({**READ, "foo": "1"})
    assert str(error.value) == ("txlog: unknown option 'foo': the read options are bootstrap, topic, startingOffsets, "
                                "endingOffsets, isolation, maxRecordsPerSplit, maxRecordsPerTrigger, failOnDataLoss, "
                                "pollTimeoutMs, "
                                "tlsCa, tlsCert, tlsKey, tokenFile")
    with pytest.raises(OptionError, match=r"unknown option 'kafka.linger.ms' \(a Kafka client setting\): txlog has "
                                          r"no equivalent; the write options are bootstrap, topic, transactionalIdPrefix"):
        parse_write({**WRITE, "kafka.linger.ms": "5"})


def test_a_path_is_refused_pointing_at_topic():
    with pytest.raises(OptionError, match="a write takes no path .*name the topic in 'topic'"):
        parse_write({**WRITE, "path": "copy"})


@pytest.mark.parametrize(("parse", "options", "option", "message"), [
    (parse_read, READ, "transactionalIdPrefix", "option 'transactionalIdPrefix' is a write option: a read does not take it"),
    (parse_read, READ, "groupcommitwith", "option 'groupCommitWith' is a write option: a read does not take it"),
    (parse_write, WRITE, "startingOffsets", "option 'startingOffsets' is a read option: a write does not take it"),
    (parse_write, WRITE, "failOnDataLoss", "option 'failOnDataLoss' is a read option: a write does not take it"),
    (parse_write, WRITE, "subscribe", "option 'subscribe' is a read option: a write does not take it; use 'topic'"),
    (parse_write, WRITE, "kafka.isolation.level", "option 'kafka.isolation.level' is a read option: a write does not"),
])
def test_an_option_of_the_other_direction_is_refused_as_such(parse, options, option, message):
    with pytest.raises(OptionError) as error:
        parse({**options, option: "x"})
    assert message in str(error.value)


def test_several_unknown_options_are_all_named_at_once():
    with pytest.raises(OptionError) as error:
        parse_read({**READ, "minOffsetsPerTrigger": "10", "startingOffset": "latest", "kafka.acks": "all"})
    lines = str(error.value).splitlines()
    assert [line.split(":")[1].strip() for line in lines] == \
        ["unknown option 'minOffsetsPerTrigger' (a spark-sql-kafka option)", "unknown option 'startingOffset'",
         "unknown option 'kafka.acks' (a Kafka client setting)"]


def test_an_unknown_option_is_refused_before_a_missing_one_is_reported():
    with pytest.raises(OptionError, match="unknown option 'minOffsetsPerTrigger'"):
        parse_read({"minOffsetsPerTrigger": "10"})


# --- streaming reads and writes -----------------------------------------------------------------

def test_a_streaming_read_takes_max_records_per_trigger_and_kafkas_name_for_it():
    assert parse_read({**READ, "maxRecordsPerTrigger": "500"}, streaming=True).max_records_per_trigger == 500
    assert parse_read({**READ, "maxOffsetsPerTrigger": "20"}, streaming=True).max_records_per_trigger == 20
    assert parse_read(READ, streaming=True).max_records_per_trigger is None
    with pytest.raises(OptionError, match="'maxRecordsPerTrigger' must be a positive integer"):
        parse_read({**READ, "maxRecordsPerTrigger": "0"}, streaming=True)


@pytest.mark.parametrize(("options", "streaming", "says"), [
    ({"maxRecordsPerTrigger": "5"}, False, "option 'maxRecordsPerTrigger' is a streaming read option: a batch read does not take it"),
    ({"maxOffsetsPerTrigger": "5"}, False, "option 'maxoffsetspertrigger' (txlog's 'maxRecordsPerTrigger') is a streaming read option"),
    ({"endingOffsets": "latest"}, True, "option 'endingOffsets' is a batch read option: a streaming read does not take it"),
])
def test_a_read_option_of_the_other_kind_is_refused_saying_which_kind_takes_it(options, streaming, says):
    with pytest.raises(OptionError) as error:
        parse_read({**READ, **options}, streaming=streaming)
    assert says in str(error.value)


def test_a_streaming_write_takes_what_spark_hands_a_sink_and_refuses_group_commit_with():
    parsed = parse_write({**WRITE, "checkpointLocation": "/ckpt", "queryName": "q"}, streaming=True)
    assert (parsed.bootstrap, parsed.topic) == (WRITE["bootstrap"], WRITE["topic"])
    with pytest.raises(OptionError, match="option 'groupCommitWith' is a batch write option: a streaming write does not take it"):
        parse_write({**WRITE, "transactionalIdPrefix": "p", "groupCommitWith": "[]"}, streaming=True)
    with pytest.raises(OptionError, match="option 'checkpointLocation' is a streaming write option: a batch write does not take it"):
        parse_write({**WRITE, "checkpointLocation": "/ckpt"})
