"""One committed and one aborted transaction through a running txlog, read
back with read_committed; prints the result as one JSON object.

    python one_transaction.py BOOTSTRAP [TOPIC]

test_compose_e2e.py runs it inside the compose network (the services
advertise their compose names, which only resolve there); test_compose.py runs
it against a local cluster, so the script itself is known to work where no
Docker engine is.
"""

from __future__ import annotations

import json
import sys
import time

from txlog import Admin, Consumer, Producer

READ_TIMEOUT_S = 60.0


def run(bootstrap: str, topic: str) -> dict:
    tp = (topic, 0)
    with Admin(bootstrap) as admin:
        admin.create_topics([(topic, 1)])
        producer = Producer(bootstrap, transactional_id=f"{topic}-producer")
        try:
            producer.init_transactions()
            producer.begin_transaction()
            for i in range(2):
                producer.send(topic, value=f"committed-{i}".encode(), key=b"k")
            producer.commit_transaction()
            # An aborted one after it, which read_committed must skip. Its record
            # is delivered before the abort, so it is in the log, not dropped unsent.
            producer.begin_transaction()
            producer.send(topic, value=b"aborted", key=b"k").result(timeout=READ_TIMEOUT_S)
            producer.abort_transaction()
        finally:
            producer.close()
        # EndTxn answers once the outcome is decided; the markers follow. Until
        # the ABORT marker is in, the last stable offset stays below the end.
        deadline_s = time.monotonic() + READ_TIMEOUT_S
        while True:
            offsets = admin.list_offsets({tp: "last_stable"}), admin.list_offsets({tp: "latest"})
            last_stable, high_watermark = (next(iter(o.values())).offset for o in offsets)
            if last_stable == high_watermark or time.monotonic() > deadline_s:
                break
            time.sleep(0.1)

    consumer = Consumer(bootstrap, isolation_level="read_committed")
    try:
        consumer.assign([tp])
        values = []
        while consumer.position(tp) < last_stable and time.monotonic() < deadline_s:
            values += [record.value.decode() for record in consumer.poll(timeout_s=1.0)]
        return {"values": values, "position": consumer.position(tp), "last_stable_offset": last_stable,
                "high_watermark": high_watermark}
    finally:
        consumer.close()


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "deploy-e2e")))
