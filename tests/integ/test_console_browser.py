"""The web console in a real browser (issue 37): Debian's headless Chromium,
driven through chromium-driver by Selenium, against a real local cluster with a
topic, an open transaction and a consumer group the test made. Each page loads
without an error in the browser's console and shows the cluster's state; a
hanging transaction is aborted in two clicks and its partition's last stable
offset moves; a read-only console offers no action; an action the cluster's
ACLs refuse shows the cluster's error. A screenshot of each page is saved
under $TXLOG_TEST_ARTIFACTS (default: the test's temporary folder)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from services.tooling.cluster import LocalCluster
from tests.conftest import FULL, fresh_chroot, running
from tests.integ.console_support import made_state, started_console, stopped
from txlog import Admin
from txlog.two_phase import wait_until

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                                reason="Debian's chromium and chromium-driver (scripts/setup.sh installs them)")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("TXLOG_TEST_ARTIFACTS") or tmp_path_factory.mktemp("artifacts")) / "console"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, shared_zookeeper):
    yield from running(tmp_path_factory.mktemp("console-browser"), fresh_chroot(shared_zookeeper), FULL)


@pytest.fixture(scope="module")
def state(cluster):
    made, producer = made_state(cluster.state.bootstrap, "browser", 2)
    yield made
    producer.close()


@pytest.fixture(scope="module")
def consoles(cluster, tmp_path_factory):
    folder = tmp_path_factory.mktemp("consoles")
    connection = ["--bootstrap", cluster.state.bootstrap]
    acting, acting_process = started_console(connection, folder / "acting.log", "--hanging-after-ms", "100")
    metrics = ",".join(p.metrics_address for p in cluster.state.services.values() if p.metrics_address)
    read_only, read_only_process = started_console(connection, folder / "read-only.log", "--read-only",
                                                   "--metrics", metrics)
    yield {"acting": acting, "read_only": read_only}
    for process in (acting_process, read_only_process):
        stopped(process)


def shown(driver, element_id: str):
    """The element once the page that has it loaded (after a click, the next page may take a moment)."""
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, 60).until(expected_conditions.presence_of_element_located(("id", element_id)))


def visit(driver, url: str, artifacts: Path, name: str) -> str:
    """Loads ``url``; its page text, once the browser's console logged no error; a screenshot saved."""
    driver.get_log("browser")  # what earlier pages logged
    driver.get(url)
    severe = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert severe == [], f"{url}: errors in the browser's console: {severe}"
    driver.save_screenshot(str(artifacts / f"{name}.png"))
    return driver.find_element("tag name", "body").text


def test_every_page_loads_cleanly_and_shows_the_clusters_state(browser, consoles, state, artifacts):
    base = consoles["read_only"]
    text = visit(browser, base + "/", artifacts, "overview")
    assert "Overview" in text and "1 open" in text
    assert re.search(r"Controller: partition_svc \d, epoch \d+", text), "the controller, read from ZooKeeper"
    kinds = [row.get_attribute("data-kind") for row in browser.find_elements("css selector", "#instances tbody tr")]
    assert sorted(set(kinds)) == ["coordinator_svc", "partition_svc", "producer_id_svc"], kinds
    assert browser.find_elements("css selector", "#alerts li"), "the chart's alerts, as one scrape shows them"
    # the live rates: Chart.js, served with the console, plots what /rates.json gets from the services' /metrics
    wait_until(lambda: browser.execute_script(
        "const chart = window.Chart && Chart.getChart('rates-chart'); return chart ? chart.data.labels.length : 0") > 0,
        60, "a point of the live rates plotted")
    assert [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"] == []
    browser.save_screenshot(str(artifacts / "overview.png"))
    text = visit(browser, base + "/topics", artifacts, "topics")
    assert state["topic"] in text
    text = visit(browser, f"{base}/topics/{state['topic']}", artifacts, "topic")
    rows = [r.text for r in browser.find_elements("css selector", "#partitions tbody tr")]
    assert len(rows) == 2 and rows[1].split()[-3:] == ["2", "1", "1"], rows  # high watermark, LSO, held back
    text = visit(browser, base + "/transactions", artifacts, "transactions")
    assert state["transactional_id"] in text and "Ongoing" in text
    text = visit(browser, f"{base}/transactions/{state['transactional_id']}", artifacts, "transaction")
    assert browser.find_element("id", "state").text == "Ongoing" and "open since offset 1" in text
    text = visit(browser, base + "/groups", artifacts, "groups")
    assert state["group"] in text
    text = visit(browser, base + "/security", artifacts, "security")
    assert "ACLs" in text and "Client quotas" in text
    assert browser.find_elements("css selector", "a.action, form.reset") == [], "a read-only console offers no action"


def test_a_hanging_transaction_is_aborted_in_two_clicks(browser, consoles, state, artifacts):
    base = consoles["acting"]
    wait_until(lambda: state["topic"] in visit(browser, base + "/", artifacts, "overview-hanging"), 60,
               "the open transaction shown hanging")
    row = next(r for r in browser.find_elements("css selector", "#hanging tbody tr") if f"{state['topic']}-1" in r.text)
    row.find_element("link text", "Abort").click()  # click 1
    assert "ABORT marker" in shown(browser, "preview").text
    browser.save_screenshot(str(artifacts / "abort-confirm.png"))
    browser.find_element("css selector", "#confirm button").click()  # click 2
    assert shown(browser, "done").text.startswith("Done")
    visit(browser, f"{base}/topics/{state['topic']}", artifacts, "topic-after-abort")
    row = browser.find_elements("css selector", "#partitions tbody tr")[1].text.split()
    assert row[-2:] == ["3", "3"] or row[-3:] == ["3", "3", "0"], row  # the LSO moved past the record and its marker


def test_an_action_the_clusters_acls_refuse_shows_the_clusters_error(browser, tmp_path_factory, artifacts):
    """A TLS cluster with ACLs, the console acting as User:viewer, who has no ACL: completing a prepared
    transaction is refused by the cluster, and shown so."""
    directory = tmp_path_factory.mktemp("secured")
    secured = LocalCluster(directory / "cluster")
    secured.up(producer_id_svcs=1, partition_svcs=1, coordinator_svcs=1, tls=True)
    try:
        secured.wait_until_coordinators_settle()
        issued = subprocess.run([sys.executable, "-m", "txlog.cli", "tls", "issue", "--dir", str(secured.dir), "viewer"],
                                capture_output=True, text=True, timeout=60)
        assert issued.returncode == 0, issued.stderr
        tls = secured.client_tls()
        viewer = ["--bootstrap", secured.state.bootstrap, "--tls-ca", tls["tls_ca"],
                  "--tls-cert", str(secured.dir / "tls" / "viewer.pem"), "--tls-key", str(secured.dir / "tls" / "viewer-key.pem")]
        with Admin(secured.state.bootstrap, **tls) as admin:
            admin.create_topics([("guarded", 1)])
        url, process = started_console(viewer, directory / "viewer.log")
        try:
            browser.get(url + "/actions/complete-prepared?transactional_id=guarded&producer_id=1&producer_epoch=0&outcome=abort")
            browser.find_element("css selector", "#confirm button").click()
            error = shown(browser, "error").text
            browser.save_screenshot(str(artifacts / "refused.png"))
            assert "AUTHORIZATION_FAILED" in error, error
            browser.get(url + "/security")  # User:viewer may not describe the ACLs either: said, not a crash
            assert "AUTHORIZATION_FAILED" in browser.find_element("id", "acls-error").text
        finally:
            stopped(process)
    finally:
        secured.down(grace_s=5)
