"""`txlog cluster up|kill|start|down` as a user runs them."""

import json
import subprocess
import sys
from pathlib import Path

from services.tooling.cluster import health_serving, pid_alive, zookeeper_serving
from txlog.two_phase import wait_until


def txlog(*args, check=True):
    result = subprocess.run([sys.executable, "-m", "txlog.cli", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_cluster_up_kill_start_down(tmp_path):
    directory = str(tmp_path / "c")
    try:
        txlog("cluster", "up", "--dir", directory)
        state = json.loads((tmp_path / "c" / "cluster.json").read_text())
        assert set(state["services"]) == {  # three partition_svc by default: topics get three replicas
            "zookeeper", "producer_id_svc-0", "partition_svc-0", "partition_svc-1", "partition_svc-2",
            "coordinator_svc-0", "coordinator_svc-1"
        }
        assert state["zookeeper"] == state["services"]["zookeeper"]["address"]
        assert state["bootstrap"].split(",") == [state["services"][f"partition_svc-{i}"]["address"] for i in (0, 1, 2)]
        assert all(health_serving(address) for address in state["bootstrap"].split(","))
        # the second coordinator taking its share of the transaction log is routine: no WARNING (it was one)
        handovers = [json.loads(line) for name in ("coordinator_svc-0", "coordinator_svc-1")
                     for line in Path(state["services"][name]["log"]).read_text().splitlines()
                     if "no longer serving transaction log partition" in line and "now owned by node" in line]
        assert all(entry["level"] == "INFO" for entry in handovers), handovers
        zk_address = state["zookeeper"]
        # its data folder is purged (ZooKeeperServerMain, the class first used, ignored the autopurge settings)
        zookeeper_log = Path(state["services"]["zookeeper"]["log"])
        assert "autopurge.purgeInterval set to 1" in zookeeper_log.read_text()
        wait_until(lambda: "Purge task started" in zookeeper_log.read_text(), 30, "ZooKeeper's purge task")  # its own thread
        pid_address = state["services"]["producer_id_svc-0"]["address"]
        assert zookeeper_serving(zk_address) and health_serving(pid_address)

        blocks = [json.loads(line) for line in txlog("producer-ids", "allocate", "--dir", directory, "--count", "2").stdout.splitlines()]
        # the coordinators took blocks of their own at start-up; ours are the next ones, consecutive
        assert [b["count"] for b in blocks] == [1000, 1000]
        assert blocks[1]["first_producer_id"] == blocks[0]["first_producer_id"] + 1000

        old_pid = state["services"]["producer_id_svc-0"]["pid"]
        txlog("cluster", "kill", "--dir", directory, "producer_id_svc-0")
        assert not pid_alive(old_pid)
        txlog("cluster", "start", "--dir", directory, "producer_id_svc-0")
        state = json.loads((tmp_path / "c" / "cluster.json").read_text())
        assert state["services"]["producer_id_svc-0"]["address"] == pid_address
        assert state["services"]["producer_id_svc-0"]["pid"] != old_pid
        assert health_serving(pid_address)
        again = json.loads(txlog("producer-ids", "allocate", "--dir", directory).stdout)
        assert again["first_producer_id"] > blocks[1]["first_producer_id"]  # after the restart: a new block, never a repeat

        failed = txlog("cluster", "kill", "--dir", directory, "nosuch", check=False)
        assert failed.returncode == 1 and "no process named 'nosuch'" in failed.stderr
        failed = txlog("producer-ids", "allocate", "--dir", directory, "--requester-id", "-5", check=False)
        assert failed.returncode == 1 and "INVALID_REQUEST" in failed.stderr
    finally:
        txlog("cluster", "down", "--dir", directory, check=False)
    pids = [info["pid"] for info in json.loads((tmp_path / "c" / "cluster.json").read_text())["services"].values()]
    assert not any(pid_alive(pid) for pid in pids)
    status = json.loads(txlog("cluster", "status", "--dir", directory).stdout)
    assert not any(entry["alive"] for entry in status.values())
    assert "was not running (nothing to stop)" in txlog("cluster", "down", "--dir", directory).stdout
    # a stopped cluster is told from cluster.json, not after the SDK's retries run out
    failed = txlog("topics", "list", "--dir", directory, check=False)
    assert failed.returncode == 1 and "is not running: none of its partition_svc processes is alive" in failed.stderr


def test_cluster_commands_without_a_cluster_say_so(tmp_path):
    for args in (("kill", "--dir", str(tmp_path), "zookeeper"), ("status", "--dir", str(tmp_path / "missing")),
                 ("down", "--dir", str(tmp_path))):
        result = txlog("cluster", *args, check=False)
        assert result.returncode == 1 and result.stderr.startswith("error: no cluster in"), (args, result.stderr)
