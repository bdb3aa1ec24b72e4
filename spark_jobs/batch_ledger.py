"""Which micro-batches of a streaming query have committed their output.

Spark re-runs a micro-batch whose offsets it logged but whose commit it did
not (the driver died in between). Its output may already be committed: the
driver can die after the group commit and before Spark's own commit log. So
the commit of micro-batch B records B in the same group commit as B's output,
and a commit of B first asks whether B is recorded.

The record is a consumer-group offset, written in a transaction of the
query's transaction group ``P`` (transactional id ``P/batches``): group
``P.batches`` at partition 0 of the output topic holds the last committed batch
id plus one. Offsets committed in a transaction become visible exactly when the
transaction commits (KIP-447's stable offsets), so "B is recorded" and "B's
output is committed" are one fact.

Opening the ledger initialises ``P/batches``, which fences the ledger of any
earlier driver of the query: a zombie driver's group commit, whose ledger
transaction is then aborted (or, decided already, completed first), cannot
commit after this one has looked.
"""

from __future__ import annotations

from collections.abc import Mapping

from txlog import Consumer, Producer, TransactionHandle


class BatchLedger:
    """Use as a context manager (closing it leaves a prepared ledger transaction
    to its group commit); ``fence()`` before anything else."""

    def __init__(self, bootstrap: str, prefix: str, output_topic: str, client_tls: Mapping[str, str] | None = None,
                 transaction_timeout_ms: int = 60_000):
        self.bootstrap = bootstrap
        self.prefix = prefix
        self.group = f"{prefix}.batches"
        self.tp = (output_topic, 0)
        self.client_tls = dict(client_tls or {})
        self.producer = Producer(bootstrap, transactional_id=f"{prefix}/batches", transaction_timeout_ms=transaction_timeout_ms,
                                 **self.client_tls)

    def __enter__(self) -> BatchLedger:
        return self

    def __exit__(self, *exc) -> None:
        self.producer.close()

    def fence(self) -> None:
        """Initialises ``P/batches``: an earlier driver's ledger transaction is aborted (or, decided, completed)."""
        self.producer.init_transactions()

    def last_committed(self) -> int | None:
        """The id of the last micro-batch committed, None before the first;
        waits while a ledger transaction is pending (require_stable)."""
        with Consumer(self.bootstrap, group_id=self.group, isolation_level="read_committed", **self.client_tls) as consumer:
            next_batch = consumer.committed(self.tp)
        return None if next_batch is None else next_batch - 1

    def prepare(self, batch_id: int) -> TransactionHandle:
        """A prepared transaction that records ``batch_id``, to commit in the batch's group commit."""
        self.producer.begin_transaction()
        self.producer.send_offsets_to_transaction({self.tp: batch_id + 1}, self.group)
        return self.producer.prepare_transaction()
