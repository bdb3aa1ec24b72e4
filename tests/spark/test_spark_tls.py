"""Spark over mutual TLS (issue 15): the ``txlog`` data source with its
``tlsCa`` / ``tlsCert`` / ``tlsKey`` options, and the exactly-once job with
its ``--tls-*`` settings, on real Spark (local mode) and a cluster that
refuses plaintext and certificate-less clients."""

from __future__ import annotations

from pathlib import Path

import pytest
from outputs import committed_offsets, counts, end_offsets, expected_views, read_all, views_of

from services.security import certs
from services.tooling.cluster import LocalCluster
from spark_jobs import eos, options, sample_events, windowed_counts
from txlog import Admin
from txlog.protocol.acls import ALLOW, GROUP, LITERAL, PREFIXED, TOPIC, TRANSACTIONAL_ID, AclBinding
from txlog.two_phase import wait_until

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
    return {option: tls[keyword] for option, keyword in options.TLS_OPTIONS.items() if keyword in tls}


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


def job_acls(principal: str, job: eos.EosJob) -> list[AclBinding]:
    """What the chart's ACL bootstrap grants the job (authorizer.grantSparkJob)."""
    return [*(AclBinding(TOPIC, LITERAL, topic, principal, "*", "Read", ALLOW) for topic in job.input_topics),
            AclBinding(TOPIC, LITERAL, job.output_topic, principal, "*", "Write", ALLOW),
            AclBinding(GROUP, LITERAL, job.group, principal, "*", "Read", ALLOW),
            # its per-partition ids (name:topic:partition) and its transaction group's (name/...)
            *(AclBinding(TRANSACTIONAL_ID, PREFIXED, f"{job.name}{separator}", principal, "*", "Write", ALLOW) for separator in ":/")]


def test_the_exactly_once_job_runs_over_tls_as_a_principal_allowed_only_what_it_needs(spark, cluster):
    """The job runs as User:etl, not a super user: ACLs allow it to read its
    input and group and write its output and transactional ids, nothing else."""
    bootstrap, tls = cluster.state.bootstrap, cluster.client_tls()
    with Admin(bootstrap, **tls) as admin:
        admin.create_topics([("events", 2), ("event-counts", 1)])
    sample_events.load(bootstrap, "events", sample_events.events(EVENTS), **tls)
    directory = Path(cluster.state.tls["dir"])
    certs.issue(directory, "etl")
    etl = {"tls_ca": tls["tls_ca"], "tls_cert": str(directory / "etl.pem"), "tls_key": str(directory / "etl-key.pem")}
    settings = windowed_counts.config.load("job", windowed_counts.SETTINGS, [
        "--bootstrap", bootstrap, "--tls-ca", etl["tls_ca"], "--tls-cert", etl["tls_cert"], "--tls-key", etl["tls_key"]])
    job = windowed_counts.job_from(settings)
    assert job.client_tls == etl
    with pytest.raises(Exception, match="AUTHORIZATION_FAILED"):
        eos.run_once(spark, job)  # no ACL yet: refused before anything is written
    assert counts(bootstrap, "event-counts", **tls) == []
    with Admin(bootstrap, **tls) as admin:
        admin.create_acls(job_acls("User:etl", job))
    with Admin(bootstrap, **etl) as admin:
        wait_until(lambda: admin.list_topics() == ["event-counts", "events"], 30, "the job's ACLs in force")
    eos.run_once(spark, job)
    assert views_of(counts(bootstrap, "event-counts", **tls)) == expected_views(EVENTS)
    assert committed_offsets(bootstrap, job.group, "events", **tls) == end_offsets(bootstrap, "events", **tls)
