"""The ACL store and caches against a reference model, on a real ZooKeeper
(issue 15): two instances (each its own ZooKeeper session, store and cache,
on its own event loop) add and remove bindings, alone or at the same time on
the same resource patterns (conditional writes racing), while change
notifications also arrive duplicated and late (extra wake-ups of a cache in
the middle of a reload).

Checked after every step: what ZooKeeper holds is exactly the reference
model's set of bindings, and each cache converges to it (waited for with a
deadline: the watch delivers changes asynchronously); a removal returns
exactly the bindings the model says it matched.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from kazoo.client import KazooClient

from services.security.authorizer import AclCache, AclStore
from services.tooling.cluster import LocalCluster
from txlog._loop import LoopThread
from txlog.protocol.acls import ALLOW, DENY, GROUP, LITERAL, PREFIXED, TOPIC, AclBinding, AclFilter
from txlog.two_phase import wait_until

SETTLE_S = 30

bindings = st.builds(
    AclBinding,
    st.sampled_from([TOPIC, GROUP]), st.sampled_from([LITERAL, PREFIXED]), st.sampled_from(["a", "ab", "b/c", "x y"]),
    st.sampled_from(["User:alice", "User:bob"]), st.just("*"), st.sampled_from(["Read", "Write", "All"]),
    st.sampled_from([ALLOW, DENY]),
)
filters = st.builds(
    AclFilter,
    st.sampled_from([None, TOPIC, GROUP]), st.sampled_from(["ANY", LITERAL, PREFIXED]), st.sampled_from([None, "a", "ab", "b/c"]),
    st.sampled_from([None, "User:alice", "User:bob"]), st.none(), st.sampled_from([None, "Read", "Write", "All"]),
    st.sampled_from([None, ALLOW, DENY]),
)


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("acl-model") / "cluster")
    local.up(producer_id_svcs=0, partition_svcs=0, coordinator_svcs=0)
    yield local.state.zookeeper
    local.down(grace_s=5)


class Instance:
    """What one service process holds: a session, a store, a cache, a loop."""

    def __init__(self, hosts: str, root: str):
        self.client = KazooClient(hosts=hosts)
        self.client.start(timeout=30)
        self.loop = LoopThread("acl-model")
        self.store = AclStore(self.client, root)
        self.cache = AclCache(self.store)
        self.loop.run(self.cache.start(), 30)

    def run(self, coro):
        return self.loop.run(coro, SETTLE_S)

    def close(self) -> None:
        self.loop.stop()
        self.client.stop()
        self.client.close()


class AclStoreModel(RuleBasedStateMachine):
    hosts = ""

    @initialize()
    def start(self):
        root = f"/acl-model-{uuid.uuid4().hex}"
        self.instances = [Instance(self.hosts, root), Instance(self.hosts, root)]
        self.model: set[AclBinding] = set()

    def teardown(self):
        for instance in getattr(self, "instances", []):
            instance.close()

    @rule(which=st.integers(0, 1), added=st.lists(bindings, min_size=1, max_size=4))
    def add(self, which, added):
        self.instances[which].run(self.instances[which].store.add(added))
        self.model |= set(added)

    @rule(which=st.integers(0, 1), wanted=st.lists(filters, min_size=1, max_size=2))
    def remove(self, which, wanted):
        removed = self.instances[which].run(self.instances[which].store.remove(wanted))
        matched = {b for b in self.model if any(f.matches(b) for f in wanted)}
        assert sorted(removed, key=repr) == sorted(matched, key=repr)
        self.model -= matched

    @rule(added=st.lists(bindings, min_size=2, max_size=5, unique=True), wanted=filters)
    def add_and_remove_at_once(self, added, wanted):
        """Instance 0 adds (several adds at once) while instance 1 removes: all
        read-modify-write the same znodes; each write is conditional, so none is lost. The model
        takes either order: a binding both added and matched may or may not remain."""
        # each binding its own add, all at once: they read the same znodes before any writes
        adding = [self.instances[0].loop.submit(self.instances[0].store.add([b])) for b in added]
        removing = self.instances[1].loop.submit(self.instances[1].store.remove([wanted]))
        for future in adding:
            future.result(SETTLE_S)
        removed = set(removing.result(SETTLE_S))
        before = self.model
        assert removed <= {b for b in before | set(added) if wanted.matches(b)}
        assert {b for b in before if wanted.matches(b)} <= removed, "a binding present before was not removed"
        stored = set(self.instances[0].store.load())
        contested = {b for b in added if wanted.matches(b)}
        assert stored - contested == (before | set(added)) - removed - contested
        self.model = stored

    @rule(which=st.integers(0, 1), times=st.integers(1, 3))
    def notification_again(self, which, times):
        """A late or duplicated change notification: extra wake-ups of the cache."""
        instance = self.instances[which]
        for _ in range(times):
            instance.loop.call_soon(instance.cache.on_change.changed)

    @invariant()
    def zookeeper_holds_the_model_and_every_cache_converges(self):
        if not hasattr(self, "instances"):
            return
        assert set(self.instances[0].store.load()) == self.model
        for instance in self.instances:
            wait_until(lambda instance=instance: set(instance.cache.all()) == self.model, SETTLE_S,
                       "a cache converging to what ZooKeeper holds")


def test_acl_store_and_caches_follow_the_model(zookeeper):
    AclStoreModel.hosts = zookeeper
    run = AclStoreModel.TestCase
    run.settings = settings(max_examples=15, stateful_step_count=12, deadline=None,
                            suppress_health_check=[HealthCheck.too_slow])
    run().runTest()
