"""The chaos workload, short, on a real local cluster: producers committing and
aborting, consume-transform-produce with offsets in its transactions, pollers
of both isolations, a silent owner whose prepared transactions only the
check-back decides (its TransactionChecker answering from the decisions it
recorded before preparing), on three partition_svc with every partition replicated
three times, under every fault kind (kill -9 and restart of each service and
ZooKeeper, of a busy partition's leader, a replica's data directory wiped,
SIGSTOP/SIGCONT of a leader, of a coordinator and of a producer,
connection cuts, an instance cut off from ZooKeeper, from its peers, or both
as a minority side, and a producer's COMMIT/ABORT markers, EndTxn and Produce
delivered again seconds later, into the next transaction). The seed is fixed:
a failure replays with
``txlog chaos run --minutes 2.7 --seed 20240611 --fault-interval-s 6 --keep``."""

import pytest

from services.tooling.chaos.checker import ANOMALIES
from services.tooling.chaos.faults import FAULT_KINDS
from services.tooling.chaos.history import REPLAY_KINDS
from services.tooling.chaos.run import run

SEED = 20240611
WORKLOAD_S = 100  # the run goes on until each of the 16 fault kinds was injected once (one every ~6 s; pauses and cuts last 8 s, replays ~3 s)


@pytest.mark.timeout(600)  # about 3.5 min alone; longer beside the suite's other workers, each fault waiting to heal
def test_no_anomaly_under_every_kind_of_fault(tmp_path):
    summary = run(WORKLOAD_S, seed=SEED, directory=tmp_path / "chaos", keep=True, fault_interval_s=6, silent_owners=1)
    print(summary)
    anomalies = {kind: summary[kind] for kind in ANOMALIES if summary[kind]}
    assert anomalies == {}, f"seed {SEED}: anomalies {anomalies}; examples in {summary['dir']}/result.json"
    assert summary["committed"] > 0 and summary["aborted"] > 0, summary
    assert summary["final_read_committed"] > 0, summary
    assert summary["records_polled"] > 0, summary
    assert summary["silent_prepared"] > 0 and summary["silent_committed_visible"] > 0, summary
    assert summary["checks_by_answer"].get("COMMIT", 0) > 0 and summary["checks_by_answer"].get("ABORT", 0) > 0, summary
    assert summary["fault_errors"] == [], summary
    assert summary["stuck_workers"] == [], summary
    missing = [kind for kind in (*FAULT_KINDS, "connection_cuts") if summary["faults"][kind] == 0]
    assert missing == [], f"fault kinds never injected: {missing}; {summary['faults']}"
    assert set(summary["replay_answers"]) == set(REPLAY_KINDS), summary["replay_answers"]
