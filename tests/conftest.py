"""Fixtures shared by every kind of test: real ZooKeeper and real service
processes, started by the same LocalCluster code that `txlog cluster` uses."""

from __future__ import annotations

import collections
import os
import random
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from _pytest.nodeid import NodeId
from hypothesis import HealthCheck, settings

from services.tooling.cluster import PORT_COUNTER_ENV, PORT_RANGE_ENV, LocalCluster

# Ports the tests' services listen on: below the kernel's ephemeral range
# (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default), so no
# outgoing connection holds one, in PORT_SLICES fixed slices: pytest-xdist
# worker gwN takes slice N (modulo PORT_SLICES). Its counter file is per user
# and slice, not per run, so test runs side by side on one machine (several
# checkouts, several people) hand out each slice's ports in one sequence too.
TEST_PORTS = (12000, 32768)
PORT_SLICES = 16
PORT_COUNTERS = Path(tempfile.gettempdir()) / f"txlog-test-ports-{os.getuid()}"
SPARK_TESTS = Path(__file__).parent / "spark"
# The longest serial scopes, as measured (--durations): a worker starts each at once.
STARTS_FIRST = ("tests/deploy/test_compose_podman.py", "tests/deploy/test_chart_podman.py", "spark",
                "tests/hostile/test_fuzz_rpcs.py hostile=0", "spark-jobs", "tests/faults/test_chaos.py",
                "tests/integ/test_client_wheel.py")
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# Tests run several at a time (scripts/test.sh), so an example may take longer
# than hypothesis's 200 ms deadline without being wrong: speed is bench/'s concern.
settings.register_profile("txlog", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("txlog")


def pytest_configure(config):
    """Gives this process (an xdist worker, or the only one) its slice of
    TEST_PORTS, for free_port in it and in every process it starts, before
    test modules are imported. A slice's first user starts it at random."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    size = (TEST_PORTS[1] - TEST_PORTS[0]) // PORT_SLICES
    low = TEST_PORTS[0] + worker % PORT_SLICES * size
    PORT_COUNTERS.mkdir(exist_ok=True)
    counter = PORT_COUNTERS / f"{low}-{low + size}"
    try:
        with open(counter, "x") as fresh:
            fresh.write(str(random.randrange(low, low + size)))
    except FileExistsError:
        pass  # another run uses this slice, or used it: go on where it is
    os.environ[PORT_RANGE_ENV] = f"{low}-{low + size}"
    os.environ[PORT_COUNTER_ENV] = str(counter)
    # Every JVM the tests start (ZooKeeper, Spark sessions and job processes) compiles with C1 only and
    # collects with the serial GC: most live for seconds to minutes, where C2's compilations and the parallel
    # GC's threads cost more CPU than they save (a Spark job process: about a third less CPU), and the suite
    # is bound by the machine's CPU. Each JVM says so once on its stderr ("Picked up JAVA_TOOL_OPTIONS").
    os.environ.setdefault("JAVA_TOOL_OPTIONS", JVM_OPTIONS)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Groups for pytest-xdist's --dist loadgroup. The Spark tests that use the
    session share one worker, so one JVM runs them rather than one per worker,
    each with its memory and threads (spread over the workers by module, with
    eight workers, they timed out under the load and a timeout inside a py4j
    call broke the worker's session for the tests after it); those that start
    their jobs as processes share another. A module whose tests share a module-scoped fixture (a
    cluster, a rendered chart) runs on one worker, so that fixture is set up
    once, not once on each worker that gets one of its tests; a parametrized
    one makes a group per parameter (its tests may check what the others did)."""
    groups = {}
    for item in items:
        groups[item] = group = xdist_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    yield
    items.sort(key=scheduling_rank(groups))
    # xdist (3.8) tells the controller an item's group with a node id suffix,
    # "<id>@<group>", but sets it where pytest 9.2 no longer reads the id
    # (pytest-xdist issue 1386), so every group would be spread over the
    # workers; set the suffix here where xdist did not.
    if getattr(config.option, "loadgroup", False):  # set in xdist's workers only
        for item in items:
            group = groups.get(item)
            if group and not item.nodeid.endswith(f"@{group}"):
                item._id = NodeId.parse(f"{item.nodeid}@{group}")


def scheduling_rank(groups: dict) -> Callable:
    """The order xdist hands the scopes (a group, or a single test) out in:
    scripts/test.sh turns xdist's own order (by number of tests) off, since
    the longest scopes are not those with the most tests, and one that starts
    last ends the run last. STARTS_FIRST, then the other groups, larger
    first, then single tests as collected (a stable sort)."""
    size = collections.Counter(groups.values())

    def rank(item) -> tuple[int, int]:
        group = groups.get(item)
        scope = group or item.nodeid.split("::")[0]
        first = STARTS_FIRST.index(scope) if scope in STARTS_FIRST else len(STARTS_FIRST)
        return first, -size[group] if group else 0

    return rank


def xdist_group(item) -> str | None:
    if SPARK_TESTS in Path(item.path).parents:
        # a test that runs its jobs as processes of their own (each its own JVM) needs no session here:
        # those run one after another beside the session's tests (a module-scoped cluster they share
        # with the session's tests is then set up on both workers)
        return "spark" if "spark" in item.fixturenames else "spark-jobs"
    shared = sorted(name for name, defs in item._fixtureinfo.name2fixturedefs.items() if defs[-1].scope in ("module", "class"))
    if not shared:
        return None
    callspec = getattr(item, "callspec", None)
    params = [f"{name}={callspec.indices[name]}" for name in shared if callspec and name in callspec.indices]
    return " ".join([item.nodeid.split("::")[0], *params])


@pytest.fixture(scope="session")
def shared_zookeeper(tmp_path_factory):
    """One ZooKeeper for this worker's clusters (a JVM started once, not once a
    test); each cluster takes a chroot of its own (``zookeeper_for``)."""
    local = LocalCluster(tmp_path_factory.mktemp("shared-zookeeper"))
    local.up(producer_id_svcs=0, partition_svcs=0, coordinator_svcs=0)
    yield local.state.zookeeper
    local.down(grace_s=5)


@pytest.fixture
def zookeeper_for(request):
    """The ZooKeeper a test's cluster uses: the worker's shared one under a fresh
    chroot, or None (the cluster starts its own) for a test marked
    ``own_zookeeper``, which stops or kills it."""
    if request.node.get_closest_marker("own_zookeeper"):
        return None
    return fresh_chroot(request.getfixturevalue("shared_zookeeper"))


def fresh_chroot(zookeeper: str) -> str:
    """A connection string for a cluster of its own on ``zookeeper``: a chroot no other cluster uses. Named at
    random, not by a counter: test modules that import this file as ``tests.conftest`` get a second copy of
    it beside pytest's ``conftest``, and two counters handed out the same names, so two clusters shared a
    chroot (each saw the other's topics, registrations and quotas)."""
    return f"{zookeeper}/cluster-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def cluster(tmp_path, zookeeper_for):
    """A ZooKeeper (no services yet); add them with ``add_service``."""
    local = LocalCluster(tmp_path / "cluster")
    local.up(producer_id_svcs=0, partition_svcs=0, coordinator_svcs=0, zookeeper=zookeeper_for)
    yield local
    local.down(grace_s=5)


# What the clusters the tests start run, as LocalCluster.up's arguments.
# Without coordinators; retention runs every 200 ms:
STORAGE_ONLY = {"producer_id_svcs": 1, "partition_svcs": 2, "coordinator_svcs": 0,
                "service_args": {"partition_svc": ["--retention-check-interval-ms", "200"]}}
# ZooKeeper, producer_id_svc, two partition_svc, two coordinator_svc with fast checks:
FULL = {"service_args": {"coordinator_svc": ["--transaction-check-interval-ms", "200", "--ownership-check-interval-ms", "300"]}}


def running(directory: Path, zookeeper: str | None, shape: dict):
    """A cluster of ``shape`` for as long as the fixture lasts; a full one once the
    coordinators have settled who owns which transaction log partition."""
    local = LocalCluster(directory)
    local.up(zookeeper=zookeeper, **shape)
    try:
        if shape.get("coordinator_svcs", 2):
            local.wait_until_coordinators_settle()
        yield local
    finally:
        local.down(grace_s=5)


@pytest.fixture
def txlog_cluster(tmp_path, zookeeper_for):
    """A STORAGE_ONLY cluster of the test's own."""
    yield from running(tmp_path / "cluster", zookeeper_for, STORAGE_ONLY)


@pytest.fixture(scope="module")
def shared_txlog_cluster(tmp_path_factory, shared_zookeeper):
    """A STORAGE_ONLY cluster shared by a module's tests that each work on names of their own and stop nothing."""
    yield from running(tmp_path_factory.mktemp("shared-cluster"), fresh_chroot(shared_zookeeper), STORAGE_ONLY)


@pytest.fixture
def txn_cluster(tmp_path, zookeeper_for):
    """A FULL cluster of the test's own."""
    yield from running(tmp_path / "cluster", zookeeper_for, FULL)


@pytest.fixture
def tls_txn_cluster(tmp_path, zookeeper_for):
    """A FULL cluster of the test's own on mutual TLS, with the ACL authorizer
    (``client_tls()``: the super user's files)."""
    yield from running(tmp_path / "cluster", zookeeper_for, {**FULL, "tls": True})


@pytest.fixture(scope="module")
def shared_txn_cluster(tmp_path_factory, shared_zookeeper):
    """A FULL cluster shared by a module's tests that each work on names of their own
    and stop nothing (refused requests, fresh topics)."""
    yield from running(tmp_path_factory.mktemp("shared-cluster"), fresh_chroot(shared_zookeeper), FULL)
