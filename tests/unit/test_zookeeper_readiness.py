"""LocalCluster and ZooKeeper: its readiness probe says ready when ZooKeeper
serves sessions, not when its port answers; an address where no ZooKeeper
answers is a clear ClusterError. A socket server stands in for ZooKeeper's
four-letter-word port (what it answers is ZooKeeper 3.8's text, verbatim in
form); the probe's reading of it is under test, not ZooKeeper."""

from __future__ import annotations

import socket
import threading

import pytest

from services.tooling.cluster import ClusterError, zookeeper_serving, zookeeper_session

NOT_SERVING = "This ZooKeeper instance is not currently serving requests\n"
SERVING = ("Zookeeper version: 3.8.0, built on 2023-01-01 00:00 UTC\nLatency min/avg/max: 0/0.0/0\nReceived: 3\n"
           "Sent: 2\nConnections: 1\nOutstanding: 0\nZxid: 0x2\nMode: standalone\nNode count: 5\n")


@pytest.fixture
def four_letter_port():
    """A port answering every command with ``answer["text"]``, as ZooKeeper's does (then it closes)."""
    answer = {"text": ""}
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            with connection:
                connection.recv(4)
                connection.sendall(answer["text"].encode())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}", answer
    stop.set()
    thread.join()
    listener.close()


def test_a_zookeeper_still_loading_is_not_ready_though_its_port_answers(four_letter_port):
    address, answer = four_letter_port
    answer["text"] = NOT_SERVING
    assert not zookeeper_serving(address)
    answer["text"] = SERVING
    assert zookeeper_serving(address)
    assert zookeeper_serving(f"{address}/a-chroot")  # a connection string with a chroot probes the same port


def test_nothing_listening_is_not_ready():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
    assert not zookeeper_serving(address)


def test_a_zookeeper_that_does_not_answer_is_a_clear_error_naming_it():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
    with pytest.raises(ClusterError, match=f"no ZooKeeper answered at {address} within 1 s"):
        with zookeeper_session(address, timeout_s=1):
            raise AssertionError("a session started")
