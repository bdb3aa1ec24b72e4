"""Spark over mutual TLS (issue 15): the ``txlog`` data source with its
``tlsCa`` / ``tlsCert`` / ``tlsKey`` options, and the exactly-once job with
its ``--tls-*`` settings, on real Spark (local mode) and a cluster that
refuses plaintext and certificate-less clients."""

from __future__ import annotations

import pytest
from outputs import committed_offsets, counts, end_offsets, expected_views, read_all, views_of

from services.client import Admin
from services.cluster import LocalCluster
from spark_jobs import eos, options, sample_events, windowed_counts

EVENTS = 2000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("spark-tls") / "cluster")
    local.up(producer_id_svcs=1, partition_svcs=1, coordinator_svcs=1, tls=True)
    local.wait_until_coordinators_settle()
    yield local
    local.down(grace_s=5)


def spark_options(cluster: LocalCluster) -> dict[str, str]:
    tls = cluster.client_tls()
    return {option: tls[keyword] for option, keyword in options.TLS_OPTIONS.items()}


def test_a_transactional_write_and_a_read_committed_read_go_over_tls(spark, cluster):
    bootstrap, tls = cluster.state.bootstrap, cluster.client_tls()
    with Admin(bootstrap, **tls) as admin:
        admin.create_topics([("tls-out", 2)])
    rows = [(f"k{i}", f"v{i}") for i in range(50)]
    (spark.createDataFrame(rows, "key string, value string").write.format("txlog").option("bootstrap", bootstrap)
     .options(**spark_options(cluster)).option("topic", "tls-out").option("transactionalIdPrefix", "tls-writer")
     .mode("append").save())
    read = (spark.read.format("txlog").option("bootstrap", bootstrap).options(**spark_options(cluster))
            .option("topic", "tls-out").load().collect())
    assert sorted((r.key.decode(), r.value.decode()) for r in read) == sorted(rows)
    assert sorted((r.key.decode(), r.value.decode()) for r in read_all(bootstrap, "tls-out", **tls)) == sorted(rows)


def test_without_the_tls_options_the_read_fails_on_the_driver(spark, cluster):
    with pytest.raises(Exception, match="cannot read topic 'tls-out'"):
        spark.read.format("txlog").option("bootstrap", cluster.state.bootstrap).option("topic", "tls-out").load().collect()
    with pytest.raises(Exception, match="'tlsCert' and 'tlsKey' go together"):
        (spark.read.format("txlog").option("bootstrap", cluster.state.bootstrap).option("topic", "tls-out")
         .option("tlsCa", cluster.client_tls()["tls_ca"]).option("tlsCert", cluster.client_tls()["tls_cert"]).load().collect())


def test_the_exactly_once_job_runs_over_tls(spark, cluster):
    bootstrap, tls = cluster.state.bootstrap, cluster.client_tls()
    with Admin(bootstrap, **tls) as admin:
        admin.create_topics([("events", 2), ("event-counts", 1)])
    sample_events.load(bootstrap, "events", sample_events.events(EVENTS), **tls)
    settings = windowed_counts.config.load("job", windowed_counts.SETTINGS, [
        "--bootstrap", bootstrap, "--tls-ca", tls["tls_ca"], "--tls-cert", tls["tls_cert"], "--tls-key", tls["tls_key"]])
    job = windowed_counts.job_from(settings)
    assert job.client_tls == tls
    eos.run_once(spark, job)
    assert views_of(counts(bootstrap, "event-counts", **tls)) == expected_views(EVENTS)
    assert committed_offsets(bootstrap, job.group, "events", **tls) == end_offsets(bootstrap, "events", **tls)
