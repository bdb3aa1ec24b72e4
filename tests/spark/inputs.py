"""What the Spark tests put into a cluster before a job reads it."""

from __future__ import annotations

from txlog import Admin, Producer


def create(bootstrap: str, topic: str, partitions: int) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topics([(topic, partitions)])


def produce(bootstrap: str, topic: str, values: list[str], partition: int | None = None) -> None:
    """Each value keyed by itself, with header origin=test, acknowledged one by one (in order)."""
    with Producer(bootstrap) as producer:
        for value in values:
            producer.send(topic, value=value, key=value, partition=partition,
                          headers=[("origin", b"test")]).result(timeout=30)
