"""`txlog console` through the real services (issue 37, first part: the
pages): a local cluster with a topic, an open transaction and a consumer
group made by the test, the console started as a user starts it, each page
fetched over HTTP and checked for the cluster's real state. Tests in a real
browser, and the actions, come with the rest of the issue."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest

from services.tooling.cluster import free_port
from tests.conftest import FULL, fresh_chroot, running
from txlog import Admin, Consumer, Producer
from txlog.two_phase import wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, shared_zookeeper):
    yield from running(tmp_path_factory.mktemp("console"), fresh_chroot(shared_zookeeper), FULL)


@pytest.fixture(scope="module")
def console(cluster):
    address = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen([sys.executable, "-m", "txlog.cli", "console", "--bootstrap", cluster.state.bootstrap,
                                "--listen", address, "--read-only"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def serving() -> bool:
        assert process.poll() is None, process.stdout.read().decode()
        try:
            return get(f"http://{address}", "/")[0] == 200
        except OSError:
            return False

    wait_until(serving, 60, "the console serving")
    yield f"http://{address}"
    process.terminate()
    process.wait(timeout=30)


def get(base: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(base + path, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def state(cluster):
    """A topic of 3 partitions with records, a transaction left open on partition 1, a group with offsets."""
    topic, transactional_id, group = (f"console-{uuid.uuid4().hex[:6]}", f"console-txn-{uuid.uuid4().hex[:6]}",
                                      f"console-group-{uuid.uuid4().hex[:6]}")
    bootstrap = cluster.state.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([(topic, 3)])
    with Producer(bootstrap) as plain:
        for partition in range(3):
            plain.send(topic, value=b"committed", partition=partition).result(timeout=60)
    with Consumer(bootstrap, group_id=group, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, 0)])
        wait_until(lambda: bool(consumer.poll(0.5)), 60, "a record polled")
        consumer.commit()
    producer = Producer(bootstrap, transactional_id=transactional_id)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(topic, value=b"open", partition=1).result(timeout=60)
    yield {"topic": topic, "transactional_id": transactional_id, "group": group}
    producer.abort_transaction()
    producer.close()


def test_the_overview_shows_the_instances_and_the_open_transaction(console, state):
    status, page = get(console, "/")
    assert status == 200
    assert 'id="nodes"' in page and page.count("<td>live</td>") == 2, "two live partition_svc"
    assert "<b>1</b> open" in page


def test_the_topics_pages_show_the_partitions_and_the_lso_held_back(console, state):
    status, page = get(console, "/topics")
    assert status == 200 and f'href="/topics/{state["topic"]}"' in page
    status, page = get(console, f"/topics/{state['topic']}")
    assert status == 200 and page.count("<tr class=") == 3, "one row per partition"
    rows = page.split("<tr class=")[1:]
    # partition 1: high watermark 2 (the committed record and the open one), last stable 1, one offset held back
    assert "<td>2</td><td>1</td>" in rows[1] and 'class="warn">1</td>' in rows[1], rows[1]
    assert "<td>1</td><td>1</td>" in rows[0], rows[0]


def test_the_transactions_pages_show_the_open_transaction_and_its_producer_state(console, state):
    status, page = get(console, "/transactions?state=Ongoing")
    assert status == 200 and state["transactional_id"] in page and "<td>Ongoing</td>" in page
    status, page = get(console, "/transactions?state=Prepared")
    assert status == 200 and state["transactional_id"] not in page
    status, page = get(console, "/transactions/" + urllib.parse.quote(state["transactional_id"]))
    assert status == 200 and 'id="state">Ongoing<' in page
    assert f"{state['topic']}-1" in page and "open since offset 1" in page


def test_the_groups_page_shows_committed_offsets_and_lag(console, state):
    status, page = get(console, "/groups")
    assert status == 200 and f'id="group-{state["group"]}"' in page
    section = page.split(f'id="group-{state["group"]}"')[1].split("</section>")[0]
    assert f"<td>{state['topic']}-0</td><td>1</td><td>1</td>" in section, section


def test_what_the_cluster_refuses_is_shown_with_its_code(console):
    status, page = get(console, "/topics/no-such-topic")
    assert status == 404 and "UNKNOWN_TOPIC_OR_PARTITION" in page and "Traceback" not in page
    status, page = get(console, "/transactions/no-such-id")
    assert status == 404 and "TRANSACTIONAL_ID_NOT_FOUND" in page


def test_the_read_only_console_says_so(console):
    assert 'class="badge">read-only<' in get(console, "/")[1]


def test_a_listen_address_without_a_port_is_refused_before_anything_starts(cluster):
    result = subprocess.run([sys.executable, "-m", "txlog.cli", "console", "--bootstrap", cluster.state.bootstrap,
                             "--listen", "127.0.0.1"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "--listen takes HOST:PORT" in result.stderr, result.stderr
