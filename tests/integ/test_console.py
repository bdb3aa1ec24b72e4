"""`txlog console` through the real services (issue 37): a local cluster with
a topic, an open transaction and a consumer group made by the test, the
console started as a user starts it, each page fetched over HTTP (cookies
kept, as a browser keeps them) and checked for the cluster's real state; the
actions confirmed and done, refused without the confirmation's token, on bad
input and by a read-only console. Pages in a real browser: test_console_browser.py."""

from __future__ import annotations

import html
import http.cookiejar
import json
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

import txlog
from tests.conftest import FULL, fresh_chroot, running
from tests.integ.console_support import answered, made_state, started_console, stopped
from txlog import Admin, Producer
from txlog.two_phase import wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, shared_zookeeper):
    yield from running(tmp_path_factory.mktemp("console"), fresh_chroot(shared_zookeeper), FULL)


@pytest.fixture(scope="module")
def console(cluster, tmp_path_factory):
    url, process = started_console(["--bootstrap", cluster.state.bootstrap],
                                   tmp_path_factory.mktemp("console-ro") / "console.log", "--read-only")
    yield url
    stopped(process)


@pytest.fixture(scope="module")
def acting(cluster, tmp_path_factory):
    """A console that acts, for which an open transaction is hanging after 100 ms; (its URL, its log)."""
    log_path = tmp_path_factory.mktemp("console-rw") / "console.log"
    url, process = started_console(["--bootstrap", cluster.state.bootstrap], log_path, "--hanging-after-ms", "100")
    yield url, log_path
    stopped(process)


class Browser:
    """An HTTP client that keeps cookies, as a browser does (the actions' CSRF token is one)."""

    def __init__(self, base: str):
        self.base = base
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        self.at = ""  # the path of the last page opened, after any redirect

    def open(self, path: str, form: dict | None = None) -> tuple[int, str]:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        try:
            with self.opener.open(self.base + path, data=data, timeout=60) as answer:
                self.at = answer.url.removeprefix(self.base)
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


def hidden_fields(page: str) -> dict:
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page))


def action_link(page: str, name: str) -> str:
    found = re.search(rf'href="(/actions/{name}\?[^"]+)"', page)
    assert found, f"no {name} action on the page"
    return html.unescape(found.group(1))


def get(base: str, path: str) -> tuple[int, str]:
    page = answered(base + path)
    assert page is not None, f"the console at {base} does not answer"
    return page


@pytest.fixture(scope="module")
def state(cluster):
    """A topic of 3 partitions with records, a transaction left open on partition 1, a group with offsets."""
    made, producer = made_state(cluster.state.bootstrap, "console", 3)
    yield made
    producer.abort_transaction()
    producer.close()


def test_the_overview_shows_the_instances_and_the_open_transaction(console, state, cluster):
    status, page = get(console, "/")
    assert status == 200
    rows = re.findall(r'<tr data-kind="([a-z_]+)" data-node="(\d+)"><td>[a-z_]+</td><td>\d+</td><td>([^<]*)</td>\s*'
                      r'<td>live</td><td>([^<]*)</td>\s*<td>([^<]*)</td>', page)
    shown = sorted((kind, int(node), address) for kind, node, address, _, _ in rows)
    running = sorted((info.kind, int(name.rpartition("-")[2]), info.address)
                     for name, info in cluster.state.services.items() if info.kind != "zookeeper")
    assert shown == running, "every instance of every service, live, with its address"
    assert {version for *_, version in rows} == {txlog.__version__}
    controller = re.search(r'id="controller">Controller: <b>partition_svc (\d+)</b>, epoch (\d+)', page)
    assert controller and int(controller.group(2)) >= 1, "the controller and its epoch"
    roles = {(kind, int(node)): roles for kind, node, _, roles, _ in rows}
    assert roles[("partition_svc", int(controller.group(1)))].startswith("controller, leads ")
    assert [key for key, r in roles.items() if "controller" in r.split(", ")] == [("partition_svc", int(controller.group(1)))]
    assert re.search(r"<b>[1-9][0-9]*</b> open", page), "the test's transaction is open"
    # started with --bootstrap alone: the rates and alerts come from the metrics endpoints the instances registered
    assert 'id="alerts"' in page and "does not answer" not in page and 'id="rates-chart"' in page
    status, rates = get(console, "/rates.json")
    assert status == 200 and json.loads(rates)["unreachable"] == []


def test_pages_load_side_by_side_on_one_admin_client(console, state):
    paths = ["/", "/topics", f"/topics/{state['topic']}", "/transactions", "/groups", "/security"] * 2
    with ThreadPoolExecutor(len(paths)) as pool:
        answers = list(pool.map(lambda path: get(console, path), paths))
    assert [status for status, _ in answers] == [200] * len(paths)
    assert all(page.count("<tr class=") == 3 for _, page in answers[2::6]), "each answer is its own page's"
    assert all(state["transactional_id"] in page for _, page in answers[3::6])


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
    status, page = get(console, "/transactions?state=Bogus")
    assert status == 400 and "unknown transaction state" in page
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


def test_a_hanging_transaction_is_aborted_from_the_page_in_two_clicks_and_its_lso_moves(cluster, acting):
    url, log_path = acting
    topic = f"console-hang-{uuid.uuid4().hex[:6]}"
    with Admin(cluster.state.bootstrap) as admin:
        admin.create_topics([(topic, 1)])
    producer = Producer(cluster.state.bootstrap, transactional_id=f"console-hang-{uuid.uuid4().hex[:6]}")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(topic, value=b"left open", partition=0).result(timeout=60)
    browser = Browser(url)
    try:
        pages = []
        wait_until(lambda: pages.append(browser.open("/")[1]) or f"{topic}-0" in pages[-1], 60, "the page showing it hanging")
        row = next(r for r in pages[-1].split('id="hanging"')[1].split("<tr>") if f"{topic}-0" in r)
        status, confirm = browser.open(action_link(row, "abort-hanging"))  # click 1
        assert status == 200 and f"ABORT marker on {topic}-0" in confirm
        assert 'class="warn">1</td>' in browser.open(f"/topics/{topic}")[1], "the LSO held back by one record"
        status, done = browser.open("/actions/abort-hanging", hidden_fields(confirm))  # click 2: Confirm
        assert status == 200 and 'id="done"' in done, done
        result = browser.at
        assert result.startswith("/actions/abort-hanging/done/"), "the POST redirected to its result (Post/Redirect/Get)"
        assert f'href="/topics/{topic}" id="back"' in done
        # the last stable offset moved past the aborted record and its marker: nothing held back any more
        row = browser.open(f"/topics/{topic}")[1].split("<tbody>")[1]
        assert "<td>2</td><td>2</td>" in row and 'class="warn"' not in row, row
        status, again = browser.open(result)  # a reload shows the result and does not act again
        assert status == 200 and 'id="done"' in again

        def done_lines():
            audit = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
            return [a for a in audit if a["action"] == "abort-hanging" and a["outcome"] == "done" and a["params"]["topic"] == topic]
        assert len(done_lines()) == 1, done_lines()
        assert browser.open("/actions/abort-hanging/done/not-a-result")[0] == 404
    finally:
        producer.close()


def test_an_action_is_taken_only_with_the_confirmations_token(cluster, acting, state):
    url, log_path = acting
    reset = {"group_id": state["group"], "topic": state["topic"], "to": "earliest"}
    status, page = Browser(url).open("/actions/reset-offsets", reset)  # a POST no confirmation page gave a token
    assert status == 403 and "CSRF" in page
    with Admin(cluster.state.bootstrap) as admin:
        assert admin.list_group_offsets(state["group"])[(state["topic"], 0)] == 1, "nothing changed"


def test_a_groups_offsets_are_reset_after_a_dry_run(cluster, acting, state):
    url, _ = acting
    browser = Browser(url)
    status, dry_run = browser.open("/actions/reset-offsets?" + urllib.parse.urlencode(
        {"group_id": state["group"], "topic": state["topic"], "to": "earliest"}))
    assert status == 200 and f"{state['topic']}-0: 1 -&gt; 0" in dry_run, dry_run
    with Admin(cluster.state.bootstrap) as admin:
        assert admin.list_group_offsets(state["group"])[(state["topic"], 0)] == 1, "a dry run changes nothing"
        status, done = browser.open("/actions/reset-offsets", hidden_fields(dry_run))
        assert status == 200 and 'id="done"' in done, done
        assert admin.list_group_offsets(state["group"])[(state["topic"], 0)] == 0
        admin.alter_group_offsets(state["group"], {(state["topic"], 0): 1})  # as the other tests expect it


def test_a_prepared_transaction_is_committed_from_its_page(cluster, acting):
    url, _ = acting
    topic, transactional_id = f"console-2pc-{uuid.uuid4().hex[:6]}", f"console-2pc-{uuid.uuid4().hex[:6]}"
    with Admin(cluster.state.bootstrap) as admin:
        admin.create_topics([(topic, 1)])
    with Producer(cluster.state.bootstrap, transactional_id=transactional_id) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, value=b"prepared", partition=0)
        producer.prepare_transaction()
    browser = Browser(url)
    status, page = browser.open("/transactions/" + urllib.parse.quote(transactional_id))
    assert status == 200 and 'id="state">Prepared<' in page
    status, confirm = browser.open(action_link(page, "complete-prepared"))  # Commit comes first
    assert status == 200 and "Commit the prepared transaction" in confirm
    status, done = browser.open("/actions/complete-prepared", hidden_fields(confirm))
    assert status == 200 and 'id="done"' in done, done
    wait_until(lambda: 'id="state">CompleteCommit<' in browser.open("/transactions/" + urllib.parse.quote(transactional_id))[1],
               60, "the transaction committed")


def test_bad_input_and_a_read_only_console_change_nothing(console, acting, state):
    url, _ = acting
    status, page = Browser(url).open("/actions/abort-hanging?topic=t&partition=x&producer_id=1&producer_epoch=0&coordinator_epoch=0")
    assert status == 400 and "partition must be an integer" in page
    status, page = Browser(url).open("/actions/no-such-action")
    assert status == 404
    status, page = Browser(url).open("/actions/abort-hanging?topic=t&partition=0&producer_id=1&producer_epoch=0&coordinator_epoch=99999999999")
    assert status == 400 and "coordinator_epoch must be from -1 to 2147483647" in page
    status, page = Browser(url).open(f"/actions/abort-hanging?topic={state['topic']}&partition=0&producer_id=1"
                                     "&producer_epoch=0&coordinator_epoch=0")
    assert status == 400 and "no hanging transaction" in page, "only a hanging transaction is offered for abort"
    status, page = Browser(url).open("/actions/reset-offsets?group_id=no-such-group&topic=t&to=earliest")
    assert status == 400 and "there is no group" in page, "a typo would make a group"
    status, page = Browser(console).open("/actions/abort-hanging?topic=t&partition=0&producer_id=1&producer_epoch=0&coordinator_epoch=0")
    assert status == 403 and "read-only" in page
    assert "/actions/" not in get(console, "/groups")[1], "no action offered"


def test_the_security_page_shows_the_client_quotas(cluster, console):
    with Admin(cluster.state.bootstrap) as admin:
        admin.alter_client_quotas({"client-id": "console-shown"}, {"producer_byte_rate": 2048})
    status, page = get(console, "/security")
    assert status == 200 and "<td>console-shown</td>" in page and "producer_byte_rate=2048" in page
    assert "runs without an authorizer" in page, page.split("<h1>ACLs</h1>")[1][:600]


def test_pages_answer_only_to_their_own_host_name_and_refuse_framing(acting):
    url, _ = acting
    request = urllib.request.Request(url + "/", headers={"Host": "rebound.example"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 400, "a page served under another name would be that origin's to read"
    with urllib.request.urlopen(url + "/", timeout=60) as answer:
        assert answer.headers["X-Frame-Options"] == "DENY"


def test_a_post_from_another_origin_is_refused_even_with_a_token(cluster, acting, state):
    url, _ = acting
    browser = Browser(url)
    status, dry_run = browser.open("/actions/reset-offsets?" + urllib.parse.urlencode(
        {"group_id": state["group"], "topic": state["topic"], "to": "earliest"}))
    assert status == 200
    browser.opener.addheaders = [("Origin", "http://evil.example")]
    status, page = browser.open("/actions/reset-offsets", hidden_fields(dry_run))
    assert status == 403 and "CSRF" in page
    with Admin(cluster.state.bootstrap) as admin:
        assert admin.list_group_offsets(state["group"])[(state["topic"], 0)] == 1, "nothing changed"


@pytest.fixture
def lonely_cluster(tmp_path, shared_zookeeper):
    """Two partition_svc and one coordinator, of this test's own (it stops an instance)."""
    yield from running(tmp_path / "cluster", fresh_chroot(shared_zookeeper),
                       {"partition_svcs": 2, "coordinator_svcs": 1, "service_args": FULL["service_args"]})


def test_an_offline_partition_is_shown_and_every_page_still_loads(lonely_cluster, tmp_path):
    """A topic whose partitions have one replica each, the instance holding one of them stopped: the overview
    names the partition offline and the instance down, its topic page marks it, and no page fails or hangs on it."""
    topic = "lonely"
    with Admin(lonely_cluster.state.bootstrap) as admin:
        admin.create_topics([(topic, 2, 1)])
        (described,) = admin.describe_topics([topic])
    stranded = next(p for p in described.partitions if p.replicas == (1,)) if any(
        p.replicas == (1,) for p in described.partitions) else None
    assert stranded is not None, f"two partitions of one replica each are placed on both instances: {described}"
    lonely_cluster.kill("partition_svc-1")
    url, process = started_console(["--bootstrap", lonely_cluster.state.services["partition_svc-0"].address],
                                   tmp_path / "console.log", "--read-only")
    try:
        pages = []
        wait_until(lambda: pages.append(get(url, "/")) or f"{topic}-{stranded.partition}: offline" in pages[-1][1],
                   60, "the overview naming the partition offline")
        status, page = pages[-1]
        assert status == 200 and 'class="card bad" id="health"' in page
        down = re.search(r'<tr data-kind="partition_svc" data-node="1">.*?</tr>', page, re.S)
        assert down and '<span class="bad">down</span>' in down.group(0), "the stopped instance, named by its replicas"
        status, page = get(url, f"/topics/{topic}")
        rows = page.split("<tbody>")[1].split("</tbody>")[0].split("<tr class=")[1:]
        assert status == 200 and len(rows) == 2
        assert rows[stranded.partition].startswith('"bad"') and "<td>none</td>" in rows[stranded.partition]
        assert not rows[1 - stranded.partition].startswith('"bad"'), "the other partition is served"
        for path in ("/topics", "/transactions", "/groups", "/security"):
            assert get(url, path)[0] == 200, path
    finally:
        stopped(process)
