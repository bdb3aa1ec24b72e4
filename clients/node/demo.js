#!/usr/bin/env node
// txlog from Node, end to end, against a running cluster:
//   node clients/node/demo.js HOST:PORT[,HOST:PORT...] [TOPIC]
// (or TXLOG_BOOTSTRAP / TXLOG_TOPIC / TXLOG_TRANSACTIONAL_ID in the environment).
// The topic (default node-client) must exist with at least two partitions led
// by different partition_svc instances (`txlog topics create node-client --partitions 2`).
//
// It produces a plain batch and idempotent batches (one sent twice), runs three
// transactions over two partitions on two different leaders (commit, abort,
// commit), reads both partitions back with read_committed and read_uncommitted,
// checks that exactly the committed records are visible, and prints one JSON
// line. Exit status: 0 all checks held, 1 a check failed, 2 an error or bad usage.
'use strict';

const txlog = require('./txlog');

const READ_DEADLINE_MS = Number(process.env.TXLOG_READ_DEADLINE_MS || 30000);

async function main() {
  const bootstrap = (process.argv[2] || process.env.TXLOG_BOOTSTRAP || '').split(',').map((s) => s.trim()).filter(Boolean);
  if (bootstrap.length === 0) {
    process.stderr.write('usage: node demo.js HOST:PORT[,HOST:PORT...] [TOPIC]  (or TXLOG_BOOTSTRAP)\n');
    return 2;
  }
  const topic = process.argv[3] || process.env.TXLOG_TOPIC || 'node-client';
  const run = `${Date.now().toString(36)}-${process.pid}`; // every value of this run starts with it
  const transactionalId = process.env.TXLOG_TRANSACTIONAL_ID || `node-client-${run}`;
  const started = Date.now();
  const cluster = new txlog.Cluster(bootstrap);
  const out = { ok: false, bootstrap, topic, run, transactional_id: transactionalId };
  const mismatches = [];
  const expect = (holds, what) => { if (!holds) mismatches.push(what); };
  const same = (x, y) => JSON.stringify(x) === JSON.stringify(y);

  try {
    // Two partitions whose leaders are different partition_svc instances.
    const partitions = await cluster.describeTopic(topic);
    const a = partitions[0];
    const b = partitions.find((p) => p.leaderId !== a.leaderId);
    if (!a || !b) throw new Error(`topic ${topic} needs two partitions led by different instances; leaders: ${JSON.stringify(partitions)}`);
    out.partitions = Object.fromEntries([a, b].map((p) => [p.partition, { leader_id: p.leaderId, leader: p.address, leader_epoch: p.leaderEpoch }]));

    // 1. A plain batch (no producer fields) in the message form, which stays
    // accepted, then an idempotent producer's batches in the encoded form.
    const plainValues = [`${run}:plain-0`];
    const plain = await txlog.produce(cluster, topic, a.partition, txlog.recordBatch(plainValues));
    out.plain = { partition: a.partition, base_offset: plain.baseOffset, values: plainValues };

    const idem = await txlog.initIdempotent(cluster);
    const batch0 = txlog.encodeBatch([`${run}:idem-0`, `${run}:idem-1`], { ...idem, baseSequence: 0 });
    const first = await txlog.produce(cluster, topic, a.partition, batch0);
    // The same batch again, as a producer whose answer was lost resends it: the
    // leader recognises producer id, epoch and sequence and answers the
    // original offset without appending.
    const resent = await txlog.produce(cluster, topic, a.partition, batch0);
    const batch1 = txlog.encodeBatch([`${run}:idem-2`], { ...idem, baseSequence: txlog.nextSequence(0, 2) });
    const second = await txlog.produce(cluster, topic, a.partition, batch1);
    out.idempotent = { partition: a.partition, producer_id: txlog.int(idem.producerId), producer_epoch: idem.producerEpoch,
      batches: [{ base_sequence: 0, base_offset: first.baseOffset, resent_base_offset: resent.baseOffset },
        { base_sequence: 2, base_offset: second.baseOffset }] };
    expect(resent.baseOffset === first.baseOffset, `the resent idempotent batch answered offset ${resent.baseOffset}, not its original ${first.baseOffset}`);

    // 2. Transactions over both partitions: commit, abort, commit; each uses
    // the epoch the previous EndTxn answered.
    const producer = new txlog.TransactionalProducer(cluster, transactionalId);
    const init = await producer.init();
    out.init = { producer_id: txlog.int(init.producerId), producer_epoch: init.producerEpoch };
    out.coordinator = await cluster.coordinator(transactionalId);
    out.transactions = [];
    for (const [name, commit] of [['t1', true], ['t2', false], ['t3', true]]) {
      const values = { [a.partition]: [`${run}:${name}-a`], [b.partition]: [`${run}:${name}-b-0`, `${run}:${name}-b-1`] };
      const done = await producer.transaction(topic, values, commit);
      out.transactions.push({ name, ...done, producer_id: txlog.int(done.producer_id), producer_id_after: txlog.int(done.producer_id_after) });
    }
    out.transactions.forEach((t, i) => {
      expect(t.producer_id_after !== t.producer_id || t.epoch_after > t.epoch_used, `${t.name}: EndTxn answered epoch ${t.epoch_after}, not above ${t.epoch_used}`);
      const previous = i === 0 ? { producer_id_after: out.init.producer_id, epoch_after: out.init.producer_epoch } : out.transactions[i - 1];
      expect(t.epoch_used === previous.epoch_after, `${t.name} ran at epoch ${t.epoch_used}, not the ${previous.epoch_after} answered before it`);
    });

    // 3. Read back until no transaction is open on either partition (EndTxn
    // answers before the markers are written, so the last one may still be
    // open for a moment: read_committed shows nothing at or above it).
    const deadline = Date.now() + READ_DEADLINE_MS;
    const read = async (isolation) => Object.fromEntries(await Promise.all([a, b].map(async (p) =>
      [p.partition, await txlog.readPartition(cluster, topic, p.partition, isolation, deadline)])));
    const committedRead = await read('ISOLATION_LEVEL_READ_COMMITTED');
    const uncommittedRead = await read('ISOLATION_LEVEL_READ_UNCOMMITTED');

    const ofThisRun = (records) => records.filter((r) => r.value && r.value.startsWith(`${run}:`));
    const committedTxns = out.transactions.filter((t) => t.committed);
    const abortedTxns = out.transactions.filter((t) => !t.committed);
    const expected = {
      [a.partition]: [...plainValues, `${run}:idem-0`, `${run}:idem-1`, `${run}:idem-2`, ...committedTxns.flatMap((t) => t.partitions[a.partition].values)],
      [b.partition]: committedTxns.flatMap((t) => t.partitions[b.partition].values),
    };
    const abortedValues = abortedTxns.flatMap((t) => Object.values(t.partitions).flatMap((p) => p.values));
    out.read_committed = {};
    out.read_uncommitted = {};
    for (const p of [a.partition, b.partition]) {
      const committed = committedRead[p];
      const uncommitted = uncommittedRead[p];
      const mine = ofThisRun(committed.records);
      out.read_committed[p] = { high_watermark: committed.highWatermark, last_stable_offset: committed.lastStableOffset, records: mine };
      out.read_uncommitted[p] = { records: ofThisRun(uncommitted.records) };
      expect(committed.settled, `partition ${p}: still a transaction open (LSO ${committed.lastStableOffset} < HW ${committed.highWatermark}) after ${READ_DEADLINE_MS} ms`);
      expect(same(mine.map((r) => r.value), expected[p]), `partition ${p}: read_committed gave ${JSON.stringify(mine.map((r) => r.value))}, expected ${JSON.stringify(expected[p])}`);
      const leaked = mine.filter((r) => abortedValues.includes(r.value));
      expect(leaked.length === 0, `partition ${p}: read_committed returned aborted records ${JSON.stringify(leaked)}`);
      const abortedHere = abortedTxns.flatMap((t) => t.partitions[p].values);
      const written = ofThisRun(uncommitted.records).map((r) => r.value);
      expect(abortedHere.every((v) => written.includes(v)), `partition ${p}: read_uncommitted lacks aborted records ${JSON.stringify(abortedHere)} (so the check above proves nothing)`);
      // Every record is where its Produce answer said, and carries its producer.
      const at = (value) => mine.find((r) => r.value === value) || {};
      for (const t of committedTxns) {
        const sent = t.partitions[p];
        expect(at(sent.values[0]).offset === sent.base_offset, `${t.name} partition ${p}: first record at offset ${at(sent.values[0]).offset}, Produce answered ${sent.base_offset}`);
        expect(sent.values.every((v) => at(v).transactional && at(v).producer_id === t.producer_id), `${t.name} partition ${p}: records not read back as transactional batches of producer ${t.producer_id}`);
      }
      if (p === a.partition) {
        expect(at(plainValues[0]).offset === plain.baseOffset && at(plainValues[0]).producer_id === -1,
          `the plain record reads back as ${JSON.stringify(at(plainValues[0]))}, expected offset ${plain.baseOffset} and producer_id -1`);
        expect(at(`${run}:idem-0`).offset === first.baseOffset && at(`${run}:idem-2`).offset === second.baseOffset
          && at(`${run}:idem-2`).producer_id === out.idempotent.producer_id,
        `the idempotent records read back as ${JSON.stringify([at(`${run}:idem-0`), at(`${run}:idem-2`)])}`);
      }
    }
  } catch (err) {
    out.error = err && err.message ? err.message : String(err);
    if (err && err.code) out.error_code = err.code;
  } finally {
    cluster.close();
  }
  out.mismatches = mismatches;
  out.retries = txlog.retryCounts;
  out.retried_errors = txlog.retriedErrors;
  out.elapsed_ms = Date.now() - started;
  out.ok = !out.error && mismatches.length === 0;
  process.stdout.write(`${JSON.stringify(out)}\n`);
  if (out.error) return 2;
  return mismatches.length ? 1 : 0;
}

main().then((status) => { process.exitCode = status; }, (err) => {
  process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
  process.exitCode = 2;
});
