import pytest

from services.runtime.config import COMMON_SETTINGS, Setting, load, markdown_table, positive_int

SETTINGS = (*COMMON_SETTINGS, Setting("listen", "0.0.0.0:7100", "bind"), Setting("batch_max", 10, "limit", positive_int))


def test_defaults_apply_without_flags_or_environment():
    cfg = load("t", SETTINGS, [], {})
    assert (cfg.listen, cfg.batch_max, cfg.zookeeper_root, cfg.otel_exporter) == ("0.0.0.0:7100", 10, "/txlog", "none")


def test_environment_overrides_default_and_flag_overrides_environment():
    env = {"TXLOG_LISTEN": "127.0.0.1:1", "TXLOG_BATCH_MAX": "20"}
    cfg = load("t", SETTINGS, [], env)
    assert (cfg.listen, cfg.batch_max) == ("127.0.0.1:1", 20)
    cfg = load("t", SETTINGS, ["--listen", "127.0.0.1:2"], env)
    assert (cfg.listen, cfg.batch_max) == ("127.0.0.1:2", 20)


@pytest.mark.parametrize(
    "argv, env, named",
    [
        (["--batch-max", "0"], {}, "--batch-max"),
        ([], {"TXLOG_BATCH_MAX": "many"}, "TXLOG_BATCH_MAX"),
        (["--otel-exporter", "jaeger"], {}, "--otel-exporter"),
        ([], {"TXLOG_LOG_LEVEL": "LOUD"}, "TXLOG_LOG_LEVEL"),
    ],
)
def test_a_bad_value_exits_2_naming_the_setting(argv, env, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load("t", SETTINGS, argv, env)
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err


def test_help_names_every_environment_variable(capsys):
    with pytest.raises(SystemExit):
        load("t", SETTINGS, ["--help"], {})
    out = capsys.readouterr().out
    for setting in SETTINGS:
        assert setting.env in out


def test_markdown_table_lists_every_setting():
    table = markdown_table(SETTINGS)
    assert all(f"`{s.flag}`" in table for s in SETTINGS)


def test_spark_guide_documents_every_setting_of_the_job():
    """The services' settings are in the generated configuration reference (tests/unit/test_docs.py checks
    it); the shipped Spark job's are a table in its guide."""
    from pathlib import Path

    from spark_jobs.windowed_counts import SETTINGS as JOB_SETTINGS

    guide = (Path(__file__).parents[2] / "docs" / "guides" / "spark.md").read_text()
    for setting in JOB_SETTINGS:
        assert f"`{setting.flag}` | `{setting.env}`" in guide, setting.name
