"""Quiet in every path: a script whose clients (producers plain, idempotent and
transactional, a group consumer, an admin, and a fault workload of four
producers sending in threads) failed because the services went away under
them, and which then dropped them every way a script can (a close() that
raised, no close at all, ``del``, a thread that ended), exits without asyncio's
noise on stderr. The script runs as its own interpreter, so what its exit
prints is what a user would see. Before the fix, the producers dropped idle
after their failures printed "Task was destroyed but it is pending!" for their
Sender.run() tasks (see txlog/shutdown.py)."""

import subprocess
import sys
import time

from txlog import Admin

# The services are killed while the script waits on stdin; every call after
# that fails (short timeouts, so the failures come fast).
FAILING_CLIENTS = """
import gc, sys
from txlog import Admin, Consumer, Producer
bootstrap, topic = sys.argv[1], sys.argv[2]
fast = dict(request_timeout_ms=1_500, retry_backoff_ms=50, retry_backoff_max_ms=200)
producers = {
    "plain": Producer(bootstrap, enable_idempotence=False, acks=1, delivery_timeout_ms=3_000, max_block_ms=2_000, **fast),
    "idempotent": Producer(bootstrap, delivery_timeout_ms=3_000, max_block_ms=2_000, **fast),
    "transactional": Producer(bootstrap, transactional_id="quiet-exit", delivery_timeout_ms=3_000, max_block_ms=2_000,
                              **fast),
    "transactional_left": Producer(bootstrap, transactional_id="quiet-exit-left", delivery_timeout_ms=3_000,
                                   max_block_ms=2_000, **fast),
}
consumer = Consumer(bootstrap, group_id="quiet-exit", request_timeout_ms=1_500, default_api_timeout_ms=3_000,
                    fetch_max_wait_ms=100, enable_auto_commit=True, session_timeout_ms=6_000)
admin = Admin(bootstrap, request_timeout_ms=1_500, default_api_timeout_ms=3_000)
for name in ("transactional", "transactional_left"):
    producers[name].init_transactions()
    producers[name].begin_transaction()
for name, producer in producers.items():
    producer.send(topic, name.encode()).result(timeout=30) if name in ("plain", "idempotent") else producer.send(topic, b"x")
producers["transactional"].flush(timeout_s=30)
producers["transactional_left"].flush(timeout_s=30)
consumer.subscribe([topic])
read = []
while len(read) < 2:
    read += consumer.poll(timeout_s=1)


# A fault workload: four producers sending in their own threads when the services die; each thread ends at
# its first failure, half of them closing their producer (close() may raise), half just dropping it.
def close_quietly(producer):
    try:
        producer.close(timeout_s=2)
    except Exception:
        pass

def workload(index, **config):
    producer = Producer(bootstrap, linger_ms=2, **fast, delivery_timeout_ms=3_000, max_block_ms=2_000, **config)
    try:
        if "transactional_id" in config:
            producer.init_transactions(timeout_s=30)
        while True:
            if "transactional_id" in config:
                producer.begin_transaction()
                for partition in (0, 1, 0, 1):
                    producer.send(topic, b"w", partition=partition)
                producer.commit_transaction(timeout_s=10)
            else:
                producer.send(topic, b"w").result(timeout=30)
            sending.set()
    except Exception:
        if index % 2:
            close_quietly(producer)

import threading
sending = threading.Event()
workers = [threading.Thread(target=workload, args=(i,), kwargs=config) for i, config in enumerate([
    dict(enable_idempotence=False), dict(), dict(transactional_id="quiet-workload-0"),
    dict(transactional_id="quiet-workload-1")])]
for worker in workers:
    worker.start()
sending.wait(60)
print("clients ready", flush=True)
sys.stdin.readline()  # the services are gone now
for worker in workers:
    worker.join()

failures = []
def fails(what, call):
    try:
        call()
    except Exception as exc:
        failures.append(f"{what}: {type(exc).__name__}")
    else:
        failures.append(f"{what}: did not fail")

futures = []
for name, producer in producers.items():
    futures += [producer.send(topic, b"after-kill") for _ in range(5)]
    fails(f"{name} flush", lambda: producer.flush(timeout_s=1))
# every record fails by its delivery timeout: the senders are idle then, waiting for work that never comes
for future in futures:
    fails("record", lambda: future.result(timeout=60))
fails("transactional commit", lambda: producers["transactional"].commit_transaction(timeout_s=2))
fails("consumer commit", lambda: consumer.commit(timeout_s=2))
fails("admin list_topics", lambda: admin.list_topics(timeout_s=2))
print(*failures, sep="\\n", flush=True)

# Dropped every way: a close() given no time (it raises, or gives up), no close, del.
def closes(what, close):
    try:
        close()
    except Exception as exc:
        print(f"{what}: raised {type(exc).__name__}", flush=True)
    else:
        print(f"{what}: returned", flush=True)

closes("plain close", lambda: producers.pop("plain").close(timeout_s=0.001))
closes("transactional close", lambda: producers.pop("transactional").close(timeout_s=0.001))
closes("consumer close", lambda: consumer.close(timeout_s=0.001))
del producers["idempotent"], admin, consumer, futures
gc.collect()
left_open = producers["transactional_left"]  # never closed: the interpreter's exit closes it
print("dropped", flush=True)
"""

NOISE = ("Task was destroyed", "Exception ignored", "Traceback", "Event loop is closed")


def test_clients_that_failed_when_the_services_died_and_were_dropped_exit_quietly(txn_cluster):
    bootstrap = txn_cluster.state.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([("quiet-exit", 2)])
    script = subprocess.Popen([sys.executable, "-c", FAILING_CLIENTS, bootstrap, "quiet-exit"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert script.stdout.readline() == "clients ready\n", script.stderr.read() if script.poll() is not None else ""
        for name, info in list(txn_cluster.state.services.items()):
            if info.kind != "zookeeper":
                txn_cluster.kill(name)
        started = time.monotonic()
        out, err = script.communicate("killed\n", timeout=180)
    finally:
        if script.poll() is None:
            script.kill()
            script.communicate()
    print(f"script ran {time.monotonic() - started:.1f} s after the kill\n{out}")
    assert script.returncode == 0, err
    assert out.rstrip().endswith("dropped"), out
    assert "did not fail" not in out, out
    assert "consumer close: raised" in out, "a close() that raised is one of the paths: " + out
    noise = [line for line in err.splitlines() if any(word in line for word in NOISE)]
    assert not noise, err[-6000:]
